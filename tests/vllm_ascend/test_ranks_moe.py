"""vLLM Ascend's own fused MoE layer with expert parallelism over two DP ranks, in whole
``NPUModelRunner``s on the fabric (tests/vllm_ascend/runner_ranks.py, model `MOE_EP`).

Each rank holds 2 of the 4 experts of the Qwen2-MoE layer. vLLM Ascend picks the all-gather
method for an EP group of 2 on A2 (ascend_forward_context.py:223-239@182b75ea): the layer
gathers every rank's tokens and router logits over the ``dp`` group, routes them with the
gating top-k, computes what its own experts were chosen for (init routing v2, two grouped
matmuls and swiglu, the weighted un-permute: the facade's MoE kernels) and reduce-scatters the
sums back. The tests give every expert its own weights (the dummy loader fills each rank's
local experts from one seed, so rank 0's experts would equal rank 1's) and the norm before the
layer unit weights (the dummy loader's are about 1e-3, which would leave the layer's output
negligible beside the residual), record each eager call of the layer (its input, router logits
and output on each rank) and hold them against a MoE written here over all four experts; the
decode steps, replayed from FULL graphs, must produce the logits an eager run produces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import harness
import pytest

harness.require()

import torch  # noqa: E402

import runner_ranks  # noqa: E402
import serving  # noqa: E402

EXPERTS, TOP_K = runner_ranks.QWEN2_MOE["num_experts"], runner_ranks.QWEN2_MOE["num_experts_per_tok"]
GRAPHS = serving.RunnerSpec(mode="FULL_DECODE_ONLY", capture_sizes=(1, 4))
EAGER = serving.RunnerSpec(mode="NONE", capture_sizes=(1, 4))
# each rank prefills its own 4-token prompt (different seeds: different routing), then decodes
PLANS = ((serving.Arrival(0, "r0", 4, 4, seed=0),), (serving.Arrival(0, "r1", 4, 4, seed=1),))
TOLERANCE = 3e-2  # of the largest reference value: bf16 rounds each kernel's output (about 4e-3 each)


@dataclass(frozen=True)
class MoeCall:
    """One eager call of the MoE layer on one rank (float32 host copies)."""

    hidden: torch.Tensor  # [tokens, hidden]: this rank's tokens entering the layer
    logits: torch.Tensor  # [tokens, experts]: their router logits
    out: torch.Tensor  # [tokens, hidden]: the layer's routed output for them


@dataclass
class Observed:
    """Every expert's weights (by global expert id), each rank's recorded layer calls and the
    logits of each step that served requests (one row per request)."""

    weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    calls: dict[int, list[MoeCall]] = field(default_factory=dict)
    logits: dict[int, list[torch.Tensor]] = field(default_factory=dict)


def expert_weights(expert: int, hidden: int, intermediate: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Expert ``expert``'s (w13 [hidden, 2*intermediate], w2 [intermediate, hidden]) in the layout
    vLLM Ascend keeps after loading (routed_experts.py:73-83: both transposed)."""
    generator = torch.Generator().manual_seed(1000 + expert)
    w13 = (torch.rand(hidden, 2 * intermediate, generator=generator) - 0.5) * 0.2
    w2 = (torch.rand(intermediate, hidden, generator=generator) - 0.5) * 0.2
    return w13.to(torch.bfloat16), w2.to(torch.bfloat16)


def observing_runner(observed: Observed) -> Callable[[], type]:
    """A runner class (runner_ranks.RankPlan.runner_class) that, once its model is loaded,
    gives each local expert its global id's weights and the norm before the MoE layer unit
    weights, and records the layer's eager calls and the logits vLLM Ascend computes."""

    def make() -> type:
        from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

        class ObservingRunner(NPUModelRunner):
            def load_model(self, *args: Any, **kwargs: Any) -> None:
                super().load_model(*args, **kwargs)
                calls = observed.calls.setdefault(self.dp_rank, [])
                model = self.get_model()
                model.compute_logits = keeping_logits(model.compute_logits, observed.logits.setdefault(self.dp_rank, []))
                for name, module in model.named_modules():
                    if name.endswith("post_attention_layernorm"):
                        module.weight.data.fill_(1.0)
                for layer in model.modules():
                    routed = getattr(layer, "routed_experts", None)
                    if routed is None or not hasattr(layer, "_forward_impl"):
                        continue
                    local, hidden, double = routed.w13_weight.shape
                    for index in range(local):  # linear placement: rank r holds r*local .. (r+1)*local-1
                        expert = layer.moe_config.ep_rank * local + index
                        w13, w2 = expert_weights(expert, hidden, double // 2)
                        routed.w13_weight.data[index].copy_(w13.to(routed.w13_weight.device))
                        routed.w2_weight.data[index].copy_(w2.to(routed.w2_weight.device))
                        observed.weights[expert] = (w13.float(), w2.float())
                    layer._forward_impl = recording(layer._forward_impl, calls)

        return ObservingRunner

    return make


def recording(forward: Callable[..., Any], calls: list[MoeCall]) -> Callable[..., Any]:
    """``AscendMoERunner._forward_impl`` (called by vLLM's ``moe_forward`` op, moe_runner.py:
    115-127) that also keeps each eager call (inside a capture nothing has values yet)."""

    def forward_and_record(hidden_states: torch.Tensor, router_logits: torch.Tensor, *rest: Any) -> Any:
        out = forward(hidden_states, router_logits, *rest)
        if not torch.npu.is_current_stream_capturing():
            calls.append(MoeCall(hidden_states.float().cpu(), router_logits.float().cpu(), out.float().cpu()))
        return out

    return forward_and_record


def keeping_logits(compute_logits: Callable[..., Any], kept: list[torch.Tensor]) -> Callable[..., Any]:
    """The model's ``compute_logits`` (called eagerly after each forward, graph or not) that
    keeps each result of a step's requests (float32 host copies)."""

    def compute_and_keep(*args: Any, **kwargs: Any) -> Any:
        logits = compute_logits(*args, **kwargs)
        if logits is not None and not torch.npu.is_current_stream_capturing():
            kept.append(logits.float().cpu())
        return logits

    return compute_and_keep


def reference_moe(call: MoeCall, weights: dict[int, tuple[torch.Tensor, torch.Tensor]],
                  experts: range = range(EXPERTS)) -> torch.Tensor:
    """Each token: over its top-k softmax experts among ``experts``, p * w2(silu(gate) * up)
    (Qwen2-MoE with norm_topk_prob False), in float32."""
    probs = torch.softmax(call.logits, dim=-1)
    chosen_p, chosen = probs.topk(TOP_K, dim=-1)
    out = torch.zeros_like(call.out)
    for token in range(call.hidden.shape[0]):
        for p, expert in zip(chosen_p[token].tolist(), chosen[token].tolist()):
            if expert in experts:
                w13, w2 = weights[expert]
                gate, up = (call.hidden[token] @ w13).chunk(2)
                out[token] += p * ((torch.nn.functional.silu(gate) * up) @ w2)
    return out


def close(out: torch.Tensor, want: torch.Tensor) -> bool:
    return bool((out - want).abs().max() <= TOLERANCE * want.abs().max())


def serve(spec: serving.RunnerSpec, observed: Observed) -> runner_ranks.RankRun:
    plans = tuple(runner_ranks.RankPlan(arrivals, runner_class=observing_runner(observed)) for arrivals in PLANS)
    return runner_ranks.run(spec, plans, model=runner_ranks.MOE_EP)


@pytest.fixture(scope="module")
def graphs() -> tuple[runner_ranks.RankRun, Observed]:
    observed = Observed()
    return serve(GRAPHS, observed), observed


def test_each_ranks_moe_output_is_its_tokens_routed_to_the_experts_of_both_ranks(graphs: Any) -> None:
    """On each rank, every eager call of vLLM Ascend's fused MoE layer (the profile and warm-up
    runs, each prefill) outputs the MoE over all four experts for its own tokens, and part of
    it was computed by the other rank: the output differs from its own experts' share."""
    run, observed = graphs
    assert sorted(observed.weights) == list(range(EXPERTS))
    for rank, local in ((0, range(0, 2)), (1, range(2, 4))):
        calls = observed.calls[rank]
        prefills = [call for call in calls if call.hidden.shape[0] == 4 and call.hidden.abs().sum() > 0]
        assert calls and prefills, f"rank {rank} recorded no eager prefill of the MoE layer"
        for call in calls:
            assert close(call.out, reference_moe(call, observed.weights)), f"rank {rank}: the MoE output is off"
        chosen = torch.softmax(prefills[-1].logits, -1).topk(TOP_K, -1).indices
        remote = [e for e in chosen.reshape(-1).tolist() if e not in local]
        assert remote, f"rank {rank}'s prompt routed no token to the other rank's experts"
        assert not close(prefills[-1].out, reference_moe(prefills[-1], observed.weights, local))
    # the layer's gather and reduce-scatter met on the dp group, eagerly and in the replays
    assert run.stats.met["dp:device"] > 0
    assert [step for step in run.logs[0].steps if step.startswith("step")][:2] == ["step:NONE:4", "step:FULL:1"]


def test_the_replayed_decode_steps_compute_the_logits_an_eager_run_computes(graphs: Any) -> None:
    """The decode steps replay FULL graphs holding the MoE's kernels and collectives; each rank's
    logits of every step (its prefill, eager in both runs, and three decodes) and its tokens
    equal those of a run without graphs (mode NONE), the same weights everywhere."""
    run, observed = graphs
    eager_observed = Observed()
    eager = serve(EAGER, eager_observed)
    assert not eager.logs[0].graphs
    for rank in (0, 1):
        assert run.logs[rank].graphs == {"graph#1": "FULL:4", "graph#2": "FULL:1"}
        replayed = [logits for logits in observed.logits[rank] if logits.shape[0] == 1]
        eagerly = [logits for logits in eager_observed.logits[rank] if logits.shape[0] == 1]
        assert len(replayed) == len(eagerly) == 4
        for step, (graph_logits, eager_logits) in enumerate(zip(replayed, eagerly)):
            assert close(graph_logits, eager_logits), f"rank {rank}, step {step}: the logits differ"
        assert run.logs[rank].tokens == eager.logs[rank].tokens
