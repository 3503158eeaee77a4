"""The fabric as a torch.distributed backend (sim.process_group): ranks as threads, each
collective a fingerprinted meeting with the fabric's rules, clocks, timeout and flight record."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from ascendgraph.errors import CollectiveDeadlock, CollectiveMismatch, CollectiveTimeout, ConfigError
from sim.process_group import BACKEND_NAME, FabricWorld


def test_every_collective_moves_the_data_like_torch_distributed():
    out = {}

    def body(rank):
        assert dist.get_backend() == BACKEND_NAME and dist.get_rank() == rank
        total = torch.tensor([rank + 1])
        dist.all_reduce(total)
        pair = [dist.new_group([0, 1], group_desc="tp"), dist.new_group([2, 3], group_desc="tp")][rank // 2]
        largest = torch.tensor([float(rank)])
        dist.all_reduce(largest, op=dist.ReduceOp.MAX, group=pair)
        gathered = torch.zeros(4, dtype=torch.int64)
        dist.all_gather_single(gathered, torch.tensor([rank]))
        listed = [torch.zeros(1, dtype=torch.int64) for _ in range(4)]
        dist.all_gather(listed, torch.tensor([rank * 10]))
        swapped = torch.zeros(4, dtype=torch.int64)
        dist.all_to_all_single(swapped, torch.arange(4) + rank * 4)
        scattered = torch.zeros(1, dtype=torch.int64)
        dist.reduce_scatter_single(scattered, torch.arange(4))
        root = torch.tensor([rank])
        dist.broadcast(root, src=2)
        dist.barrier()
        sent = torch.tensor([rank * 100])
        if rank == 2:
            dist.send(sent, dst=3)
        if rank == 3:
            dist.recv(sent, src=2)
        out[rank] = (total.item(), largest.item(), gathered.tolist(), [t.item() for t in listed], swapped.tolist(),
                     scattered.item(), root.item(), sent.item())

    stats = FabricWorld(4).run(body)
    for rank in range(4):
        assert out[rank] == (10, 1.0 if rank < 2 else 3.0, [0, 1, 2, 3], [0, 10, 20, 30],
                             [rank, 4 + rank, 8 + rank, 12 + rank], 4 * rank, 2, 200 if rank in (2, 3) else rank * 100)
    assert stats.met["tp"] == 2 and stats.met["default_pg:p2p"] == 1


def test_the_deprecated_spellings_that_vllm_calls_still_meet():
    """vLLM 0.27.1 (device_communicators/base_device_communicator.py:244) and vLLM Ascend
    (distributed/utils.py:26, ops/fused_moe/moe_utils.py:98) call all_gather_into_tensor, which
    torch 2.13 deprecates in favour of all_gather_single (reduce_scatter_tensor likewise): the
    backend serves both spellings as one collective."""
    out = {}

    def body(rank):
        gathered = torch.zeros(2, dtype=torch.int64)
        dist.all_gather_into_tensor(gathered, torch.tensor([rank + 5]))
        scattered = torch.zeros(1, dtype=torch.int64)
        dist.reduce_scatter_tensor(scattered, torch.tensor([1, 2]) * (rank + 1))
        out[rank] = (gathered.tolist(), scattered.item())

    with pytest.warns(FutureWarning) as caught:
        stats = FabricWorld(2).run(body)
    deprecated = {str(w.message).split("`")[1] for w in caught if issubclass(w.category, FutureWarning)}
    assert deprecated == {"torch.distributed.all_gather_into_tensor", "torch.distributed.reduce_scatter_tensor"}
    assert out == {0: ([5, 6], 3), 1: ([5, 6], 6)} and stats.met == {"default_pg": 2}


def test_a_group_is_its_own_npu_backend_and_names_its_communicator_per_group():
    """vLLM Ascend's MoE token dispatchers ask their group's NPU backend for its HCCL
    communicator name at construction (ops/fused_moe/token_dispatcher.py:116-119, 493-495
    @182b75ea; torch_npu's ProcessGroupHCCL.get_hccl_comm_name): every member of a group gets
    the same name, another group another."""
    import sim.npu_device as npu_device

    npu_device.enable()  # the device type spelled "npu"
    out = {}

    def body(rank):
        pair = [dist.new_group([0, 1], group_desc="ep"), dist.new_group([2, 3], group_desc="ep")][rank // 2]
        backend = pair._get_backend(torch.device("npu"))
        out[rank] = (backend is pair, backend.get_hccl_comm_name(rank % 2))

    FabricWorld(4).run(body)
    assert all(same for same, _ in out.values())
    assert out[0][1] == out[1][1] == "ep@0,1" and out[2][1] == out[3][1] == "ep@2,3"


def test_a_shape_mismatch_is_exact_and_ends_every_thread():
    def body(rank):
        dist.all_reduce(torch.zeros(4 if rank == 0 else 2, 2, dtype=torch.int32))

    with pytest.raises(CollectiveMismatch) as info:
        FabricWorld(2).run(body)
    assert info.value.rules == ("same_shape",) and "flight record" in str(info.value)


def test_a_collective_on_another_group_is_a_deadlock_not_a_hang():
    def body(rank):
        cpu = dist.new_group([0, 1], group_desc="dp:cpu")
        engine = dist.new_group([0, 1], group_desc="dp:engine")
        dist.all_reduce(torch.zeros(2, dtype=torch.int32), group=cpu if rank == 0 else engine)

    with pytest.raises(CollectiveDeadlock, match="every live rank is blocked"):
        FabricWorld(2).run(body)


def test_a_rank_that_raises_is_the_named_straggler():
    def body(rank):
        if rank == 2:
            raise ValueError("rank program bug")
        dist.all_reduce(torch.zeros(1))

    with pytest.raises(CollectiveTimeout) as info:
        FabricWorld(3).run(body)
    assert info.value.straggler == 2 and "ValueError: rank program bug" in str(info.value)


def test_a_replayed_collective_carries_its_graph_key():
    world = FabricWorld(2)

    def body(rank):
        if rank == 0:
            with world.replaying("FULL:4"):
                dist.all_reduce(torch.zeros(4))
        else:
            dist.all_reduce(torch.zeros(4))

    with pytest.raises(CollectiveMismatch) as info:
        world.run(body)
    assert info.value.rules == ("graph_never_meets_eager",) and "graph:FULL:4" in str(info.value)


def test_the_virtual_clocks_name_the_late_rank_past_hccl_exec_timeout():
    clocks = {0: 0.0, 1: 5_000_000.0}
    world = FabricWorld(2, timeout_s=2, clock=lambda rank: clocks[rank])
    with pytest.raises(CollectiveTimeout) as info:
        world.run(lambda rank: dist.all_reduce(torch.zeros(1)))
    assert info.value.straggler == 1


def test_a_surplus_post_sync_decision_fails_at_the_end_of_the_run():
    world = FabricWorld(2)

    def body(rank):
        dist.all_reduce(torch.zeros(1))
        world.decide("dp", (0, 1), (2, "FULL:4", (4, 4)))
        if rank == 1:
            world.decide("dp", (0, 1), (2, "FULL:4", (4, 4)))

    with pytest.raises(CollectiveMismatch, match="surplus") as info:
        world.run(body)
    assert info.value.rules == ("post_sync_invariant",)


def test_mc2_meetings_follow_the_mc2_rules():
    """moe_distribute: with global_bs > 0 (the skip path) replays of different sizes meet within
    global_bs / ep; with global_bs = 0 the counts must be equal (mc2_token_counts)."""
    world = FabricWorld(2)

    def uneven(global_bs):
        def body(rank):
            group = dist.new_group([0, 1], group_desc="ep:device")
            tokens = 4 if rank == 0 else 8
            with world.replaying(f"FULL:{tokens}x{tokens}"):
                out = group.moe_distribute("dispatch", torch.ones(tokens, 2), global_bs)
                group.moe_distribute("combine", out, global_bs)
        return body

    stats = world.run(uneven(16))
    assert stats.met == {"ep:device": 2}
    with pytest.raises(CollectiveMismatch) as info:
        FabricWorld(2).run(uneven(0))
    assert "mc2_token_counts" in info.value.rules and "same_graph_key" in info.value.rules
    with pytest.raises(ValueError, match="moe_distribute stage must be .dispatch. or .combine., got .send."):
        FabricWorld(2).run(lambda rank: dist.new_group([0, 1]).moe_distribute("send", torch.ones(1), 0))


@pytest.mark.parametrize("env, straggles", [({"HCCL_EXEC_TIMEOUT": "2"}, True), ({"HCCL_EXEC_TIMEOUT": "0"}, False),
                                            ({"HCCL_OP_EXPANSION_MODE": "AIV"}, False)])
def test_the_wait_limit_is_hccl_exec_timeout_from_the_environment(monkeypatch, env, straggles):
    """Without a timeout given, FabricWorld reads HCCL_EXEC_TIMEOUT (0: never) and the AIV
    expansion mode's default (1091 s) as the rank simulation does (docs/ranks.md)."""
    for name in ("HCCL_EXEC_TIMEOUT", "HCCL_OP_EXPANSION_MODE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    clocks = {0: 0.0, 1: 5_000_000.0}
    world = FabricWorld(2, clock=lambda rank: clocks[rank])
    assert world.timeout_s == {"2": 2.0, "0": None}.get(env.get("HCCL_EXEC_TIMEOUT", ""), 1091.0)
    if not straggles:
        world.run(lambda rank: dist.all_reduce(torch.zeros(1)))
        return
    with pytest.raises(CollectiveTimeout, match="past the 2 s HCCL_EXEC_TIMEOUT; the straggler is rank 1"):
        world.run(lambda rank: dist.all_reduce(torch.zeros(1)))


def _captured_all_reduce(world, keys, eager_rank=None, replays=2):
    """Each rank captures dist.all_reduce into a graph named ``keys[rank]`` on its own
    simulated device, then replays it ``replays`` times (``eager_rank`` runs it eagerly)."""
    from ascendgraph.device import get_device

    out = {}

    def body(rank):
        device = get_device("sim")
        x = torch.full((4,), float(rank + 1), device=device.torch_device)
        if rank == eager_rank:
            for _ in range(replays):
                dist.all_reduce(x)
            out[rank] = x.tolist()
            return
        graph = device.new_graph(keys[rank])
        with device.graph(graph):
            dist.all_reduce(x)
        out[rank, "captured"] = x.tolist()  # nothing met at capture: the graph holds the collective
        for _ in range(replays):
            x.fill_(float(rank + 1))  # a host write: the previous replay is done (synchronized)
            graph.replay()  # queued on the device; the collective meets when the host waits for it
            device.synchronize()
        out[rank] = x.tolist()

    return world.run(body), out


def test_a_captured_collective_meets_at_replay_carrying_its_graph_key():
    """A collective captured on a rank's simulated device (sim.capture) does not meet at capture;
    each replay of the graph meets as graph:<the graph's name>, moving the replay's data."""
    stats, out = _captured_all_reduce(FabricWorld(2), {0: "FULL:4", 1: "FULL:4"})
    assert out[0, "captured"] == [1.0] * 4 and out[1, "captured"] == [2.0] * 4
    assert stats.met == {"default_pg": 2} and out[0] == out[1] == [3.0] * 4
    world = FabricWorld(2)
    with pytest.raises(CollectiveMismatch) as info:
        _captured_all_reduce(world, {0: "FULL:4", 1: "FULL:8"})
    assert info.value.rules == ("same_graph_key",)
    assert "rank 0: graph:FULL:4, rank 1: graph:FULL:8" in str(info.value)
    with pytest.raises(CollectiveMismatch) as info:
        _captured_all_reduce(FabricWorld(2), {0: "FULL:4"}, eager_rank=1)
    assert info.value.rules == ("graph_never_meets_eager",) and "rank 0: graph:FULL:4, rank 1: eager" in str(info.value)


def test_a_collective_the_backend_cannot_capture_is_refused_by_name():
    from ascendgraph.device import get_device

    def body(rank):
        device = get_device("sim")
        with device.graph(device.new_graph("FULL:1")):
            dist.barrier()

    with pytest.raises(RuntimeError, match="simulator: barrier inside a graph capture is not simulated"):
        FabricWorld(2).run(body)


@pytest.mark.parametrize("size", [0, -1, 513, 2.5, True])
def test_a_world_size_the_fabric_cannot_lay_out_is_one_line_naming_it(size):
    with pytest.raises(ConfigError, match=rf"FabricWorld world_size must be an integer from 1 to 512 .*got {size!r}$"):
        FabricWorld(size)
