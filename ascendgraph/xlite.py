"""XliteGraph: configuration checks and the architecture registry (docs/semantics.md §11).

XliteGraph is an alternative graph path: batches that fit xlite's preallocated token
budget run on the xlite runtime, larger ones on the native runnable (ACLGraph or eager).
This module owns the validation and the supported-architecture table; routing and the
budget sit beside them.

Upstream sources (docs/semantics.md §11 gives the citations; "Known differences" there lists
where ascendgraph departs from vLLM Ascend):

* the two error texts and the recommended block size 128: vLLM Ascend
  `vllm_ascend/ascend_config.py`, `XliteGraphConfig`;
* the architecture registry: the adapters of `vllm_ascend/xlite/xlite.py`;
* the full-mode budget (batched tokens rounded up to tp): `StandardXliteModel._build_model_config`
  (`max_m`) in the same file; the decode-only budget `max_num_seqs * (1 + k)` is ascendgraph's
  (vLLM Ascend sizes `max_m` at `max_num_seqs` and routes on the attention state).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, Optional, Protocol, Sequence, Union

from ascendgraph.errors import XliteBudgetExceeded, XliteConfigError

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from ascendgraph.config import GraphConfig
    from ascendgraph.forward_context import ForwardContext

__all__ = [
    "XLITE_ARCHITECTURES",
    "XLITE_SPEC_DECODE_ERROR",
    "XLITE_PIPELINE_PARALLEL_ERROR",
    "XLITE_BLOCK_SIZE",
    "validate_xlite",
    "xlite_token_budget",
    "XliteRoute",
    "XliteRouter",
    "ROUTING_RULES",
    "XliteRuntimeSpec",
    "XliteRuntime",
    "XliteBudgetExceeded",
    "XliteProfileRun",
    "check_within_budget",
    "describe_xlite",
]

XLITE_SPEC_DECODE_ERROR = "Xlite graph mode only support speculative decoding with num_speculative_tokens=1."
XLITE_PIPELINE_PARALLEL_ERROR = (
    "Xlite graph mode is not compatible with pipeline parallelism. Please set pipeline_parallel_size to 1."
)
XLITE_BLOCK_SIZE = 128  # the block size XliteGraphConfig recommends (vLLM Ascend warns otherwise)
XLITE_FULL_MODE_DISABLES_ACLGRAPH = "ACLGraph has been disabled when speculation is disabled in xlite full mode"
XLITE_DECODE_ONLY_FALLBACK = "Falling back to FULL_DECODE_ONLY under xlite decode-only mode"

# Architectures the xlite adapter registers (config.json "architectures"), by model family.
XLITE_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "Llama dense",
    "Qwen2ForCausalLM": "Qwen dense",
    "Qwen3ForCausalLM": "Qwen dense",
    "Qwen3VLForConditionalGeneration": "Qwen3-VL",
    "Qwen3MoeForCausalLM": "Qwen MoE",
    "Qwen3VLMoeForConditionalGeneration": "Qwen3-VL MoE",
    "Glm4MoeForCausalLM": "GLM-4 MoE",
    "DeepseekV3ForCausalLM": "DeepSeek-V3 class MoE",
    "DeepseekV32ForCausalLM": "DeepSeek-V3.2 class MoE",
    "GlmMoeDsaForCausalLM": "GLM-5 / GLM-5.1",
    "MiniMaxM2ForCausalLM": "MiniMax-M2",
}


def unsupported_architecture_message(architecture: str) -> str:
    return f"{architecture} not supported!"


def validate_xlite(config: "GraphConfig") -> list[str]:
    """Raise XliteConfigError for impossible xlite configs; return the warnings for doubtful ones."""
    warnings: list[str] = []
    if not config.xlite_graph_config.enabled:
        return warnings
    if config.num_speculative_tokens and config.num_speculative_tokens != 1:
        raise XliteConfigError(XLITE_SPEC_DECODE_ERROR, key="num_speculative_tokens")
    if config.pipeline_parallel_size > 1:
        raise XliteConfigError(XLITE_PIPELINE_PARALLEL_ERROR, key="pipeline_parallel_size")
    architecture = config.model.architecture
    if architecture not in XLITE_ARCHITECTURES:
        raise XliteConfigError(unsupported_architecture_message(architecture), key="architecture")
    if config.block_size != XLITE_BLOCK_SIZE:
        warnings.append(
            f"Xlite graph mode is tuned for block_size {XLITE_BLOCK_SIZE}; block_size={config.block_size} "
            "may perform worse or be rejected by the xlite runtime"
        )
    return warnings


# --------------------------------------------------------------------------- budget and routing
# Theory of operation. xlite preallocates a hidden-state workspace for a fixed number of
# tokens (the budget). Every batch is routed by its token count — the maximum over the
# data-parallel ranks, since all ranks must take the same path — to the xlite runtime
# when it fits, otherwise to the native runnable (ACLGraph replay or eager).

XliteRouteName = Literal["xlite", "native"]
XLITE: Final = "xlite"
NATIVE: Final = "native"


def xlite_token_budget(
    *,
    full_mode: bool,
    max_num_seqs: int,
    num_speculative_tokens: int = 0,
    max_num_batched_tokens: int = 8192,
    tensor_parallel_size: int = 1,
) -> int:
    """Tokens xlite preallocates: decode-only = seqs x (1 + k); full = batched tokens rounded up to tp.

    Full mode follows vLLM Ascend's `max_m` (docs/semantics.md §11); decode-only is ascendgraph's
    rule (see "Known differences" there).
    """
    if full_mode:
        tp = max(1, tensor_parallel_size)
        return ((max_num_batched_tokens + tp - 1) // tp) * tp
    return max_num_seqs * (1 + num_speculative_tokens)


@dataclass(frozen=True)
class XliteRoute:
    """Where one batch runs and why."""

    route: XliteRouteName
    reason: str
    num_tokens: int


@dataclass(frozen=True)
class XliteRouter:
    """The per-batch routing rules of docs/semantics.md §11 for one configuration."""

    full_mode: bool
    budget: int
    data_parallel_size: int = 1

    @classmethod
    def from_config(cls, config: "GraphConfig") -> "XliteRouter":
        xcfg = config.xlite_graph_config
        return cls(
            full_mode=xcfg.full_mode,
            budget=xlite_token_budget(
                full_mode=xcfg.full_mode,
                max_num_seqs=config.max_num_seqs,
                num_speculative_tokens=config.num_speculative_tokens,
                max_num_batched_tokens=config.max_num_batched_tokens,
                tensor_parallel_size=config.tensor_parallel_size,
            ),
            data_parallel_size=config.data_parallel_size,
        )

    @property
    def mode_name(self) -> str:
        return "full" if self.full_mode else "decode-only"

    def route(
        self,
        num_tokens: Union[int, Sequence[int]],
        *,
        num_reqs: int,
        has_prefill: bool = False,
        is_profile_run: bool = False,
    ) -> XliteRoute:
        """Route a batch. ``num_tokens`` may be one count or the per-DP-rank counts (max is used)."""
        if isinstance(num_tokens, (list, tuple)):
            counts = list(num_tokens)
        else:
            counts = [num_tokens]
        if not counts or any(isinstance(c, bool) or not isinstance(c, int) or c < 0 for c in counts):
            raise ValueError(f"num_tokens must be a non-negative integer or a non-empty list of them, got {num_tokens!r}")
        if num_reqs < 0:
            raise ValueError(f"num_reqs must be >= 0, got {num_reqs}")
        tokens = max(counts)
        across = f" (max over {len(counts)} DP ranks)" if len(counts) > 1 else ""
        for rule in ROUTING_RULES:
            decided = rule(self, tokens, num_reqs, has_prefill, is_profile_run, across)
            if decided is not None:
                return decided
        raise AssertionError("routing rules must end with a catch-all")  # pragma: no cover


def _rule_profile_run(r: XliteRouter, tokens: int, reqs: int, prefill: bool, profile: bool,
                      across: str) -> Optional[XliteRoute]:
    if profile and r.full_mode:
        return XliteRoute(XLITE, "profile run in xlite full mode: xlite returns its preallocated hidden-state buffer", tokens)
    return None


def _rule_over_budget(r: XliteRouter, tokens: int, reqs: int, prefill: bool, profile: bool,
                      across: str) -> Optional[XliteRoute]:
    if tokens > r.budget:
        return XliteRoute(NATIVE, f"{tokens} tokens{across} exceed the xlite {r.mode_name} budget of {r.budget}", tokens)
    return None


def _rule_decode_only_data_parallel(r: XliteRouter, tokens: int, reqs: int, prefill: bool, profile: bool,
                                    across: str) -> Optional[XliteRoute]:
    if not r.full_mode and r.data_parallel_size > 1 and tokens > reqs:
        return XliteRoute(
            NATIVE,
            f"decode-only xlite with data parallelism (dp={r.data_parallel_size}) takes only batches with at most one "
            f"token per request; {tokens} tokens{across} for {reqs} requests",
            tokens,
        )
    return None


def _rule_within_budget(r: XliteRouter, tokens: int, reqs: int, prefill: bool, profile: bool,
                        across: str) -> Optional[XliteRoute]:
    kind = "prefill" if prefill else "decode"
    return XliteRoute(XLITE, f"{kind} batch of {tokens} tokens{across} fits the xlite {r.mode_name} budget of {r.budget}", tokens)


# In order; the first rule that decides wins (docs/semantics.md §11).
ROUTING_RULES = (
    _rule_profile_run,
    _rule_over_budget,
    _rule_decode_only_data_parallel,
    _rule_within_budget,
)


# --------------------------------------------------------------------------- the runtime behind the device
# The engine never talks to xlite directly: it asks its device for a runtime
# (``device.xlite_runtime(model, spec)``): the simulator's stand-in (sim/xlite.py) or the
# adapter over the ``xlite`` package (hw/xlite.py). A runtime owns a hidden-state buffer of
# ``spec.budget`` rows, allocated once; every forward writes the batch's hidden states into
# its first rows and returns that view. The router keeps batches over the budget away from
# it; a runtime that receives one anyway raises `XliteBudgetExceeded` (a broken invariant,
# not a user error).


@dataclass(frozen=True)
class XliteRuntimeSpec:
    """What a device needs to build the xlite runtime of one engine."""

    budget: int  # rows of the preallocated hidden-state buffer (xlite_token_budget)
    full_mode: bool
    hidden_size: int
    dtype: Any  # torch.dtype of the hidden states
    max_num_seqs: int
    max_model_len: int
    block_size: int
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    enable_expert_parallel: bool = False
    architecture: str = ""

    @classmethod
    def from_config(cls, config: "GraphConfig", *, dtype: Any) -> "XliteRuntimeSpec":
        router = XliteRouter.from_config(config)
        return cls(
            budget=router.budget,
            full_mode=router.full_mode,
            hidden_size=config.model.hidden_size,
            dtype=dtype,
            max_num_seqs=config.max_num_seqs,
            max_model_len=config.model.max_position_embeddings,
            block_size=config.block_size,
            tensor_parallel_size=config.tensor_parallel_size,
            data_parallel_size=config.data_parallel_size,
            enable_expert_parallel=config.enable_expert_parallel,
            architecture=config.model.architecture,
        )


class XliteRuntime(Protocol):
    """An xlite runtime bound to one model (what `Device.xlite_runtime` returns)."""

    spec: XliteRuntimeSpec
    hidden_states: "torch.Tensor"  # [spec.budget, spec.hidden_size], allocated once

    def forward(self, input_ids: "torch.Tensor", positions: "torch.Tensor", context: "ForwardContext") -> "torch.Tensor":
        """Run the whole model for one batch; return ``hidden_states[:num_tokens]`` (a view of the buffer).

        ``context`` carries the attention metadata and the KV caches the runtime shares with
        the native runnable. Raises `XliteBudgetExceeded` for more tokens than the budget.
        """
        ...

    def profile_run(self) -> "torch.Tensor":
        """A profile run in full mode: no forward, the preallocated buffer itself (docs/semantics.md §11)."""
        ...


def check_within_budget(num_tokens: int, budget: int) -> None:
    """The runtime-side guard: raise `XliteBudgetExceeded` naming both figures."""
    if num_tokens > budget:
        raise XliteBudgetExceeded(
            f"xlite runtime got a batch of {num_tokens} tokens but its hidden-state buffer holds {budget}; "
            "batches over the xlite budget must be routed to the native runnable (XliteRouter.route)"
        )


@dataclass(frozen=True)
class XliteProfileRun:
    """The start-up profile run of xlite full mode (a dummy batch of max_num_batched_tokens)."""

    num_tokens: int
    route: XliteRouteName
    reason: str
    buffer_tokens: Optional[int]  # rows of the buffer returned (xlite route), None when it ran native

    def as_dict(self) -> dict[str, Any]:
        return {"num_tokens": self.num_tokens, "route": self.route, "reason": self.reason,
                "buffer_tokens": self.buffer_tokens}


# --------------------------------------------------------------------------- explain
def describe_xlite(config: "GraphConfig") -> Optional[dict[str, Any]]:
    """The xlite settings of a config for `ascendgraph explain` (None when xlite is off)."""
    if not config.xlite_graph_config.enabled:
        return None
    router = XliteRouter.from_config(config)
    if router.full_mode:
        tp = config.tensor_parallel_size
        rule = f"max_num_batched_tokens {config.max_num_batched_tokens} rounded up to a multiple of tp {tp}"
    else:
        rule = f"max_num_seqs {config.max_num_seqs} x (1 + num_speculative_tokens {config.num_speculative_tokens})"
    routing = []
    if router.full_mode:
        routing.append("profile runs -> xlite (it returns its preallocated hidden-state buffer)")
    across = " (max over the DP ranks)" if router.data_parallel_size > 1 else ""
    routing.append(f"batches over {router.budget} tokens{across} -> native")
    if not router.full_mode and router.data_parallel_size > 1:
        routing.append(
            f"more tokens than requests (prefill, mixed, speculative decode) with dp={router.data_parallel_size} -> native"
        )
    routing.append("every other batch, prefill or decode -> xlite")
    return {
        "enabled": True,
        "full_mode": router.full_mode,
        "mode": router.mode_name,
        "budget": router.budget,
        "budget_rule": rule,
        "data_parallel_size": router.data_parallel_size,
        "routing": routing,
    }
