"""Two whole ``NPUModelRunner``s as DP ranks, lock-step on the fabric (issue 36 item 3).

Each rank is a thread on its own simulated NPU with its own ``VllmConfig``, groups, worker
(vLLM Ascend's runner: constructor, ``load_model``, ``initialize_kv_cache``, ``capture_model``)
and vLLM scheduler, stepped as vLLM's DP engine core steps (tests/vllm_ascend/runner_ranks.py
says what is restated). The model is a dense Qwen2-MoE with vLLM Ascend's MLP tensor
parallelism across the two DP ranks, so every layer's all-gather and reduce-scatter meet the
peer's inside the FULL graphs (``graph:<graph>``) or eagerly. The hangs of tests/ranks'
scenarios appear here in vLLM Ascend's own runner code, as fabric errors with the flight
record.
"""

from __future__ import annotations

import harness
import pytest

harness.require()

import runner_ranks  # noqa: E402
import serving  # noqa: E402

from ascendgraph.errors import CollectiveDeadlock, CollectiveMismatch, CollectiveTimeout  # noqa: E402

SPEC = serving.RunnerSpec(mode="FULL_DECODE_ONLY", capture_sizes=(1, 4))
# rank 0 serves from the first step; rank 1 is idle for two steps, then prefills while rank 0
# decodes, then decodes beside it, then is idle again while rank 0 ends. Prompts of 4 tokens:
# a decode padded to a prefill's count is a capture size (FULL:4), so a rank that keeps FULL
# there replays (otherwise the snapshot's re-dispatch asserts first, model_runner_v1.py:2795)
STAGGERED = (
    runner_ranks.RankPlan((serving.Arrival(0, "r0", 4, 6),)),
    runner_ranks.RankPlan((serving.Arrival(2, "r1", 4, 2),)),
)


def _planted_unsynced_mode() -> type:
    """vLLM Ascend before PR #6011: the DP sync agrees on the token counts, and each rank keeps
    its own graph mode (the synced mode of ``_sync_metadata_across_dp`` replaced by the rank's)."""
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    class UnsyncedModeRunner(NPUModelRunner):
        def _sync_metadata_across_dp(self, num_tokens, is_draft_model=False, cudagraph_mode=None, **kwargs):
            from vllm.config import CUDAGraphMode

            local = CUDAGraphMode.NONE if cudagraph_mode is None else cudagraph_mode
            tokens, across, _synced = super()._sync_metadata_across_dp(num_tokens, is_draft_model, local, **kwargs)
            return tokens, across, local

    return UnsyncedModeRunner


def test_an_idle_rank_and_a_prefilling_rank_meet_their_peer_through_vllm_ascends_runner():
    """The snapshot's behaviour (the fixed side of zero_token_step_skips_sync and
    graph_meets_eager): an idle rank runs ``execute_dummy_batch`` every step, so its DP sync and
    its MLP collectives meet the serving rank's; when rank 1 prefills while rank 0 decodes, the
    DP sync's mode is NONE on both (``_post_process_cudagraph_mode``: the minimum), so both run
    eagerly at the padded count and meet; when both decode, both replay. Each rank serves its
    own request to the end."""
    result = runner_ranks.run(SPEC, STAGGERED)
    rank0, rank1 = result.logs[0].steps, result.logs[1].steps
    assert result.logs[0].graphs == result.logs[1].graphs == {"graph#1": "FULL:4", "graph#2": "FULL:1"}
    assert rank0[:4] == ["step:NONE:4", "step:FULL:1", "step:NONE:4", "step:FULL:1"]
    assert rank1[:4] == ["dummy", "dummy", "step:NONE:4", "step:FULL:1"]
    assert rank1[4:6] == ["dummy", "dummy"] and set(rank0[6:]) == {"dummy"}
    assert len(result.logs[0].tokens["r0"]) == 6 and len(result.logs[1].tokens["r1"]) == 2
    assert result.stats.met["dp:engine"] == 1 and result.stats.met["mlptp:device"] > 0


def test_an_idle_rank_that_skips_its_dummy_batch_deadlocks_in_sync_dp_state():
    """tests/ranks/scenario_files/zero_token_step_skips_sync.toml's buggy side (vLLM #43547)
    through the runners: rank 1, idle, returns without ``execute_dummy_batch`` (so without the
    step's DP sync), reaches the engine core's ``sync_dp_state`` on ``dp:engine`` while rank 0
    waits in vLLM Ascend's ``_sync_metadata_across_dp`` on ``dp:cpu``: a deadlock, named."""
    plans = (STAGGERED[0], runner_ranks.RankPlan((), dummy_when_idle=False))
    with pytest.raises(CollectiveDeadlock) as info:
        runner_ranks.run(SPEC, plans)
    message = str(info.value)
    assert "rank 0: pending dp:cpu#" in message and "rank 1: pending dp:engine#0" in message
    assert "flight record" in message and "mlptp:device" in message  # the layers' last meetings


def test_a_rank_that_keeps_its_own_mode_replays_into_its_peers_eager_collective():
    """tests/ranks/scenario_files/graph_meets_eager.toml's buggy side (vLLM Ascend before PR
    #6011) through the runners: the modes are not synced, so at the first step, where rank 0
    prefills (NONE) and rank 1 runs its idle dummy batch (a uniform decode: FULL), rank 1 pads to
    rank 0's 4 tokens and replays its FULL graph of size 4, and the MLP all-gather captured in it
    meets rank 0's eager one: ``graph_never_meets_eager``, naming both sides."""
    plans = tuple(runner_ranks.RankPlan(plan.arrivals, runner_class=_planted_unsynced_mode) for plan in STAGGERED)
    logs = {}
    with pytest.raises(CollectiveMismatch) as info:
        runner_ranks.run(SPEC, plans, logs=logs)
    message = str(info.value)
    assert info.value.rules == ("graph_never_meets_eager",)
    assert "mlptp:device#" in message and "rank 0: eager, rank 1: graph:graph#1" in message
    assert logs[1].graphs == {"graph#1": "FULL:4", "graph#2": "FULL:1"}  # rank 1's graph of 4 tokens


def test_a_capture_error_on_one_rank_leaves_its_peer_waiting_until_the_timeout():
    """tests/ranks/scenario_files/capture_error_on_one_rank.toml through the runners: a 207008
    at rank 1's second capture (its NPU's fault plan). vLLM Ascend 182b75ea has no agreed
    capture phase: rank 1's ``capture_model`` raises (acl_graph.py:201-212, re-raised by
    model_runner_v1.py:4958-4962), and rank 0 waits in its next collective of ``capture_model``
    for a rank that never comes: ``CollectiveTimeout`` naming rank 1 (the scenario's buggy
    side)."""
    devices = [{}, {"faults": "capture_begin=1*off->raise(207008)"}]
    with pytest.raises(CollectiveTimeout) as info:
        runner_ranks.run(SPEC, STAGGERED, devices=devices)
    assert info.value.straggler == 1
    assert "stream-resource exhaustion" in str(info.value) and "rank 0: pending" in str(info.value)


def test_two_ranks_prefilling_different_counts_eagerly_bring_different_shapes_to_the_mlp_all_gather():
    """A finding (vLLM Ascend 182b75ea, docs/ranks.md): the DP padding after the sync is allowed
    when the local mode is not NONE or under sequence parallelism, o_proj TP or embedding TP
    (model_runner_v1.py:2776-2781), not under MLP TP, whose all-gather spans the DP ranks too. Two
    ranks prefilling 3 and 5 tokens in the same step both run eagerly unpadded, and their MLP
    all-gathers bring 3 and 5 rows: ``same_shape`` (on cards HCCL would read past the shorter
    buffer or hang)."""
    plans = (runner_ranks.RankPlan((serving.Arrival(0, "r0", 3, 2),)),
             runner_ranks.RankPlan((serving.Arrival(0, "r1", 5, 2),)))
    with pytest.raises(CollectiveMismatch) as info:
        runner_ranks.run(SPEC, plans)
    assert info.value.rules == ("same_shape",)
    assert "mlptp:device#" in str(info.value) and "rank 0: (3, 1024), rank 1: (5, 1024)" in str(info.value)
