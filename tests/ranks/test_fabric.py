"""The in-process collective fabric (sim.fabric): meetings, results, virtual clocks, and
exact detection of mismatches, deadlocks and timeouts, with flight records."""

from __future__ import annotations

import pytest

from ascendgraph.errors import CaptureError, CollectiveDeadlock, CollectiveMismatch, CollectiveTimeout, GraphHang
from ascendgraph.parallel.layout import ParallelLayout
from sim.fabric import Collective, Decision, Fabric, FabricThreads

DP2 = ParallelLayout(dp=2)


def _sum(rank, value, **kw):
    return Collective("dp", "all_reduce", (1,), rows=[[value]], **kw)


def test_an_all_reduce_sums_and_every_member_gets_the_result():
    seen = {}

    def program(rank):
        seen[rank] = yield _sum(rank, rank + 1)
        seen[rank, "max"] = yield Collective("dp", "all_reduce", (1,), rows=[[rank * 5]], reduce="max")

    stats = Fabric(DP2).run({r: program(r) for r in (0, 1)})
    assert seen[0] == seen[1] == [[3]]
    assert seen[0, "max"] == [[5]]
    assert stats.met == {"dp": 2} and stats.met_by_rank == {0: 2, 1: 2}


def test_a_shape_mismatch_names_the_rule_and_reports_the_flight_record():
    def program(rank):
        yield _sum(rank, 1, site="warm")
        yield Collective("dp", "all_reduce", (2, 2) if rank == 0 else (4, 2), rows=None, site="dp_sync")

    with pytest.raises(CollectiveMismatch) as info:
        Fabric(DP2).run({r: program(r) for r in (0, 1)})
    err = info.value
    assert err.rules == ("same_shape",) and err.ranks == (0, 1)
    assert "dp#1" in str(err) and "flight record" in str(err)
    assert err.flight_record[0]["last"] == ["dp#0 all_reduce(1 int32) eager [warm]"]
    assert "[dp_sync]" in err.flight_record[1]["pending"]


def test_every_live_rank_blocked_is_a_deadlock():
    def early(rank):
        yield _sum(rank, 1)

    def late(rank):
        yield _sum(rank, 1)
        yield _sum(rank, 1, site="one more")

    with pytest.raises(CollectiveDeadlock) as info:
        Fabric(DP2).run({0: early(0), 1: late(1)})
    assert info.value.ranks == (1,)
    assert "rank 1 waits in dp#1" in str(info.value) and "0 (finished)" in str(info.value)


def test_two_groups_waiting_on_each_other_is_a_deadlock():
    layout = ParallelLayout(dp=2, tp=2)

    def program(rank):
        # 0 waits for 1 (tp), 1 for 3 (dp), 3 for 2 (tp), 2 for 0 (dp): a cycle
        first, second = ("tp", "dp") if rank in (0, 3) else ("dp", "tp")
        yield Collective(first, "all_reduce", (1,), rows=[[1]])
        yield Collective(second, "all_reduce", (1,), rows=[[1]])

    with pytest.raises(CollectiveDeadlock):
        Fabric(layout).run({r: program(r) for r in range(4)})


def test_a_late_arrival_past_the_timeout_names_the_straggler():
    def program(rank):
        yield _sum(rank, 1, local_us=5_000_000 if rank == 1 else 0)

    with pytest.raises(CollectiveTimeout) as info:
        Fabric(DP2, timeout_s=2).run({r: program(r) for r in (0, 1)})
    assert info.value.straggler == 1 and info.value.ranks == (0,)
    fabric = Fabric(DP2, timeout_s=10)
    fabric.run({r: program(r) for r in (0, 1)})
    assert fabric.clock_us == {0: 5_000_000, 1: 5_000_000}  # completes at the latest arrival


def test_a_hung_rank_never_arrives_and_is_the_straggler():
    def program(rank):
        if rank == 1:
            raise GraphHang("replay waits for ever")
        yield _sum(rank, 1)

    with pytest.raises(CollectiveTimeout, match="which hung and never arrives") as info:
        Fabric(DP2).run({r: program(r) for r in (0, 1)})
    assert info.value.straggler == 1


def test_decisions_after_a_sync_must_agree_but_never_block():
    def program(rank, key):
        yield _sum(rank, 1)
        yield Decision("dp", (2, key, (4, 4)))

    Fabric(DP2).run({0: program(0, "FULL:4"), 1: program(1, "FULL:4")})
    with pytest.raises(CollectiveMismatch, match="post-sync invariant") as info:
        Fabric(DP2).run({0: program(0, "FULL:4"), 1: program(1, "FULL:8")})
    assert info.value.rules == ("post_sync_invariant",)


def test_sequence_parallel_padding_must_be_a_multiple_of_tp():
    def program(rank):
        yield Decision("dp", (0, "eager", (6, 6)), sp_tp=4, padded=6)
        yield _sum(rank, 1)

    with pytest.raises(CollectiveMismatch, match="not a multiple of tp=4"):
        Fabric(DP2).run({r: program(r) for r in (0, 1)})


def test_the_seed_orders_the_ranks_and_reproduces_the_order():
    def orders(seed):
        order = []

        def program(rank):
            for step in range(3):
                order.append(rank)
                yield Collective("world", "barrier", (), rows=None)

        Fabric(ParallelLayout(dp=4), seed=seed).run({r: program(r) for r in range(4)})
        return order

    assert orders(1) == orders(1)
    assert any(orders(1) != orders(s) for s in range(2, 6))


class _Sealed(RuntimeError):
    """A rank's own failure that refuses every attribute set on it once raised: the fabric
    raises a rank's exception as the rank raised it and says who failed in its stats."""

    def __setattr__(self, name, value):
        raise AssertionError(f"{name} = {value!r} set on a raised exception")


def _own_and_peer_failures():
    own = _Sealed("rank 1 failed on its own")

    def fails(rank):
        if rank == 0:
            raise CaptureError("gave up with its peer", peer_abort=True, rank=0)
        raise own

    return own, fails


def test_a_ranks_own_failure_is_raised_untouched_and_the_stats_name_its_rank():
    own, fails = _own_and_peer_failures()

    def program(rank):
        fails(rank)
        yield _sum(rank, 1)

    fabric = Fabric(DP2)
    with pytest.raises(_Sealed) as info:
        fabric.run({r: program(r) for r in (0, 1)})
    assert info.value is own and fabric.stats.failed_rank == 1  # rank 0 gave up: not the run's error


def test_a_rank_threads_own_failure_is_raised_untouched_and_the_stats_name_its_rank():
    own, fails = _own_and_peer_failures()
    threads = FabricThreads(Fabric(DP2))
    with pytest.raises(_Sealed) as info:
        threads.run({r: (lambda r=r: fails(r)) for r in (0, 1)})
    assert info.value is own and threads.fabric.stats.failed_rank == 1
