"""An idle DP rank's dummy batches and the prefix cache, through two whole ``NPUModelRunner``s
(tests/vllm_ascend/runner_ranks.py; docs/vllm-ascend.md, "What runs").

An idle rank runs ``execute_dummy_batch`` (worker.py:1048-1051@182b75ea) while its peer
decodes; the DP sync gives both ranks the peer's mode, FULL, so the idle rank replays a FULL
graph whose KV write (``npu_scatter_pa_kv_cache``) reads the slot-mapping buffer of KV-cache
group 0 (``_get_block_table_and_slot_mapping``, model_runner_v1.py:2882-2915). A dummy batch
does not go through ``_prepare_inputs``: that buffer still holds the slots of the rank's last
real step, except the padding past the dummy's one token, which the metadata builder sets to
-1 (:2904). vLLM Ascend therefore sets the whole buffer to -1 after building the dummy
batch's metadata when it is not capturing (model_runner_v1.py:3326-3329,
vllm-project/vllm-ascend#11774). Without that, the dummy token's K and V land in the first
slot of the last real step: a block that prefix caching may hand to the next request with the
same prompt.

The set-up the test needs to see it, and why:

* the last real step is the second chunk of a 386-token prompt (vLLM's scheduler chunks it at
  the 256-token budget), so the stale slot is position 256, inside the prompt's third block
  (positions 256-383), a full block that prefix caching keeps;
* two layers (`TWO_LAYERS`): the dummy batch takes its input ids and positions from the same
  stale buffers, so the first layer's K and V, which depend only on the token and its
  position, are rewritten unchanged; the second layer's depend on the first layer's
  attention, which in the dummy batch reads one slot of block 0 (its block-table row is 0)
  instead of the prompt's 257 positions;
* weights of a trained model's scale (`scaled_weights`): vLLM's dummy loader fills every
  weight, the RMS norms' included, with values of about 1e-3, which leaves the attention's
  share of the residual below bf16's resolution: the overwritten K and V would differ from
  the real ones in the last bit and change no logit.
"""

from __future__ import annotations

from typing import Any

import harness

harness.require()

import torch  # noqa: E402

import runner_ranks  # noqa: E402
import serving  # noqa: E402

SPEC = serving.RunnerSpec(mode="FULL_DECODE_ONLY", capture_sizes=(4,))
TWO_LAYERS = runner_ranks.RankModel("Qwen2-MoE, two layers, expert parallel",
                                    {**runner_ranks.QWEN2_MOE, "num_hidden_layers": 2}, expert_parallel=True)
PROMPT = 386  # chunks of 256 and 130 tokens (module docstring)
WEIGHT_SCALE = 20.0  # the dummy loader's uniform +-1e-3 becomes +-2e-2


def scaled_weights() -> type:
    """vLLM Ascend's ``NPUModelRunner`` whose model, once loaded (before ``capture_model``),
    has unit RMS-norm weights and every other weight of the dummy loader times
    `WEIGHT_SCALE` (module docstring). Only the weights change; the runner is vLLM Ascend's."""
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    class ScaledWeightsRunner(NPUModelRunner):
        def load_model(self, *args: Any, **kwargs: Any) -> None:
            super().load_model(*args, **kwargs)
            for name, parameter in self.get_model().named_parameters():
                if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                    parameter.data.fill_(1.0)
                else:
                    parameter.data.mul_(WEIGHT_SCALE)

    return ScaledWeightsRunner


def test_a_prompt_served_again_from_the_prefix_cache_after_an_idle_ranks_dummy_batches_gets_the_same_logits():
    """Rank 1 serves request ``a`` (386 tokens, one generated) in two chunks, then is idle for
    three steps while rank 0 decodes two requests: its dummy batches replay the FULL graph of 4
    tokens beside rank 0's. Then ``b`` arrives on rank 1 with ``a``'s prompt: the prefix cache
    serves its first 384 tokens (three blocks, the third holding the last chunk's first slot)
    and only 2 are computed. ``b``'s logits and token must be ``a``'s, bitwise: the same prompt,
    greedy. Reverting vllm-project/vllm-ascend#11774 lets the dummy batches write into position
    256 of the cached prompt, and ``b``'s logits differ."""
    plans = (
        runner_ranks.RankPlan((serving.Arrival(0, "r0a", 4, 10, seed=1), serving.Arrival(0, "r0b", 4, 10, seed=2)),
                              runner_class=scaled_weights),
        runner_ranks.RankPlan((serving.Arrival(0, "a", PROMPT, 1, seed=7), serving.Arrival(5, "b", PROMPT, 1, seed=7)),
                              runner_class=scaled_weights),
    )
    result = runner_ranks.run(SPEC, plans, model=TWO_LAYERS)
    rank0, rank1 = result.logs[0], result.logs[1]
    # rank 1: a's two chunks, three idle steps, b's 2 tokens after a prefix-cache hit of 384
    assert rank1.steps[:6] == ["step:NONE:256", "step:NONE:130", "dummy", "dummy", "dummy", "step:NONE:2"]
    # the DP sync gives both ranks one mode: rank 1's dummy batches were replays of FULL:4 too
    assert rank0.steps[2:5] == ["step:FULL:4"] * 3
    served_a = [record for record in rank1.records if record.scheduled == {"a": PROMPT - 256}]
    served_b = [record for record in rank1.records if "b" in record.scheduled]
    assert len(served_a) == 1 and [record.scheduled for record in served_b] == [{"b": 2}]
    assert torch.equal(served_b[0].logits, served_a[0].logits), (
        "b, served from a's cached blocks, computed other logits than a: "
        f"largest difference {(served_b[0].logits.float() - served_a[0].logits.float()).abs().max().item()}")
    assert rank1.tokens["b"] == rank1.tokens["a"]
