"""vLLM Ascend's loop of draft forwards, unmodified, on simulated DP ranks (issue 36 item 2:
tests/ranks/scenario_files/draft_steps_differ.toml through vLLM Ascend's code).

Two DP ranks of the tiny MoE model with expert parallelism (tests/vllm_ascend/dp_ranks.py), an
MTP drafter with 3 speculative tokens (the proposer holds the count; the ranks' ``VllmConfig``
has no ``SpeculativeConfig``, so the target's decision sees a uniform decode of 1 token). Each engine step, each rank runs vLLM Ascend's batch
decision (``_determine_batch_execution_and_padding``, its DP sync on the DP CPU group), the
target model's MoE layer, then the drafter:

* a rank with requests runs what ``_propose`` does from its DP sync on
  (spec_decode/llm_base_proposer.py:813-817 and 992-1026 @182b75ea): the drafter's DP sync
  (``_sync_metadata_across_dp(is_draft_model=True)``), ``set_ascend_forward_context`` and
  ``_run_merged_draft`` with ``is_prefill`` telling whether the batch has a prefill. Those three
  calls are upstream code; their order and arguments are re-stated here because the rest of
  ``_propose`` builds the drafter's attention metadata with the draft attention group's
  metadata builder (``build_draft_attn_metadata``, 2123-2163: ``builder.build(0, ...,
  self.runner.get_model())``, then ``attn_update_stack_num_spec_norm`` per draft step), which
  needs the runner's KV-cache groups and a loaded model: a whole runner;
* an idle rank runs ``dummy_run`` itself, unmodified (its attention metadata is built only for
  FULL graphs, 566-650, and this drafter is eager).

``_run_merged_draft`` (1044-1338) is the loop that decides how many draft forwards a rank runs;
its forward is reduced to the MTP layer's MoE collectives on the EP group
(`dp_ranks.MoeDraftLayer`). The buggy side is vLLM Ascend before PR #12036 ("Fix the issue of
DCP and DP services getting stuck", merged): under DCP a rank whose batch had a prefill ran
draft step 0 only, while an idle peer's ``dummy_run`` (no ``is_prefill``) ran all three, so the
peer's second draft forward waited in the EP all-gather while the rank waited in the next step's
DP sync. 182b75ea has the fix (the branch is gone since #12592), so the buggy side is a planted
variant re-inserting the pre-#12036 condition (`dp_ranks.proposer_before_12036`).
"""

from __future__ import annotations

import itertools

import harness
import pytest

harness.require()

import dp_ranks  # noqa: E402
import torch  # noqa: E402
import vllm_ascend.ops  # noqa: E402,F401  (model_runner_v1's imports need vllm_ascend.ops loaded first)
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.forward_context import get_forward_context  # noqa: E402
from vllm_ascend.ascend_forward_context import set_ascend_forward_context  # noqa: E402

from ascendgraph.errors import CollectiveDeadlock  # noqa: E402
from ascendgraph.parallel.layout import ParallelLayout  # noqa: E402
from sim.vllm_ranks import VllmRanks  # noqa: E402


pytestmark = pytest.mark.usefixtures("fresh_simulated_npu")

K = 3  # num_speculative_tokens: the thread of #12036 (mtp=3, one request)
# vllm_ascend/utils.py is_hierarchical_communication_enabled: the DP all-reduce runs (two EP
# ranks do not take the MC2 skip path anyway: A2's MC2 needs 16).
HIERARCHICAL = {"HCCL_INTRA_ROCE_ENABLE": "0", "HCCL_INTRA_PCIE_ENABLE": "1"}
PREFILL = ("prefill", dp_ranks.Batch((5,)))  # one request's prompt of 5 tokens
DECODE = ("decode", dp_ranks.Batch((1,)))
IDLE = ("idle", dp_ranks.IDLE_RANK_DUMMY)  # NPUWorker.execute_dummy_batch (worker.py:1048-1051)
# #12036's thread: one request; rank 0 serves it (prefill, then a decode), rank 1 is idle.
ONE_REQUEST = {0: [PREFILL, DECODE], 1: [IDLE, IDLE]}


def _propose(proposer, batch: dp_ranks.Batch, *, is_prefill: bool) -> torch.Tensor:
    """``_propose`` from its DP sync on, for an eager drafter (module docstring): the sync
    (llm_base_proposer.py:813-817), the forward context (992-1004) and the loop (1005-1026).
    The per-step attention metadata is empty: the reduced drafter has no attention layer."""
    tokens = sum(batch.query_lens)
    num_input_tokens, across, _ = proposer.runner._sync_metadata_across_dp(tokens, is_draft_model=True)
    last_tokens = torch.tensor(list(itertools.accumulate(batch.query_lens)), dtype=torch.int32) - 1  # :765-766
    steps_metadata: list[dict] = [{} for _ in range(K)]
    with set_ascend_forward_context(None, proposer.vllm_config, num_tokens=num_input_tokens,
                                    num_tokens_across_dp=across, num_actual_tokens=tokens, batch_descriptor=None,
                                    aclgraph_runtime_mode=CUDAGraphMode.NONE, is_draft_model=True,
                                    draft_attn_metadatas=steps_metadata):
        get_forward_context().moe_layer_index = 0
        return proposer._runnable(num_input_tokens=num_input_tokens, batch_size=len(batch.query_lens),
                                  token_indices_to_sample=last_tokens,
                                  target_positions=proposer._get_positions(num_input_tokens), inputs_embeds=None,
                                  multi_steps_attn_metadata=steps_metadata, num_tokens=tokens, is_prefill=is_prefill)


def _serve(steps, *, dcp_size: int, proposer_class=None):
    """Every rank runs its steps (module docstring); per rank, the draft forwards of each step
    and the draft tokens a serving step returned; the fabric's stats."""
    configs = dp_ranks.rank_configs(2, "FULL_DECODE_ONLY")
    ranks = VllmRanks(ParallelLayout(dp=2))
    got: dict[int, list] = {}

    def body(rank):
        runner = dp_ranks.draft_runner(configs[rank], dcp_size=dcp_size)
        model = dp_ranks.MoeDraftLayer(ranks, configs[rank])
        proposer = dp_ranks.draft_proposer(runner, model, num_speculative_tokens=K, proposer_class=proposer_class)
        got[rank] = []
        for kind, batch in steps[rank]:
            with torch.inference_mode():  # execute_model, sample_tokens, _dummy_run (model_runner_v1.py:1776, 2197, 3138)
                got[rank].append(_step(ranks, configs[rank], runner, proposer, kind, batch))

    with harness.environment(**HIERARCHICAL), dp_ranks.process_state(configs[0]), dp_ranks.rank_forward_contexts():
        stats = ranks.run(body)
    return got, stats


def _step(ranks, config, runner, proposer, kind, batch):
    """One engine step of one rank: the batch decision, the target's MoE layer, the drafter;
    (draft forwards, the shape of the draft tokens or None for a dummy run)."""
    mode, descriptor, across = batch.decide(runner)
    dp_ranks.moe_layer(ranks, config, mode, descriptor, across)  # the target model's MoE layer
    before = proposer.model.forwards
    if kind == "idle":  # model_runner_v1.py:3419-3429
        drafted = proposer.dummy_run(num_tokens=descriptor.num_tokens, num_reqs=1, num_tokens_across_dp=across,
                                     aclgraph_runtime_mode=mode)
    else:
        drafted = _propose(proposer, batch, is_prefill=kind == "prefill")
    return proposer.model.forwards - before, None if drafted is None else tuple(drafted.shape)


def test_the_snapshot_runs_every_draft_forward_on_every_rank():
    """draft_steps_differ, fixed side, through vLLM Ascend's code at 182b75ea: under DCP, the
    serving rank's prefill step and the idle rank's ``dummy_run`` both run 3 draft forwards, so
    the drafter's EP collectives meet (per step: the target decision's and the drafter's DP
    syncs, the target's MoE layer and 3 draft forwards, each an all-gather and a
    reduce-scatter on the EP group)."""
    got, stats = _serve(ONE_REQUEST, dcp_size=2)
    assert got[0] == [(K, (1, K)), (K, (1, K))] and got[1] == [(K, None), (K, None)]
    assert stats.met["dp:cpu"] == 2 * 2 and stats.met["ep:device"] == 2 * 2 * (1 + K)


def test_before_12036_a_dcp_prefill_runs_one_draft_forward_and_the_ranks_deadlock():
    """draft_steps_differ, buggy side: the planted pre-#12036 branch (dp_ranks.PRE_12036_CONDITION)
    returns after draft step 0 on the rank whose batch has a prefill under DCP; the idle rank's
    ``dummy_run`` passes no ``is_prefill`` and runs all 3. Rank 1's second draft forward waits
    in the EP all-gather while rank 0 has gone on to the next step's DP sync."""
    with pytest.raises(CollectiveDeadlock) as info:
        _serve(ONE_REQUEST, dcp_size=2, proposer_class=dp_ranks.proposer_before_12036())
    message = str(info.value)
    assert "rank 0 waits in dp:cpu#2 all_reduce.sum(2x2 int32)" in message, message
    assert "rank 1 waits in ep:device#4 all_gather_single(5x256 bfloat16)" in message, message
    # the flight record: both ranks completed the target's layer and draft step 0 (ep:device#0-3)
    assert message.count("| ep:device#3 reduce_scatter_single.sum(10x256 bfloat16) eager") == 2, message


@pytest.mark.parametrize("dcp_size, steps, expected", [
    (1, ONE_REQUEST, {0: [(K, (1, K)), (K, (1, K))], 1: [(K, None), (K, None)]}),
    (2, {0: [PREFILL, DECODE], 1: [PREFILL, DECODE]}, {0: [(1, (1, K)), (K, (1, K))], 1: [(1, (1, K)), (K, (1, K))]}),
], ids=["without_dcp", "both_ranks_prefill"])
def test_before_12036_the_ranks_meet_when_both_take_the_same_branch(dcp_size, steps, expected):
    """The pre-#12036 branch hangs only with the inputs of its thread: without DCP no rank takes
    it; when both ranks have a prefill both take it (one draft forward each, step 0's tokens
    repeated), then both run the decode's three."""
    got, _ = _serve(steps, dcp_size=dcp_size, proposer_class=dp_ranks.proposer_before_12036())
    assert got == expected


def test_each_rank_thread_has_its_own_forward_context():
    """`dp_ranks.rank_forward_contexts`: both ranks inside vLLM's ``override_forward_context``
    at once (a DP all-reduce between entering and reading) each read their own; afterwards
    vLLM's functions are its own again (the main thread has none)."""
    from types import SimpleNamespace

    from vllm.forward_context import get_forward_context, is_forward_context_available, override_forward_context

    ranks = VllmRanks(ParallelLayout(dp=2))
    seen = {}

    def body(rank):
        mine = SimpleNamespace(rank=rank)
        with override_forward_context(mine):
            torch.distributed.all_reduce(torch.zeros(1), group=ranks.group("dp").cpu_group)
            own = get_forward_context() is mine
        seen[rank] = (own, is_forward_context_available())

    with dp_ranks.rank_forward_contexts():
        ranks.run(body)
    assert seen == {0: (True, False), 1: (True, False)}
    assert not is_forward_context_available() and "_RANK_FORWARD_CONTEXT" not in get_forward_context.__globals__
