"""vLLM Ascend's batch decision, unmodified, on simulated DP ranks (issue 36 item 2).

Each rank is a thread with its own vLLM ``parallel_state`` groups on the fabric's
torch.distributed backend (`sim.vllm_ranks`) and its own ``VllmConfig``; it runs vLLM
Ascend's ``NPUModelRunner._determine_batch_execution_and_padding`` (dispatch, the DP sync
``_sync_metadata_across_dp`` with its skip predicate ``should_skip_allreduce_across_dp_group``,
re-dispatch; model_runner_v1.py:2714-2800 @182b75ea) on its own batch, then one MoE layer's
EP collectives for the decision it reached (tests/vllm_ascend/dp_ranks.py says what is
re-stated there and which runner attributes the method reads).

A2's MC2 needs an EP group of at least 16 ranks, so the MC2 cases run 16 DP ranks: ranks 0
and 2-15 decode 4 requests, rank 1 holds the batch under test.
"""

from __future__ import annotations

import random

import harness
import pytest

harness.require()

import dp_ranks  # noqa: E402
import vllm_ascend.ops  # noqa: E402,F401  (model_runner_v1's imports need vllm_ascend.ops loaded first)
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm_ascend.utils import should_skip_allreduce_across_dp_group  # noqa: E402

from ascendgraph.errors import CollectiveDeadlock, CollectiveMismatch  # noqa: E402
from ascendgraph.parallel import coordination  # noqa: E402
from ascendgraph.parallel.layout import ParallelLayout  # noqa: E402
from sim.vllm_ranks import VllmRanks  # noqa: E402


pytestmark = pytest.mark.usefixtures("fresh_simulated_npu")

DP = dp_ranks.A2_MC2_MIN_EP
DECODE_4 = dp_ranks.Batch((1, 1, 1, 1))
# HCCL's hierarchical communication (vllm_ascend/utils.py is_hierarchical_communication_enabled):
# should_skip_allreduce_across_dp_group answers False first, so the DP all-reduce runs.
HIERARCHICAL = {"HCCL_INTRA_ROCE_ENABLE": "0", "HCCL_INTRA_PCIE_ENABLE": "1"}
NOT_HIERARCHICAL = {"HCCL_INTRA_ROCE_ENABLE": None, "HCCL_INTRA_PCIE_ENABLE": None}


def _run(configs, batches, *, env, forward=True, decide=None):
    """Every rank decides its batch with vLLM Ascend's code, then runs one MoE layer; per
    rank (mode, key, num_tokens_across_dp, MoE method) and the fabric's stats."""
    ranks = VllmRanks(ParallelLayout(dp=len(configs)))
    got = {}

    def body(rank):
        runner = dp_ranks.batch_runner(configs[rank])
        mode, descriptor, across = batches[rank].decide(runner)
        key = dp_ranks.graph_key(mode, descriptor)
        shown = None if across is None else tuple(int(v) for v in across)
        if decide is not None:
            ranks.world.decide("dp", tuple(range(len(configs))), decide(mode, key, shown))
        method = dp_ranks.moe_layer(ranks, configs[rank], mode, descriptor, across) if forward else None
        got[rank] = (mode, key, shown, method)

    with harness.environment(**env), dp_ranks.process_state(configs[0]):
        stats = ranks.run(body)
    return got, stats


@pytest.fixture(scope="module")
def decode_node():
    """16 DP ranks of a PD decode node (KV consumer) with the recompute scheduler,
    FULL_DECODE_ONLY: the configuration of vLLM Ascend #13826 (its thread: A2, DP32/EP32)."""
    return dp_ranks.rank_configs(DP, "FULL_DECODE_ONLY")


def _restated_skip(config):
    """`coordination.should_skip_allreduce_across_dp_group` given the facts vLLM Ascend's own
    functions read from ``config`` (on a rank thread: the MoE method reads the EP group)."""
    from vllm_ascend import utils
    from vllm_ascend.ascend_config import get_ascend_config
    from vllm_ascend.ascend_forward_context import select_moe_comm_method
    from vllm_ascend.ops.fused_moe.moe_comm_method import MoECommType

    def needs_mc2(tokens):
        return select_moe_comm_method(tokens, config) in (MoECommType.MC2, MoECommType.FUSED_MC2)

    transfer = config.kv_transfer_config
    return coordination.should_skip_allreduce_across_dp_group(
        is_moe=utils.is_moe_model(config), is_kv_consumer=transfer is not None and transfer.is_kv_consumer,
        decode_needs_mc2=needs_mc2(utils.get_potential_max_tokens()),
        prefill_needs_mc2=needs_mc2(config.scheduler_config.max_num_batched_tokens),
        uniform_cudagraph_mode=not config.compilation_config.cudagraph_mode.separate_routine(),
        recompute_scheduler_enable=get_ascend_config().scheduler_config.recompute_scheduler_enable,
        hierarchical_comm=utils.is_hierarchical_communication_enabled())


def _skips(configs, env):
    """should_skip_allreduce_across_dp_group on each rank (it reads the rank's EP group),
    held to the re-statement's answer."""
    answers = {}

    def body(rank):
        answers[rank] = should_skip_allreduce_across_dp_group(configs[rank])
        assert _restated_skip(configs[rank]) == answers[rank]

    with harness.environment(**env), dp_ranks.process_state(configs[0]):
        VllmRanks(ParallelLayout(dp=len(configs))).run(body)
    return set(answers.values())


def test_the_decode_node_takes_the_mc2_skip_path(decode_node):
    """The predicate itself, per rank: MoE, KV consumer, MC2 for the potential decode size, the
    recompute scheduler (vllm_ascend/utils.py:1099-1148) -> skip; hierarchical HCCL, a node that
    is not a KV consumer or an EP group too small for A2's MC2 -> no skip. The re-statement
    (`coordination.should_skip_allreduce_across_dp_group`) answers the same each time."""
    assert _skips(decode_node, NOT_HIERARCHICAL) == {True}
    assert _skips(decode_node, HIERARCHICAL) == {False}
    # FULL with a batch limit MC2 covers: the chunked-prefill condition holds without the
    # recompute scheduler, so only the KV-consumer check tells the two nodes apart
    sizes = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    for consumer, expected in ((True, {True}), (False, {False})):
        node = dp_ranks.rank_configs(DP, "FULL", capture_sizes=sizes, max_num_batched_tokens=256,
                                     kv_consumer=consumer, recompute_scheduler=False)
        assert _skips(node, NOT_HIERARCHICAL) == expected
    assert _skips(dp_ranks.rank_configs(8, "FULL_DECODE_ONLY"), NOT_HIERARCHICAL) == {False}


@pytest.mark.parametrize("rank1", [dp_ranks.Batch((2, 1)), dp_ranks.ZERO_TOKEN_STEP_DUMMY],
                         ids=["recompute_beside_a_decode", "zero_token_step_dummy"])
def test_mc2_skip_keeps_each_ranks_mode_and_a_graph_meets_eager(decode_node, rank1):
    """tests/ranks/scenario_files/mc2_skip_unsynced_mode.toml (vLLM Ascend #13826), buggy side,
    through vLLM Ascend's code: the skip path returns without the DP all-reduce, so rank 1's
    batch that is not a uniform decode (a two-token recompute beside a decode, or the
    ``_dummy_run(1)`` of a zero-token step) stays eager while its peers replay FULL:4x4, and
    the MC2 dispatch pairs a replayed collective with an eager one."""
    batches = [DECODE_4] * DP
    batches[1] = rank1
    with pytest.raises(CollectiveMismatch) as info:
        _run(decode_node, batches, env=NOT_HIERARCHICAL)
    message = str(info.value)
    assert info.value.rules == ("graph_never_meets_eager",)
    assert "rank 0: graph:FULL:4x4, rank 1: eager" in message and "mc2_dispatch" in message
    assert "global_bs=128" in message  # the skip path's MC2: 8 tokens per rank x 16 ranks


def test_an_idle_ranks_dummy_batch_replays_and_meets_on_the_skip_path(decode_node):
    """An idle rank (no requests) runs ``execute_dummy_batch``: a uniform one-token decode,
    which FULL_DECODE_ONLY replays (FULL:1x1). On the skip path it meets its peers' FULL:4x4 in
    MC2 (global_bs > 0), so at 182b75ea the idle tail alone does not hang; the eager rank of
    #13826 is one whose batch is not a uniform decode (the test above)."""
    batches = [DECODE_4] * DP
    batches[1] = dp_ranks.IDLE_RANK_DUMMY
    got, stats = _run(decode_node, batches, env=NOT_HIERARCHICAL)
    assert got[1][1] == "FULL:1x1" and got[0][1] == "FULL:4x4" and stats.met["ep:device"] == 2


def test_with_the_dp_all_reduce_the_same_batches_meet(decode_node):
    """The same batches when the predicate does not hold (hierarchical HCCL): the DP
    all-reduce on the DP CPU group syncs the mode to NONE (the minimum), every rank runs the
    layer eagerly, MC2 with global_bs=0 at the DP maximum of 4 tokens."""
    batches = [DECODE_4] * DP
    batches[1] = dp_ranks.Batch((2, 1))
    got, stats = _run(decode_node, batches, env=HIERARCHICAL)
    assert stats.met["dp:cpu"] == 1 and stats.met["ep:device"] == 2
    assert {g[0] for g in got.values()} == {CUDAGraphMode.NONE} and {g[3] for g in got.values()} == {"MC2"}


def test_mc2_skip_lets_uneven_decode_replays_meet(decode_node):
    """The review's finding on same_graph_key: the skip path's uneven all-decode batches (rank
    1 FULL:8x8 among FULL:4x4) are what vLLM Ascend built it for. MC2 with global_bs > 0
    pairs uneven counts (token_dispatcher.py:133-149), so the replays of different graphs meet."""
    batches = [DECODE_4] * DP
    batches[1] = dp_ranks.Batch((1,) * 8)
    got, stats = _run(decode_node, batches, env=NOT_HIERARCHICAL)
    assert "dp:cpu" not in stats.met and stats.met["ep:device"] == 2
    assert got[0][1] == "FULL:4x4" and got[1][1] == "FULL:8x8"


def _separate_routines_node(mode):
    """16 DP ranks of a PD decode node (KV consumer) WITHOUT the recompute scheduler, in a mode
    with separate prefill and decode routines (``CUDAGraphMode.separate_routine()``, vLLM
    config/compilation.py:89-90: FULL_DECODE_ONLY, FULL_AND_PIECEWISE), whose prefill needs MC2
    too: ``enable_prefill_mc2`` makes the MC2 token capacity ``max_num_batched_tokens``, 256
    (ascend_forward_context.py:176-200@182b75ea, under the 512-token per-rank limit), so
    ``needs_mc2`` holds for the potential decode size (8) and for a whole batch of 256 tokens
    (vllm_ascend/utils.py:1134-1144). The configuration of vllm-project/vllm-ascend#14307."""
    return dp_ranks.rank_configs(DP, mode, max_num_batched_tokens=256, recompute_scheduler=False,
                                 enable_prefill_mc2=True)


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_a_separate_routines_node_without_the_recompute_scheduler_does_not_skip(mode):
    """The predicate itself, per rank, on #14307's configuration: decode and prefill both need
    MC2, but prefill and decode run different routines (``uniform_cudagraph_mode`` is False,
    utils.py:1145) and there is no recompute scheduler, so the DP all-reduce is not skipped;
    the same node with the recompute scheduler skips. The re-statement
    (`coordination.should_skip_allreduce_across_dp_group`) answers the same. Before #14307
    (vLLM Ascend 34d7306c01 reverted) the node skipped."""
    assert _skips(_separate_routines_node(mode), NOT_HIERARCHICAL) == {False}
    with_recompute = dp_ranks.rank_configs(DP, mode, max_num_batched_tokens=256, recompute_scheduler=True,
                                           enable_prefill_mc2=True)
    assert _skips(with_recompute, NOT_HIERARCHICAL) == {True}


@pytest.mark.parametrize("mode, rank1", [("FULL_DECODE_ONLY", dp_ranks.Batch((2, 1))),
                                         ("FULL_AND_PIECEWISE", dp_ranks.Batch((40,)))],
                         ids=["full_decode_only_recompute_beside_a_decode", "full_and_piecewise_prefill_past_the_graphs"])
def test_a_separate_routines_node_without_the_recompute_scheduler_syncs_a_prefill_with_its_peers_decodes(mode, rank1):
    """vllm-project/vllm-ascend#14307 through vLLM Ascend's own batch decision: on the node of
    `_separate_routines_node`, rank 1's batch is eager (FULL_DECODE_ONLY: a two-token recompute
    beside a decode, no FULL graph for a batch that is not a uniform decode; FULL_AND_PIECEWISE:
    a 40-token prefill past the largest capture size, 8, but within MC2's capacity) while ranks 0
    and 2-15 decode 4 requests, which their FULL graphs replay. At 182b75ea the DP all-reduce
    runs (`_sync_metadata_across_dp`, model_runner_v1.py:685-700), the mode agreed is NONE and
    every rank runs the MoE layer eagerly, MC2 with ``global_bs = 0`` at the DP maximum. With the
    fix reverted the skip path keeps each rank's own mode: the MC2 dispatch pairs rank 0's
    FULL:4x4 replay with rank 1's eager call, `CollectiveMismatch` `graph_never_meets_eager`."""
    batches = [DECODE_4] * DP
    batches[1] = rank1
    got, stats = _run(_separate_routines_node(mode), batches, env=NOT_HIERARCHICAL)
    assert stats.met["dp:cpu"] == 1 and stats.met["ep:device"] == 2
    assert {g[0] for g in got.values()} == {CUDAGraphMode.NONE} and {g[3] for g in got.values()} == {"MC2"}
    assert {max(g[2]) for g in got.values()} == {max(4, sum(rank1.query_lens))}  # one MC2 token count


def test_padding_decided_from_the_local_mode_diverges(decode_node):
    """tests/ranks/scenario_files/local_padding_diverges.toml, buggy side, through vLLM
    Ascend's code (the DP all-reduce runs): ``allow_dp_padding`` is the rank's local mode, so
    after the sync (both eager) the decode ranks hold num_tokens_across_dp padded to the
    maximum and the rank with the non-uniform batch the unpadded counts. The post-sync
    invariant (every rank holds the same mode, key and num_tokens_across_dp) names it."""
    batches = [DECODE_4] * DP
    batches[1] = dp_ranks.Batch((2, 1))
    with pytest.raises(CollectiveMismatch) as info:
        _run(decode_node, batches, env=HIERARCHICAL, forward=False,
             decide=lambda mode, key, across: (mode.name, key, across))
    message = str(info.value)
    assert info.value.rules == ("post_sync_invariant",)
    assert f"rank 0: mode, key, num_tokens_across_dp = ('NONE', 'NONE:4', {(4,) * DP})" in message
    assert f"rank 1: mode, key, num_tokens_across_dp = ('NONE', 'NONE:3', {(4, 3) + (4,) * (DP - 2)})" in message


def test_a_rank_that_skips_the_decision_on_a_zero_token_step_deadlocks():
    """tests/ranks/scenario_files/zero_token_step_skips_sync.toml (vLLM #43547) through vLLM
    Ascend's batch decision: each engine iteration every rank runs a step, but rank 1's
    zero-token step returns without the decision (and so without the DP all-reduce). After
    three iterations the engine core's unfinished-requests all-reduce (vLLM's
    ``ParallelConfig.sync_dp_state`` on its own DP group) meets nothing: rank 0 is still in its
    third DP sync. The deadlock names both ranks' pending collectives and, in the flight
    record, the graph key their last MoE collectives were replayed from (two EP ranks: A2
    selects the all-gather method, not MC2)."""
    from vllm.config import ParallelConfig

    small = dp_ranks.rank_configs(2, "FULL_DECODE_ONLY")
    ranks = VllmRanks(ParallelLayout(dp=2))
    steps = {0: [DECODE_4, DECODE_4, DECODE_4], 1: [None, DECODE_4, DECODE_4]}

    def body(rank):
        runner = dp_ranks.batch_runner(small[rank])
        for batch in steps[rank]:
            if batch is None:
                continue  # the zero-token step returns early (#43547)
            mode, descriptor, across = batch.decide(runner)
            dp_ranks.moe_layer(ranks, small[rank], mode, descriptor, across)
        ParallelConfig.sync_dp_state(ranks.engine_dp_group(), True, False)

    with harness.environment(**HIERARCHICAL), dp_ranks.process_state(small[0]), \
            pytest.raises(CollectiveDeadlock) as info:
        ranks.run(body)
    message = str(info.value)
    assert "rank 0 waits in dp:cpu#2 all_reduce.sum(2x2 int32)" in message
    assert "rank 1 waits in dp:engine#0 all_reduce.sum(2 int32)" in message
    # the flight record: the last MoE collectives both completed, replayed from FULL:4x4
    assert message.count("ep:device#3 reduce_scatter_single.sum(8x256 bfloat16) graph:FULL:4x4") == 2


def _generated_batches(seed: int, dp: int, steps: int) -> list[list[dp_ranks.Batch]]:
    """Per step, one batch per rank: a uniform decode of 1-8 requests, a small non-uniform
    batch (a recompute beside decodes), or a batch past the largest capture size."""
    draw = random.Random(seed)
    out = []
    for _ in range(steps):
        row = []
        for _ in range(dp):
            kind = draw.choice(("decode", "decode", "mixed", "large"))
            if kind == "decode":
                row.append(dp_ranks.Batch((1,) * draw.randint(1, 8)))
            elif kind == "mixed":
                row.append(dp_ranks.Batch((draw.randint(2, 3),) + (1,) * draw.randint(0, 3)))
            else:
                row.append(dp_ranks.Batch((draw.randint(9, 40),)))
        out.append(row)
    return out


def _restated_decisions(config, steps, *, skip):
    """ascendgraph's re-statement (`ascendgraph.parallel.coordination`, the vllm_ascend policy,
    ascendgraph's GraphDispatcher) on the same batches: per step, per rank (mode, padded
    tokens, num_tokens_across_dp)."""
    from ascendgraph.dispatch import GraphDispatcher
    from ascendgraph.modes import GraphMode

    policy = coordination.get_policy("vllm_ascend")
    dp = len(steps[0])
    dispatcher = GraphDispatcher(GraphMode[config.compilation_config.cudagraph_mode.name],
                                 capture_sizes=config.compilation_config.cudagraph_capture_sizes,
                                 max_num_seqs=config.scheduler_config.max_num_seqs)

    def dispatch(tokens, uniform, valid):
        modes = None if valid is None else {GraphMode(v) for v in valid}
        mode, key = dispatcher.dispatch(tokens, uniform_decode=uniform, valid_modes=modes)
        return mode.value, key.num_tokens, f"{mode.name}:{key.num_tokens}"

    for row in steps:
        uniform = [max(b.query_lens) == 1 and sum(b.query_lens) == len(b.query_lens) for b in row]
        plans = [coordination.first_dispatch(sum(b.query_lens), uniform_decode=u, dispatch=dispatch)
                 for b, u in zip(row, uniform)]
        rows = [coordination.dp_sync_contribution(policy, num_tokens=p.num_tokens_padded, mode=p.mode, dp_size=dp,
                                                  dp_rank=r, skip=skip) for r, p in enumerate(plans)]
        reduced = None if rows[0] is None else [[sum(c[i][j] for c in rows) for j in range(dp)]
                                                for i in range(len(rows[0]))]
        decided = []
        for rank, plan in enumerate(plans):
            sync = coordination.dp_sync_result(policy, reduced, num_tokens=plan.num_tokens_padded, mode=plan.mode,
                                               dp_size=dp)
            final = coordination.redispatch_after_sync(plan, sync, dp_rank=rank, uniform_decode=uniform[rank],
                                                       dispatch=dispatch)
            decided.append((final.mode, final.num_tokens_padded, final.num_tokens_across_dp))
        yield decided


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("env, skip", [(NOT_HIERARCHICAL, True), (HIERARCHICAL, False)], ids=["skip", "all_reduce"])
def test_the_batch_decision_and_the_restatement_agree(decode_node, seed, env, skip):
    """A differential on generated steps: vLLM Ascend's ``_determine_batch_execution_and_padding``
    on 16 fabric ranks against `coordination.first_dispatch` / `dp_sync_contribution` /
    `dp_sync_result` / `redispatch_after_sync` under the vllm_ascend policy (what the CLI's
    ``--dp-sync-policy vllm_ascend`` runs), with and without the MC2 skip path."""
    steps = _generated_batches(seed, DP, 5)
    got: dict[int, list] = {}

    def body(rank):
        runner = dp_ranks.batch_runner(decode_node[rank])
        got[rank] = []
        for row in steps:
            mode, descriptor, across = row[rank].decide(runner)
            got[rank].append((mode.value, descriptor.num_tokens, tuple(int(v) for v in across)))

    with harness.environment(**env), dp_ranks.process_state(decode_node[0]):
        stats = VllmRanks(ParallelLayout(dp=DP)).run(body)
    assert stats.met.get("dp:cpu", 0) == (0 if skip else len(steps))
    for index, decided in enumerate(_restated_decisions(decode_node[0], steps, skip=skip)):
        for rank in range(DP):
            assert got[rank][index] == decided[rank], (index, rank, steps[index][rank])
