"""Mode resolution: from a GraphConfig to the settings that will really run (docs/semantics.md §3, §4).

Theory of operation. `resolve` threads a mutable working state through a *table of named
rules* (`RULES`), in docs/semantics.md §3's order. A rule that changes something records a
`Decision(rule, before, after, reason)`; warnings users would see in a vLLM Ascend log
are collected verbatim. The result is a frozen `Resolution`: the effective mode, sizes
and kernel flags, plus the trace that explains each of them.

`narrow_for_attention` is vLLM 0.32's attention-support narrowing (docs/semantics.md §4), kept as
its own function so it can be compared with vLLM's implementation directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from ascendgraph.config import GraphConfig
from ascendgraph.errors import LAUNCH_BLOCKING_MESSAGE, ConfigError, GraphModeError
from ascendgraph.models.backends import attention_backend_info
from ascendgraph.modes import AttentionGraphSupport, CompilationMode, GraphMode
from ascendgraph.sizes import (
    DEFAULT_MAX_STREAMS,
    StreamPlan,
    align_sizes_to_tp,
    HCCL_EXPANSION_MODES,
    ascend_default_max_capture_size,
    check_hccl_expansion_mode,
    compute_capture_sizes,
    hccl_expansion_mode_from_env,
    plan_stream_budget,
    round_sizes_for_spec_decode,
    sample_sizes,
)
from ascendgraph.xlite import (
    XLITE_DECODE_ONLY_FALLBACK,
    XLITE_FULL_MODE_DISABLES_ACLGRAPH,
    validate_xlite,
)

__all__ = [
    "Decision",
    "Narrowing",
    "Resolution",
    "narrow_for_attention",
    "resolve",
    "RULES",
    "ASCEND_WARMUPS",
    "A5_MAX_PIECEWISE_SIZES",
]

ASCEND_WARMUPS = 1
A5_MAX_PIECEWISE_SIZES = 4

UNSUPPORTED_COMPILATION_MODE = (
    "NPU does not support compilation mode. mode={mode}, action: setting CUDAGraphMode to NONE."
)
POOLING_FULL_GRAPHS = "Pooling models do not support full cudagraphs. Overriding cudagraph_mode to {new}."
ENCODER_DECODER_FALLBACK = "Encoder-decoder models don't support {mode}, fallback to {new}."
NO_CAPTURE_SIZES = (
    "no capture size remains ({why}): cudagraph_mode={mode} captures nothing and every batch runs eagerly; "
    "choose cudagraph_capture_sizes <= {mnbt} (or raise max_num_batched_tokens)"
)
UNKNOWN_HCCL_EXPANSION_MODE = (
    "HCCL_OP_EXPANSION_MODE={value!r} is not a mode HCCL knows ({known}): HCCL falls back to its default "
    "expansion, so the stream plan assumes FFTS+; export HCCL_OP_EXPANSION_MODE=AIV to fit more capture sizes, "
    "or unset it"
)
CONTEXT_PARALLEL_FULL = (
    "cudagraph_mode={mode} is not sufficiently supported with context parallelism "
    "(prefill_context_parallel_size={pcp}, decode_context_parallel_size={dcp}); full graphs may fail "
    "or run slower. Prefer PIECEWISE if you see problems."
)


@dataclass(frozen=True)
class Decision:
    """One rule that changed the configuration: what it was, what it became, and why."""

    rule: str
    before: str
    after: str
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"rule": self.rule, "before": self.before, "after": self.after, "reason": self.reason}


@dataclass(frozen=True)
class Narrowing:
    """Result of attention narrowing: the mode and sizes that survive, with the messages."""

    mode: GraphMode
    capture_sizes: list[int]
    max_capture_size: int
    messages: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Resolution:
    """The effective graph-mode settings and the trace that produced them."""

    requested_mode: GraphMode
    mode: GraphMode
    compilation_mode: CompilationMode
    capture_sizes: list[int]
    max_capture_size: int
    warmups: int
    attention_split: bool
    npugraph_ex: bool
    static_kernel: bool
    super_kernel: bool
    warnings: list[str]
    decisions: list[Decision]
    config: GraphConfig
    enforce_eager: bool
    attention_backend: str
    attention_support: AttentionGraphSupport
    uniform_decode_query_len: int
    stream_plan: Optional[StreamPlan]
    xlite_enabled: bool = False
    xlite_full_mode: bool = False

    @property
    def effective_mode(self) -> GraphMode:
        return self.mode

    def decision(self, rule: str) -> Optional[Decision]:
        """The first decision recorded by a rule, or None."""
        return next((d for d in self.decisions if d.rule == rule), None)


# --------------------------------------------------------------------------- narrowing


def _support_name(support: AttentionGraphSupport) -> str:
    return f"AttentionCGSupport.{support.name}"


def narrow_for_attention(
    mode: GraphMode,
    support: AttentionGraphSupport,
    *,
    capture_sizes: Sequence[int],
    max_capture_size: int,
    uniform_decode_query_len: int = 1,
    compilation_mode: CompilationMode = CompilationMode.VLLM_COMPILE,
    attention_split: bool = True,
    inductor_partition: bool = False,
    use_v2_model_runner: bool = False,
    piecewise_capture_available: bool = True,
    backend_name: str = "attention",
) -> Narrowing:
    """vLLM 0.32's narrowing of a graph mode to what the attention backends support."""
    mode = GraphMode.parse(mode)
    support = AttentionGraphSupport.parse(support)
    q = uniform_decode_query_len
    p1 = attention_split
    p2 = compilation_mode == CompilationMode.VLLM_COMPILE and (attention_split or inductor_partition)
    sizes = list(capture_sizes)
    max_size = max_capture_size
    messages: list[str] = []

    if mode is GraphMode.NONE:
        return Narrowing(mode, sizes, max_size, messages)

    # Step 2: full graphs for mixed batches need ALWAYS.
    if mode.mixed_mode() is GraphMode.FULL and support != AttentionGraphSupport.ALWAYS:
        opening = (
            f"CUDAGraphMode.{mode.name} is not supported with {backend_name} backend "
            f"(support: {_support_name(support)})"
        )
        if support == AttentionGraphSupport.NEVER:
            raise GraphModeError(
                opening + "; please try cudagraph_mode=PIECEWISE, and make sure compilation mode is VLLM_COMPILE"
            )
        new = GraphMode.FULL_AND_PIECEWISE if p1 else GraphMode.FULL_DECODE_ONLY
        messages.append(f"{opening}; setting cudagraph_mode={new.name}")
        mode = new

    # Step 3: decode full graphs with a NEVER backend.
    if mode.decode_mode() is GraphMode.FULL and support == AttentionGraphSupport.NEVER:
        opening = (
            f"CUDAGraphMode.{mode.name} is not supported with {backend_name} backend "
            f"(support: {_support_name(support)})"
        )
        if p2:
            messages.append(opening + "; setting cudagraph_mode=PIECEWISE because attention is compiled piecewise")
            mode = GraphMode.PIECEWISE
        else:
            messages.append(opening + "; setting cudagraph_mode=NONE because attention is not compiled piecewise")
            mode = GraphMode.NONE

    # Step 4: spec decode (q > 1) needs UNIFORM_BATCH for decode full graphs.
    if mode.decode_mode() is GraphMode.FULL and q > 1 and support < AttentionGraphSupport.UNIFORM_BATCH:
        new = GraphMode.PIECEWISE if p1 else GraphMode.NONE
        messages.append(
            f"CUDAGraphMode.{mode.name} is not supported with spec-decode for attention backend "
            f"{backend_name} (support: {_support_name(support)}); setting cudagraph_mode={new.name}"
        )
        mode = new

    # Step 5: nothing was compiled into piecewise submodules.
    if not piecewise_capture_available and mode.requires_piecewise_compilation():
        new = mode.without_piecewise()
        messages.append(
            f"CUDAGraphMode.{mode.name} needs piecewise graphs but the model offers no compiled piecewise "
            f"submodules (compilation mode {compilation_mode.name}); setting cudagraph_mode={new.name}"
        )
        mode = new

    # Step 6: guard (unreachable after steps 2-3).
    if mode.has_full_graphs() and support == AttentionGraphSupport.NEVER:  # pragma: no cover
        raise GraphModeError(
            f"CUDAGraphMode.{mode.name} is not supported with {backend_name} backend "
            f"(support:{support.name}) ; please try cudagraph_mode=PIECEWISE, and make sure compilation "
            "mode is VLLM_COMPILE"
        )

    # Step 7: spec-decode rounding of the sizes (model runner V1 only).
    if not use_v2_model_runner and mode.decode_mode() is GraphMode.FULL and q > 1:
        sizes, max_size = round_sizes_for_spec_decode(sizes, max_size, query_len=q)
    return Narrowing(mode, sizes, max_size, messages)


# --------------------------------------------------------------------------- pipeline state


@dataclass(frozen=True)
class Capabilities:
    """What the target device can do for graph mode: the SoC's table entry (310P: no
    npugraph_ex / static / super kernel; A5: at most 4 piecewise sizes), narrowed by a
    device profile's capability fields when one is given (a simulator profile, or what hw
    read from the card)."""

    name: str
    npugraph_ex: bool = True
    static_kernel: bool = True
    super_kernel: bool = True
    task_update: bool = True
    max_piecewise_sizes: Optional[int] = None

    @classmethod
    def of(cls, soc: str, profile: Optional[object] = None) -> "Capabilities":
        caps = cls(name=soc, npugraph_ex=soc != "310P", static_kernel=soc != "310P", super_kernel=soc not in NO_SUPER_KERNEL,
                   max_piecewise_sizes=A5_MAX_PIECEWISE_SIZES if soc == "A5" else None)
        if profile is None:
            return caps
        limit = getattr(profile, "max_piecewise_sizes", None)
        limits = [v for v in (caps.max_piecewise_sizes, limit) if v is not None]
        return cls(
            name=str(getattr(profile, "name", soc)),
            npugraph_ex=caps.npugraph_ex and bool(getattr(profile, "supports_npugraph_ex", True)),
            static_kernel=caps.static_kernel and bool(getattr(profile, "supports_static_kernel", True)),
            super_kernel=caps.super_kernel and bool(getattr(profile, "supports_super_kernel", True)),
            task_update=bool(getattr(profile, "supports_task_update", True)),
            max_piecewise_sizes=min(limits) if limits else None,
        )


@dataclass
class _State:
    config: GraphConfig
    env: Mapping[str, str]
    support: AttentionGraphSupport
    backend_name: str
    other_rank_modes: Sequence[GraphMode]
    stream_limit: int
    hccl_op_expansion_mode: Optional[str]
    requested_mode: GraphMode
    mode: Optional[GraphMode]
    compilation_mode: Optional[CompilationMode]
    enforce_eager: bool
    npugraph_ex: bool
    static_kernel: bool
    super_kernel: bool
    capabilities: Capabilities = Capabilities("A2")
    attention_split: bool = False
    capture_sizes: list[int] = field(default_factory=list)
    max_capture_size: int = 0
    warnings: list[str] = field(default_factory=list)
    decisions: list[Decision] = field(default_factory=list)

    def decide(self, rule: str, before: object, after: object, reason: str, *, warn: bool = False) -> None:
        self.decisions.append(Decision(rule, _show(before), _show(after), reason))
        if warn:
            self.warnings.append(reason)

    def set_mode(self, rule: str, new: GraphMode, reason: str, *, warn: bool = True) -> None:
        if self.mode is not new:
            self.decide(rule, self.mode, new, reason, warn=warn)
            self.mode = new

    @property
    def current_mode(self) -> GraphMode:
        assert self.mode is not None
        return self.mode


def _show(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (GraphMode, CompilationMode, AttentionGraphSupport)):
        return value.name
    return str(value)


def _level_default_mode(level: int) -> GraphMode:
    if level >= 2:
        return GraphMode.FULL_AND_PIECEWISE
    if level == 1:
        return GraphMode.PIECEWISE
    return GraphMode.NONE


# --------------------------------------------------------------------------- rules
# Each rule: (name, function(state)). The order is docs/semantics.md §3's.


def _rule_enforce_eager(s: _State) -> None:
    if not s.enforce_eager:
        return
    if s.compilation_mode is not CompilationMode.NONE:
        s.decide("enforce_eager", s.compilation_mode, CompilationMode.NONE,
                 "enforce_eager turns compilation off")
        s.compilation_mode = CompilationMode.NONE
    before = s.requested_mode if s.mode is None else s.mode
    s.mode = GraphMode.NONE
    if before is not GraphMode.NONE:
        s.decide("enforce_eager", before, GraphMode.NONE, "Compilation disabled, using eager mode by default")


def _rule_default_mode(s: _State) -> None:
    level = s.config.optimization_level
    if s.compilation_mode is None:
        default = CompilationMode.VLLM_COMPILE if level > 0 else CompilationMode.NONE
        s.decide("default_compilation_mode", None, default,
                 f"compilation mode not set: optimization level O{level} defaults to {default.name}")
        s.compilation_mode = default
    if s.mode is None:
        default_mode = _level_default_mode(level)
        s.decide("default_mode", None, default_mode,
                 f"cudagraph_mode not set: optimization level O{level} defaults to {default_mode.name}")
        s.mode = default_mode


def _rule_unsupported_compilation_mode(s: _State) -> None:
    if s.compilation_mode in (CompilationMode.NONE, CompilationMode.VLLM_COMPILE):
        return
    message = UNSUPPORTED_COMPILATION_MODE.format(mode=s.compilation_mode.name)  # type: ignore[union-attr]  # this rule runs only when a compilation mode was resolved
    s.decide("unsupported_compilation_mode", s.compilation_mode, CompilationMode.NONE, message, warn=True)
    s.compilation_mode = CompilationMode.NONE


def _rule_piecewise_needs_vllm_compile(s: _State) -> None:
    mode = s.current_mode
    if mode.requires_piecewise_compilation() and s.compilation_mode is not CompilationMode.VLLM_COMPILE:
        s.set_mode(
            "piecewise_needs_vllm_compile",
            GraphMode.NONE,
            f"cudagraph_mode={mode.name} needs piecewise compilation, which only compilation mode "
            f"VLLM_COMPILE provides (compilation mode is {s.compilation_mode.name}); setting cudagraph_mode=NONE",  # type: ignore[union-attr]  # this rule runs only when a compilation mode was resolved
        )


def _rule_xlite(s: _State) -> None:
    xcfg = s.config.xlite_graph_config
    if not xcfg.enabled:
        return
    s.warnings.extend(validate_xlite(s.config))
    if s.enforce_eager:
        return  # enforce_eager wins: nothing is captured
    if xcfg.full_mode and s.config.num_speculative_tokens == 0:
        s.enforce_eager = True
        if s.compilation_mode is not CompilationMode.NONE:
            s.decide("xlite", s.compilation_mode, CompilationMode.NONE, "xlite full mode runs eagerly: compilation off")
            s.compilation_mode = CompilationMode.NONE
        s.set_mode("xlite", GraphMode.NONE, XLITE_FULL_MODE_DISABLES_ACLGRAPH)
    else:
        s.set_mode("xlite", GraphMode.FULL_DECODE_ONLY, XLITE_DECODE_ONLY_FALLBACK)


def _rule_pooling_and_encoder_decoder(s: _State) -> None:
    model = s.config.model
    mode = s.current_mode
    fallback = GraphMode.PIECEWISE if s.compilation_mode is CompilationMode.VLLM_COMPILE else GraphMode.NONE
    if model.is_pooling and mode.has_full_graphs():
        s.set_mode("pooling_model", fallback, POOLING_FULL_GRAPHS.format(new=fallback.name))
    mode = s.current_mode
    if model.is_encoder_decoder and mode not in (GraphMode.NONE, GraphMode.PIECEWISE):
        s.set_mode("encoder_decoder", fallback, ENCODER_DECODER_FALLBACK.format(mode=mode.name, new=fallback.name))


def _rule_capture_sizes(s: _State) -> None:
    cfg = s.config
    if s.current_mode is GraphMode.NONE:
        s.capture_sizes, s.max_capture_size = [], 0
        return
    user_max = cfg.max_cudagraph_capture_size
    user_sizes = cfg.cudagraph_capture_sizes
    if user_max is None and user_sizes is None:
        # Ascend: the default max is injected as if the user had given it (no `* 2`, no decode sizes).
        user_max = ascend_default_max_capture_size(cfg.max_num_seqs, cfg.num_speculative_tokens)
    result = compute_capture_sizes(
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        num_speculative_tokens=cfg.num_speculative_tokens,
        capture_sizes=user_sizes,
        max_capture_size=user_max,
        performance_mode=cfg.performance_mode,
    )
    s.warnings.extend(result.warnings)
    s.capture_sizes, s.max_capture_size = list(result.sizes), result.max_size
    source = "user sizes" if user_sizes is not None else f"max {user_max}"
    s.decide("capture_sizes", list(user_sizes) if user_sizes is not None else None, s.capture_sizes,
             f"capture sizes from {source} (max_num_seqs={cfg.max_num_seqs}, "
             f"max_num_batched_tokens={cfg.max_num_batched_tokens}, num_speculative_tokens={cfg.num_speculative_tokens})")

    tp = cfg.tensor_parallel_size
    needs_alignment = cfg.enable_sequence_parallel or cfg.enable_shared_expert_dp or cfg.enable_dsa_cp
    if tp > 1 and needs_alignment and s.capture_sizes:
        aligned = align_sizes_to_tp(s.capture_sizes, tp)
        if aligned != s.capture_sizes:
            why = ", ".join(
                name for name, on in (("sequence parallelism", cfg.enable_sequence_parallel),
                                      ("shared-expert DP", cfg.enable_shared_expert_dp),
                                      ("DSA context parallel", cfg.enable_dsa_cp)) if on
            )
            s.decide("tp_alignment", s.capture_sizes, aligned,
                     f"with {why} and tensor_parallel_size={tp}, only sizes divisible by {tp} are captured")
            s.capture_sizes = aligned
            s.max_capture_size = aligned[-1]

    limit = s.capabilities.max_piecewise_sizes
    if limit is not None and s.current_mode in (GraphMode.PIECEWISE, GraphMode.FULL_AND_PIECEWISE):
        if len(s.capture_sizes) > limit:
            sampled = sample_sizes(s.capture_sizes, limit)
            who = "Ascend 950 (A5)" if cfg.soc == "A5" and limit == A5_MAX_PIECEWISE_SIZES else \
                f"device profile {s.capabilities.name}"
            s.decide("a5_pruning", s.capture_sizes, sampled,
                     f"{who} captures at most {limit} sizes in piecewise modes; sizes chosen by even sampling")
            s.capture_sizes = sampled
            s.max_capture_size = sampled[-1]


# What a SoC itself lacks, with the warning each downgrade logs. 310P: vLLM Ascend's own
# downgrade (AscendCompilationConfig, via is_310p()). A2: super kernel, whose torch_npu calls go
# to CANN's aclsk API (aclskScopeBegin / aclskOptimize), which CANN's API reference lists as not
# supported on Atlas A2 (hw/soc.py and the simulator's A2 profile say the same), so a card
# would fail at capture: the resolution turns it off up front instead.
SOC_DISABLED: dict[str, tuple[tuple[str, str], ...]] = {
    "310P": (
        ("npugraph_ex", "npugraph_ex is not supported on Ascend 310P. Disabling it."),
        ("static_kernel", "Static kernel is not supported on Ascend 310P. Disabling it."),
        ("super_kernel", "Super kernel is not supported on Ascend 310P. Disabling it."),
    ),
    "A2": (
        ("super_kernel", "Super kernel is not supported on Atlas A2 (CANN's super-kernel API is Atlas A3 only). "
                         "Disabling it."),
    ),
}
NO_SUPER_KERNEL = frozenset(soc for soc, flags in SOC_DISABLED.items() if any(f == "super_kernel" for f, _ in flags))
_KERNEL_FLAGS = ("npugraph_ex", "static_kernel", "super_kernel")


def _rule_soc_310p(s: _State) -> None:
    caps = s.capabilities
    soc_messages = dict(SOC_DISABLED.get(s.config.soc, ()))
    for flag in _KERNEL_FLAGS:
        if getattr(s, flag) and not getattr(caps, flag):
            message = soc_messages.get(flag) or f"{flag} is not supported by device profile {caps.name}. Disabling it."
            s.decide("soc_310p", f"{flag} on", f"{flag} off", message, warn=True)
            setattr(s, flag, False)
    mode = s.current_mode
    if not caps.task_update and mode.has_full_graphs():
        # FULL graphs replay attention with parameters updated per step (graph task update)
        piecewise_ok = s.compilation_mode is CompilationMode.VLLM_COMPILE and mode is not GraphMode.FULL_DECODE_ONLY
        new = GraphMode.PIECEWISE if piecewise_ok else GraphMode.NONE
        s.set_mode("soc_310p", new, f"device profile {caps.name} has no graph task update, which FULL graphs need "
                                    f"to update attention parameters: {mode.name} -> {new.name}")


def _apply_backend_setup(s: _State, rule: str) -> None:
    """Step 8 (and 13): compilation, splitting and kernel flags follow the mode."""
    mode = s.current_mode
    acc = s.config.ascend_compilation_config
    if mode is GraphMode.NONE:
        wanted = dict(attention_split=False, npugraph_ex=False, static_kernel=False, super_kernel=False)
        why = "no graphs are captured in NONE: no npugraph_ex, static or super kernel"
    elif mode.requires_piecewise_compilation():
        wanted = dict(attention_split=True, npugraph_ex=False, static_kernel=False, super_kernel=False)
        why = (f"{mode.name} splits the graph at attention and uses the basic fusion passes only "
               "(npugraph_ex, static and super kernel need FULL or FULL_DECODE_ONLY)")
    else:
        caps = s.capabilities
        wanted = dict(
            attention_split=False,
            npugraph_ex=acc.enable_npugraph_ex and caps.npugraph_ex,
            static_kernel=acc.enable_static_kernel and caps.static_kernel,
            super_kernel=acc.super_kernel and caps.super_kernel,
        )
        why = f"{mode.name} captures the whole model: no split; npugraph_ex/static/super kernel as configured"
    s.attention_split = wanted.pop("attention_split")
    for flag, value in wanted.items():
        before = getattr(s, flag)
        if before != value:
            s.decide(rule, f"{flag} {_show(before)}", f"{flag} {_show(value)}", why)
            setattr(s, flag, value)
    if mode is GraphMode.NONE and s.compilation_mode is not CompilationMode.NONE:
        s.decide(rule, s.compilation_mode, CompilationMode.NONE, "cudagraph_mode NONE runs the model eagerly: compilation off")
        s.compilation_mode = CompilationMode.NONE


def _rule_backend_setup(s: _State) -> None:
    _apply_backend_setup(s, "backend_setup")


def _rule_launch_blocking(s: _State) -> None:
    if s.current_mode is GraphMode.NONE:
        return
    if s.env.get("ASCEND_LAUNCH_BLOCKING", "0").strip() == "1":
        raise ConfigError(LAUNCH_BLOCKING_MESSAGE, key="ASCEND_LAUNCH_BLOCKING")


def _rule_context_parallel(s: _State) -> None:
    cfg = s.config
    if s.current_mode.has_full_graphs() and (
        cfg.prefill_context_parallel_size > 1 or cfg.decode_context_parallel_size > 1
    ):
        s.warnings.append(CONTEXT_PARALLEL_FULL.format(
            mode=s.current_mode.name, pcp=cfg.prefill_context_parallel_size, dcp=cfg.decode_context_parallel_size))


def _rule_attention_narrowing(s: _State) -> None:
    cfg = s.config
    before_sizes = list(s.capture_sizes)
    result = narrow_for_attention(
        s.current_mode,
        s.support,
        capture_sizes=s.capture_sizes,
        max_capture_size=s.max_capture_size,
        uniform_decode_query_len=cfg.uniform_decode_query_len,
        compilation_mode=CompilationMode.NONE if s.compilation_mode is None else s.compilation_mode,
        attention_split=s.attention_split,
        inductor_partition=cfg.use_inductor_graph_partition,
        use_v2_model_runner=cfg.use_v2_model_runner,
        piecewise_capture_available=s.compilation_mode is CompilationMode.VLLM_COMPILE,
        backend_name=s.backend_name,
    )
    before = s.current_mode
    if result.mode is not before:
        reason = " / ".join(result.messages)
        s.decide("attention_narrowing", before, result.mode, reason, warn=False)
        s.warnings.extend(result.messages)
        s.mode = result.mode
    if result.capture_sizes != before_sizes:
        s.decide("spec_decode_rounding", before_sizes, result.capture_sizes,
                 f"sizes rounded up to multiples of q = 1 + num_speculative_tokens = {cfg.uniform_decode_query_len}")
    s.capture_sizes, s.max_capture_size = list(result.capture_sizes), result.max_capture_size


def _rule_data_parallel_agreement(s: _State) -> None:
    if not s.other_rank_modes:
        return
    modes = [s.current_mode, *(GraphMode.parse(m) for m in s.other_rank_modes)]
    if any(m is GraphMode.NONE for m in modes):
        agreed = GraphMode.NONE
    else:
        decode = min((m.decode_mode() for m in modes), key=lambda m: m.value)
        mixed = min((m.mixed_mode() for m in modes), key=lambda m: m.value)
        paired = GraphMode.from_pair(decode, mixed)
        agreed = GraphMode.NONE if paired is None else paired
    s.set_mode("data_parallel_agreement", agreed,
               f"data-parallel ranks run {', '.join(m.name for m in modes)}: all ranks use the minimum, {agreed.name}")


def _rule_final_setup(s: _State) -> None:
    _apply_backend_setup(s, "final_backend_setup")
    if s.current_mode is GraphMode.NONE and (s.capture_sizes or s.max_capture_size):
        s.decide("final_backend_setup", s.capture_sizes, [], "NONE captures nothing: no capture sizes")
        s.capture_sizes, s.max_capture_size = [], 0


def _rule_no_capture_sizes(s: _State) -> None:
    """A graph mode left without sizes (§2.3: every user size > max_num_batched_tokens is no
    error) keeps its name but captures nothing: say so, or `run` reports graphs that never ran."""
    mode = s.current_mode
    if mode is GraphMode.NONE or s.capture_sizes:
        return
    cfg = s.config
    mnbt = cfg.max_num_batched_tokens
    user = list(cfg.cudagraph_capture_sizes or ())
    if user and all(size > mnbt for size in user):
        why = f"every configured size in {user} exceeds max_num_batched_tokens={mnbt}"
    else:
        why = f"capture sizes {user or 'by default'} with max_num_batched_tokens={mnbt}"
    s.decide("no_capture_sizes", mode, f"{mode.name}, nothing captured (every batch eager)",
             NO_CAPTURE_SIZES.format(why=why, mode=mode.name, mnbt=mnbt), warn=True)


RuleFunction = Callable[[_State], None]

RULES: tuple[tuple[str, RuleFunction, str], ...] = (
    ("enforce_eager", _rule_enforce_eager, "§3.1 enforce_eager disables compilation and graphs"),
    ("default_mode", _rule_default_mode, "§3.2 fill the mode from the optimisation level"),
    ("unsupported_compilation_mode", _rule_unsupported_compilation_mode, "§3.3 NPU supports NONE and VLLM_COMPILE"),
    ("piecewise_needs_vllm_compile", _rule_piecewise_needs_vllm_compile, "§3.4 piecewise graphs need VLLM_COMPILE"),
    ("xlite", _rule_xlite, "§3.5 XliteGraph takes over full graphs"),
    ("pooling_and_encoder_decoder", _rule_pooling_and_encoder_decoder, "§3.6 model kinds without full graphs"),
    ("capture_sizes", _rule_capture_sizes, "§3.7 sizes, TP alignment, A5 pruning"),
    ("soc_310p", _rule_soc_310p, "§10 310P has no npugraph_ex / static / super kernel"),
    ("backend_setup", _rule_backend_setup, "§3.8 compile backend by mode"),
    ("launch_blocking", _rule_launch_blocking, "§3.9 ACL graphs cannot run with ASCEND_LAUNCH_BLOCKING=1"),
    ("context_parallel", _rule_context_parallel, "§3.10 FULL under context parallelism is weakly supported"),
    ("attention_narrowing", _rule_attention_narrowing, "§3.11 / §4 attention backend support"),
    ("data_parallel_agreement", _rule_data_parallel_agreement, "§3.12 DP ranks agree on the minimum mode"),
    ("final_backend_setup", _rule_final_setup, "§3.13 flags follow the mode that will really run"),
    ("no_capture_sizes", _rule_no_capture_sizes, "§2.3 a graph mode whose sizes were all dropped runs eagerly"),
)


def _expansion_mode_from_env(environment: Mapping[str, str], warnings: list[str]) -> Optional[str]:
    """HCCL_OP_EXPANSION_MODE from the environment; a value HCCL does not know is planned as
    HCCL's default (FFTS+) with a warning (the run goes on: HCCL does too)."""
    value = hccl_expansion_mode_from_env(environment)
    if value is None or value.upper() in HCCL_EXPANSION_MODES:
        return value
    warnings.append(UNKNOWN_HCCL_EXPANSION_MODE.format(value=value, known=", ".join(HCCL_EXPANSION_MODES)))
    return None


def resolve(
    config: GraphConfig,
    *,
    attention_support: Optional[AttentionGraphSupport] = None,
    env: Optional[Mapping[str, str]] = None,
    backend_name: Optional[str] = None,
    other_rank_modes: Sequence[GraphMode] = (),
    stream_limit: int = DEFAULT_MAX_STREAMS,
    hccl_op_expansion_mode: Optional[str] = None,
    device_profile: Optional[object] = None,
) -> Resolution:
    """Run the whole Ascend resolution pipeline (docs/semantics.md §3) on a configuration.

    ``attention_support`` defaults to the support of the config's attention backend
    (``ascend`` -> ALWAYS for the default model). ``env`` defaults to the process
    environment (ASCEND_LAUNCH_BLOCKING, HCCL_OP_EXPANSION_MODE are read from it).
    ``device_profile`` (an `ascendgraph.device.DeviceProfile`) narrows the SoC's capabilities
    with its own fields (`Capabilities`): no npugraph_ex / static / super kernel, no task
    update (FULL graphs fall back), at most ``max_piecewise_sizes`` piecewise sizes.
    Raises ConfigError or GraphModeError, and nothing else, for impossible configs.
    """
    if not isinstance(config, GraphConfig):
        raise ConfigError(f"resolve() needs a GraphConfig, got {type(config).__name__}; "
                          "build one with GraphConfig.from_vllm_args(...)")
    explicit_expansion = check_hccl_expansion_mode(hccl_op_expansion_mode)
    environment: Mapping[str, str] = os.environ if env is None else env
    info = attention_backend_info(config.effective_attention_backend)
    support = info.support if attention_support is None else AttentionGraphSupport.parse(attention_support)
    acc = config.ascend_compilation_config
    level_default = _level_default_mode(config.optimization_level)
    state = _State(
        config=config,
        env=environment,
        support=support,
        backend_name=backend_name or info.display_name,
        other_rank_modes=tuple(other_rank_modes),
        stream_limit=stream_limit,
        hccl_op_expansion_mode=explicit_expansion,
        # Enum members can be falsy (GraphMode.NONE, CompilationMode.NONE): test for None, never `or`.
        requested_mode=level_default if config.cudagraph_mode is None else config.cudagraph_mode,
        mode=config.cudagraph_mode,
        compilation_mode=config.compilation_mode,
        enforce_eager=config.enforce_eager,
        npugraph_ex=acc.enable_npugraph_ex,
        static_kernel=acc.enable_static_kernel,
        super_kernel=acc.super_kernel,
        capabilities=Capabilities.of(config.soc, device_profile),
    )
    state.warnings.extend(config.parse_warnings)
    for _name, rule, _why in RULES:
        rule(state)

    mode = state.current_mode
    expansion = explicit_expansion
    if expansion is None and mode is not GraphMode.NONE:
        expansion = _expansion_mode_from_env(environment, state.warnings)
    plan: Optional[StreamPlan] = None
    if mode is not GraphMode.NONE and state.capture_sizes:
        plan = plan_stream_budget(
            num_hidden_layers=config.num_hidden_layers,
            capture_sizes=state.capture_sizes,
            mode=mode,
            tensor_parallel_size=config.tensor_parallel_size,
            data_parallel_size=config.data_parallel_size,
            enable_expert_parallel=config.enable_expert_parallel,
            multistream_overlap_shared_expert=config.multistream_overlap_shared_expert,
            is_moe=config.model.is_moe,
            draft_num_hidden_layers=config.draft_num_hidden_layers,
            prefill_context_parallel_size=config.prefill_context_parallel_size,
            decode_context_parallel_size=config.decode_context_parallel_size,
            hccl_op_expansion_mode=expansion,
            max_streams=stream_limit,
        )
    return Resolution(
        requested_mode=state.requested_mode,
        mode=mode,
        compilation_mode=CompilationMode.NONE if state.compilation_mode is None else state.compilation_mode,
        capture_sizes=list(state.capture_sizes),
        max_capture_size=state.max_capture_size,
        warmups=config.cudagraph_num_of_warmups if config.cudagraph_num_of_warmups is not None else ASCEND_WARMUPS,
        attention_split=state.attention_split,
        npugraph_ex=state.npugraph_ex,
        static_kernel=state.static_kernel,
        super_kernel=state.super_kernel,
        warnings=list(state.warnings),
        decisions=list(state.decisions),
        config=config,
        enforce_eager=state.enforce_eager,
        attention_backend=config.effective_attention_backend,
        attention_support=support,
        uniform_decode_query_len=config.uniform_decode_query_len,
        stream_plan=plan,
        xlite_enabled=config.xlite_graph_config.enabled,
        xlite_full_mode=config.xlite_graph_config.full_mode,
    )
