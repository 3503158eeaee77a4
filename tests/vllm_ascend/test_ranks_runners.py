"""Two whole ``NPUModelRunner``s as DP ranks, lock-step on the fabric (issue 36 item 3).

Each rank is a thread on its own simulated NPU with its own ``VllmConfig``, groups, worker
(vLLM Ascend's runner: constructor, ``load_model``, ``initialize_kv_cache``, ``capture_model``)
and vLLM scheduler, stepped as vLLM's DP engine core steps (tests/vllm_ascend/runner_ranks.py
says what is restated). The model is a MoE deployment (`runner_ranks.MOE_EP`, the default): a Qwen2-MoE
layer that is vLLM Ascend's own fused MoE with its experts spread over the two DP ranks, so
every forward (a served step or an idle rank's dummy batch) all-gathers its tokens and router
logits over the ``dp`` group and reduce-scatters the result (the all-gather method an EP group
of 2 gets on A2), inside the FULL graphs (``graph:<graph>``) or eagerly. The hangs of
tests/ranks' scenarios appear here in vLLM Ascend's own runner code, as fabric errors with the
flight record. One test is about tensor parallelism of a dense layer and keeps the dense
stand-in (`runner_ranks.DENSE_MLP_TP`, said at the test).
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


def _planted_dummy_skipping_the_moe() -> type:
    """A runner whose idle dummy batches (``_dummy_run`` once the graphs are captured) leave the
    MoE layer out: ``AscendMoERunner._forward_impl`` (called by vLLM's ``moe_forward`` op,
    moe_runner.py:115-127) answers zeros without gathering or scattering anything, as a runner
    that spares idle ranks the experts' work would. The profile run and the captures keep the
    layer, so the graphs hold its collectives; only the eager dummy batches skip them."""
    import torch
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    class DummySkippingMoeRunner(NPUModelRunner):
        skipping = False  # set inside an idle dummy batch
        serving = False  # set once capture_model has returned

        def load_model(self, *args, **kwargs):
            super().load_model(*args, **kwargs)
            for layer in self.get_model().modules():
                if hasattr(layer, "routed_experts") and hasattr(layer, "_forward_impl"):
                    layer._forward_impl = self._unless_skipping(layer._forward_impl)

        def _unless_skipping(self, forward):
            def forward_or_zeros(hidden_states, router_logits, *rest):
                if self.skipping:
                    return torch.zeros_like(hidden_states)
                return forward(hidden_states, router_logits, *rest)

            return forward_or_zeros

        def capture_model(self, *args, **kwargs):
            result = super().capture_model(*args, **kwargs)
            self.serving = True
            return result

        def _dummy_run(self, *args, **kwargs):
            self.skipping = self.serving
            try:
                return super()._dummy_run(*args, **kwargs)
            finally:
                self.skipping = False

    return DummySkippingMoeRunner


def test_an_idle_rank_and_a_prefilling_rank_meet_their_peer_through_vllm_ascends_runner():
    """The snapshot's behaviour (the fixed side of zero_token_step_skips_sync and
    graph_meets_eager): an idle rank runs ``execute_dummy_batch`` every step, so its DP sync and
    its MoE layer's all-gathers and reduce-scatter meet the serving rank's; when rank 1 prefills
    while rank 0 decodes, the DP sync's mode is NONE on both (``_post_process_cudagraph_mode``:
    the minimum), so both run eagerly at the padded count and meet; when both decode, both
    replay. Each rank serves its own request to the end."""
    result = runner_ranks.run(SPEC, STAGGERED)
    rank0, rank1 = result.logs[0].steps, result.logs[1].steps
    assert result.logs[0].graphs == result.logs[1].graphs == {"graph#1": "FULL:4", "graph#2": "FULL:1"}
    assert rank0[:4] == ["step:NONE:4", "step:FULL:1", "step:NONE:4", "step:FULL:1"]
    assert rank1[:4] == ["dummy", "dummy", "step:NONE:4", "step:FULL:1"]
    assert rank1[4:6] == ["dummy", "dummy"] and set(rank0[6:]) == {"dummy"}
    assert len(result.logs[0].tokens["r0"]) == 6 and len(result.logs[1].tokens["r1"]) == 2
    assert result.stats.met["dp:engine"] == 1 and result.stats.met["dp:device"] > 0


def test_an_idle_rank_whose_dummy_batch_skips_the_moe_layer_leaves_its_peer_in_the_moe_all_gather():
    """The idle rank must run the MoE layer in its dummy batch: the serving rank's layer gathers
    every DP rank's tokens. Rank 1's dummy batches skip the layer (a planted runner,
    `_planted_dummy_skipping_the_moe`): at the first step rank 0 prefills eagerly and waits in
    the layer's all-gather on ``dp:device`` while rank 1, its dummy batch done, waits in the next
    step's DP sync on ``dp:cpu``: a deadlock naming both collectives."""
    plans = (STAGGERED[0], runner_ranks.RankPlan(STAGGERED[1].arrivals, runner_class=_planted_dummy_skipping_the_moe))
    logs = {}
    with pytest.raises(CollectiveDeadlock) as info:
        runner_ranks.run(SPEC, plans, logs=logs)
    message = str(info.value)
    assert "rank 0: pending dp:device#" in message and "all_gather_single(4x1024 bfloat16)" in message
    assert "rank 1: pending dp:cpu#" in message
    assert logs[0].steps == [] and logs[1].steps == ["dummy"]  # rank 0's prefill never ended


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
    assert "flight record" in message and "dp:device" in message  # the MoE layer's last meetings


def test_a_rank_that_keeps_its_own_mode_replays_into_its_peers_eager_collective():
    """tests/ranks/scenario_files/graph_meets_eager.toml's buggy side (vLLM Ascend before PR
    #6011) through the runners: the modes are not synced, so at the first step, where rank 0
    prefills (NONE) and rank 1 runs its idle dummy batch (a uniform decode: FULL), rank 1 pads to
    rank 0's 4 tokens and replays its FULL graph of size 4, and the MoE layer's all-gather of its
    tokens over ``dp`` captured in it meets rank 0's eager one: ``graph_never_meets_eager``,
    naming both sides."""
    plans = tuple(runner_ranks.RankPlan(plan.arrivals, runner_class=_planted_unsynced_mode) for plan in STAGGERED)
    logs = {}
    with pytest.raises(CollectiveMismatch) as info:
        runner_ranks.run(SPEC, plans, logs=logs)
    message = str(info.value)
    assert info.value.rules == ("graph_never_meets_eager",)
    assert "dp:device#" in message and "rank 0: eager, rank 1: graph:graph#1" in message
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


# Dense on purpose (runner_ranks.DENSE_MLP_TP): the finding is about vLLM Ascend's MLP tensor
# parallelism of a dense layer, whose all-gather takes each rank's rows as they are. The MoE
# layer pads its rows to the DP maximum itself (the test after this one).
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
        runner_ranks.run(SPEC, plans, model=runner_ranks.DENSE_MLP_TP)
    assert info.value.rules == ("same_shape",)
    assert "mlptp:device#" in str(info.value) and "rank 0: (3, 1024), rank 1: (5, 1024)" in str(info.value)


def test_two_ranks_prefilling_different_counts_eagerly_meet_in_the_moe_layer_padded_to_the_dp_maximum():
    """The same two prefills of 3 and 5 tokens in a MoE deployment: the runners still run them
    eagerly unpadded (the DP padding is not allowed under local mode NONE), and vLLM Ascend's MoE
    layer pads its tokens and router logits to the DP group's maximum before its all-gather
    (``max_tokens_across_dp``, prepare_finalize.py:439-449@182b75ea) and cuts its reduce-scatter
    back to its own count (:538-540), so both ranks bring 5 rows and serve their requests."""
    plans = (runner_ranks.RankPlan((serving.Arrival(0, "r0", 3, 2),)),
             runner_ranks.RankPlan((serving.Arrival(0, "r1", 5, 2),)))
    result = runner_ranks.run(SPEC, plans)
    assert result.logs[0].steps[0] == "step:NONE:3" and result.logs[1].steps[0] == "step:NONE:5"
    assert len(result.logs[0].tokens["r0"]) == len(result.logs[1].tokens["r1"]) == 2
    assert result.stats.met["dp:device"] > 0
