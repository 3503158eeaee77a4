"""Run one rule on the real vLLM and on ascendgraph, and describe both results the same way.

Each ``vllm_*`` function drives the installed vLLM 0.32.0 code path for one rule; the
matching ``ours_*`` function calls ascendgraph's public API with the same inputs. Both
return an `Outcome`: the value (plain tuples and names, so results compare with ``==``),
or the error raised, plus the warning messages emitted meanwhile (vLLM's are captured
from the ``vllm`` logger). `assert_same_outcome` is the single comparison rule:

* both succeed -> equal values and equal messages;
* vLLM raises ValueError -> ours raises ValueError (ConfigError / GraphModeError);
* vLLM fails an ``assert`` on bad input -> ours raises ValueError: where vLLM asserts we
  validate with a typed error (docs/parity.md, "Errors").

Imported only after ``pytest.importorskip("vllm")`` has succeeded.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional, Sequence

from hypothesis import HealthCheck, settings

import vllm
import vllm.logger as vllm_logger
from vllm.config import CompilationConfig, DeviceConfig, VllmConfig
from vllm.config.compilation import CompilationMode as VllmCompilationMode
from vllm.config.compilation import CUDAGraphMode
from vllm.forward_context import BatchDescriptor as VllmBatchDescriptor
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher

REFERENCE_VLLM_VERSION = "0.32.0"
EXAMPLES = int(os.environ.get("ASCENDGRAPH_PARITY_EXAMPLES", "2000"))

# Every property: EXAMPLES examples, no deadline (first calls import lazily), reproducible.
parity_settings = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

ATTENTION_OPS: list[str] = list(CompilationConfig._attention_ops)

# The step-5 message of narrowing is our own text (docs/semantics.md §4); vLLM's opens like this.
VLLM_PIECEWISE_CAPTURE_MESSAGE_START = "Cudagraph mode "
VLLM_PIECEWISE_CAPTURE_MESSAGE_MARK = "requires piecewise capture"


def version_mismatch_reason() -> Optional[str]:
    if vllm.__version__ != REFERENCE_VLLM_VERSION:
        return (
            f"the parity reference is vLLM {REFERENCE_VLLM_VERSION}, this environment has "
            f"{vllm.__version__}; build the reference with scripts/parity-env.sh"
        )
    return None


# --------------------------------------------------------------------------- outcomes


@dataclass
class Outcome:
    """What one implementation did with one input."""

    value: Any = None
    error: Optional[BaseException] = None
    messages: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        if self.error is None:
            return "ok"
        if isinstance(self.error, AssertionError):
            return "precondition"
        if isinstance(self.error, ValueError):  # includes pydantic's ValidationError
            return "invalid"
        if isinstance(self.error, KeyError):
            # vLLM parses a mode name with CUDAGraphMode[name.upper()]; its KeyError escapes
            # pydantic unwrapped. It is a rejected value all the same.
            return "invalid"
        return f"other:{type(self.error).__name__}"

    def describe(self) -> str:
        if self.error is None:
            return f"value={self.value!r} messages={self.messages!r}"
        return f"{type(self.error).__name__}: {self.error}"


def run(fn: Callable[[], Any]) -> Outcome:
    try:
        return Outcome(value=fn())
    except Exception as exc:  # noqa: BLE001 - the kind is what we compare
        return Outcome(error=exc)


def messages_equal(theirs: Sequence[str], ours: Sequence[str]) -> bool:
    if len(theirs) != len(ours):
        return False
    for vllm_message, our_message in zip(theirs, ours):
        if vllm_message.startswith(VLLM_PIECEWISE_CAPTURE_MESSAGE_START) and (
            VLLM_PIECEWISE_CAPTURE_MESSAGE_MARK in vllm_message
        ):
            # Ours is worded differently by design; it must name both modes, in order.
            names = [w.rstrip(".,") for w in vllm_message.split() if w.rstrip(".,").isupper()]
            modes = [n for n in names if n in CUDAGraphMode.__members__]
            if not all(m in our_message for m in modes):
                return False
            continue
        if vllm_message != our_message:
            return False
    return True


def assert_same_outcome(theirs: Outcome, ours: Outcome, inputs: str) -> None:
    """The parity rule (module docstring). ``inputs`` says what was asked, for the failure text."""
    header = f"\n  inputs: {inputs}\n  vLLM  : {theirs.describe()}\n  ours  : {ours.describe()}"
    if theirs.kind == "ok":
        assert ours.kind == "ok", "vLLM accepts this input but ascendgraph raised" + header
        assert ours.value == theirs.value, "results differ" + header
        assert messages_equal(theirs.messages, ours.messages), "warning messages differ" + header
    elif theirs.kind in ("invalid", "precondition"):
        assert ours.kind == "invalid", (
            f"vLLM rejects this input ({theirs.kind}) but ascendgraph "
            + ("accepted it" if ours.kind == "ok" else f"raised {ours.kind}")
            + header
        )
    else:  # pragma: no cover - would be a harness bug
        raise AssertionError("vLLM raised an unexpected kind of error" + header)


# --------------------------------------------------------------------------- vLLM's log


class _WarningCollector(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextlib.contextmanager
def vllm_warnings() -> Iterator[list[str]]:
    """Collect the warnings vLLM logs inside the block (``*_once`` caches cleared first)."""
    for cached in (vllm_logger._print_warning_once, vllm_logger._print_info_once):
        cached.cache_clear()
    logger = logging.getLogger("vllm")
    collector = _WarningCollector()
    old_level = logger.level
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(collector)
    try:
        yield collector.messages
    finally:
        logger.removeHandler(collector)
        logger.setLevel(old_level)


def run_vllm(fn: Callable[[], Any]) -> Outcome:
    with vllm_warnings() as messages:
        outcome = run(fn)
    outcome.messages = list(messages)
    return outcome


# --------------------------------------------------------------------------- name mapping


def vllm_mode(name: str) -> CUDAGraphMode:
    return CUDAGraphMode[name]


def vllm_support(name: str) -> AttentionCGSupport:
    return AttentionCGSupport[name]


def descriptor_tuple(desc: Any) -> tuple:
    """A BatchDescriptor of either side as a plain tuple of its five fields."""
    return (desc.num_tokens, desc.num_reqs, desc.uniform, desc.has_lora, desc.num_active_loras)


# --------------------------------------------------------------------------- capture sizes


class _ModelStandIn:
    """What VllmConfig._set_cudagraph_sizes reads from the model config."""

    enforce_eager = False


class _SpeculativeStandIn:
    """What it reads from the speculative config."""

    def __init__(self, num_speculative_tokens: int) -> None:
        self.num_speculative_tokens = num_speculative_tokens

    def uses_dynamic_speculative_decoding(self) -> bool:
        return False


@functools.lru_cache(maxsize=None)
def _cpu_vllm_config() -> VllmConfig:
    # On CPU vLLM forces cudagraph_mode to NONE during __post_init__; the tests then put a
    # fresh CompilationConfig and the scheduler fields in place and call the size rule.
    config = VllmConfig(device_config=DeviceConfig("cpu"))
    config.model_config = _ModelStandIn()
    return config


def vllm_capture_sizes(
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int,
    capture_sizes: Optional[Sequence[int]],
    max_capture_size: Optional[int],
    performance_mode: str,
) -> Outcome:
    config = _cpu_vllm_config()
    config.speculative_config = (
        _SpeculativeStandIn(num_speculative_tokens) if num_speculative_tokens else None
    )
    config.performance_mode = performance_mode
    config.scheduler_config.max_num_seqs = max_num_seqs
    config.scheduler_config.max_num_batched_tokens = max_num_batched_tokens
    user_fields: dict[str, Any] = {"max_cudagraph_capture_size": max_capture_size}
    if capture_sizes is not None:  # pydantic refuses an explicit None for the list
        user_fields["cudagraph_capture_sizes"] = list(capture_sizes)
    config.compilation_config = CompilationConfig(
        cudagraph_mode=CUDAGraphMode.FULL_AND_PIECEWISE, **user_fields
    )

    def call() -> tuple:
        config._set_cudagraph_sizes()
        cc = config.compilation_config
        return (list(cc.cudagraph_capture_sizes), cc.max_cudagraph_capture_size)

    return run_vllm(call)


def ours_capture_sizes(
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int,
    capture_sizes: Optional[Sequence[int]],
    max_capture_size: Optional[int],
    performance_mode: str,
) -> Outcome:
    from ascendgraph.sizes import compute_capture_sizes

    def call() -> Any:
        return compute_capture_sizes(
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            num_speculative_tokens=num_speculative_tokens,
            capture_sizes=None if capture_sizes is None else list(capture_sizes),
            max_capture_size=max_capture_size,
            performance_mode=performance_mode,
        )

    outcome = run(call)
    if outcome.error is None:
        result = outcome.value
        outcome.value = (list(result.sizes), result.max_size)
        outcome.messages = list(result.warnings)
    return outcome


# --------------------------------------------------------------------------- spec-decode rounding


def vllm_round_for_spec_decode(sizes: Sequence[int], max_size: int, query_len: int) -> Outcome:
    config = CompilationConfig(
        cudagraph_capture_sizes=list(sizes), max_cudagraph_capture_size=max_size
    )

    def call() -> tuple:
        config.adjust_cudagraph_sizes_for_spec_decode(query_len)
        return (list(config.cudagraph_capture_sizes), config.max_cudagraph_capture_size)

    return run_vllm(call)


def ours_round_for_spec_decode(sizes: Sequence[int], max_size: int, query_len: int) -> Outcome:
    from ascendgraph.sizes import round_sizes_for_spec_decode

    outcome = run(lambda: round_sizes_for_spec_decode(list(sizes), max_size, query_len=query_len))
    if outcome.error is None:
        rounded, new_max = outcome.value
        outcome.value = (list(rounded), new_max)
    return outcome


# --------------------------------------------------------------------------- attention narrowing


@dataclass(frozen=True)
class NarrowingCase:
    mode: str
    support: str
    capture_sizes: tuple[int, ...]
    max_capture_size: int
    uniform_decode_query_len: int
    compilation_mode: str
    attention_split: bool
    inductor_partition: bool
    use_v2_model_runner: bool
    piecewise_capture_available: bool
    backend_name: str


def vllm_narrow(case: NarrowingCase) -> Outcome:
    config = CompilationConfig(
        mode=VllmCompilationMode[case.compilation_mode],
        cudagraph_mode=vllm_mode(case.mode),
        splitting_ops=list(ATTENTION_OPS) if case.attention_split else [],
        use_inductor_graph_partition=case.inductor_partition,
        cudagraph_capture_sizes=list(case.capture_sizes),
        max_cudagraph_capture_size=case.max_capture_size,
    )

    def call() -> tuple:
        mode = config.resolve_cudagraph_mode_and_sizes(
            vllm_support(case.support),
            case.backend_name,
            uniform_decode_query_len=case.uniform_decode_query_len,
            use_v2_model_runner=case.use_v2_model_runner,
            piecewise_capture_available=case.piecewise_capture_available,
        )
        assert config.cudagraph_mode == mode
        return (
            mode.name,
            list(config.cudagraph_capture_sizes),
            config.max_cudagraph_capture_size,
        )

    return run_vllm(call)


def ours_narrow(case: NarrowingCase) -> Outcome:
    from ascendgraph.modes import AttentionGraphSupport, CompilationMode, GraphMode
    from ascendgraph.resolve import narrow_for_attention

    def call() -> Any:
        return narrow_for_attention(
            GraphMode[case.mode],
            AttentionGraphSupport[case.support],
            capture_sizes=list(case.capture_sizes),
            max_capture_size=case.max_capture_size,
            uniform_decode_query_len=case.uniform_decode_query_len,
            compilation_mode=CompilationMode[case.compilation_mode],
            attention_split=case.attention_split,
            inductor_partition=case.inductor_partition,
            use_v2_model_runner=case.use_v2_model_runner,
            piecewise_capture_available=case.piecewise_capture_available,
            backend_name=case.backend_name,
        )

    outcome = run(call)
    if outcome.error is None:
        result = outcome.value
        outcome.value = (result.mode.name, list(result.capture_sizes), result.max_capture_size)
        outcome.messages = list(result.messages)
    return outcome


# --------------------------------------------------------------------------- dispatcher


@dataclass(frozen=True)
class DispatcherCase:
    mode: str
    capture_sizes: tuple[int, ...]
    max_num_seqs: int
    uniform_decode_query_len: int
    max_loras: int  # 0: LoRA disabled (vLLM: lora_config is None)
    specialize_active_lora: bool
    specialize_lora: bool


@dataclass(frozen=True)
class DispatchQuery:
    num_tokens: int
    uniform_decode: bool = False
    has_lora: bool = False
    num_active_loras: int = 0
    valid_modes: Optional[frozenset[str]] = None
    invalid_modes: Optional[frozenset[str]] = None


def _modes(names: Optional[frozenset[str]], convert: Callable[[str], Any]) -> Any:
    return None if names is None else {convert(n) for n in names}


class VllmDispatcher:
    """vLLM's CudagraphDispatcher set up from a DispatcherCase (keys initialised)."""

    def __init__(self, case: DispatcherCase) -> None:
        sizes = sorted(case.capture_sizes)
        compilation = CompilationConfig(
            mode=VllmCompilationMode.VLLM_COMPILE,
            cudagraph_mode=vllm_mode(case.mode),
            splitting_ops=list(ATTENTION_OPS),
            cudagraph_capture_sizes=list(sizes),
            max_cudagraph_capture_size=sizes[-1] if sizes else 0,
            cudagraph_specialize_lora=case.specialize_lora,
        )
        lora = (
            SimpleNamespace(
                max_loras=case.max_loras, specialize_active_lora=case.specialize_active_lora
            )
            if case.max_loras > 0
            else None
        )
        # The dispatcher reads only these attributes of a VllmConfig.
        vllm_config = SimpleNamespace(
            compilation_config=compilation,
            num_speculative_tokens=case.uniform_decode_query_len - 1,
            lora_config=lora,
            scheduler_config=SimpleNamespace(max_num_seqs=case.max_num_seqs),
        )
        self.dispatcher = CudagraphDispatcher(vllm_config)  # type: ignore[arg-type]
        self.dispatcher.initialize_cudagraph_keys(
            vllm_mode(case.mode), case.uniform_decode_query_len
        )

    def keys(self) -> dict[str, set[tuple]]:
        return {
            mode.name: {descriptor_tuple(d) for d in descs}
            for mode, descs in self.dispatcher.cudagraph_keys.items()
        }

    def capture_order(self) -> list[tuple[str, tuple]]:
        return [
            (mode.name, descriptor_tuple(d))
            for mode, descs in self.dispatcher.get_capture_descs()
            for d in descs
        ]

    def dispatch(self, query: DispatchQuery) -> Outcome:
        def call() -> tuple:
            mode, desc = self.dispatcher.dispatch(
                query.num_tokens,
                uniform_decode=query.uniform_decode,
                has_lora=query.has_lora,
                num_active_loras=query.num_active_loras,
                valid_modes=_modes(query.valid_modes, vllm_mode),
                invalid_modes=_modes(query.invalid_modes, vllm_mode),
            )
            return (mode.name, descriptor_tuple(desc))

        return run_vllm(call)


class OurDispatcher:
    """ascendgraph's GraphDispatcher for the same case."""

    def __init__(self, case: DispatcherCase) -> None:
        from ascendgraph.dispatch import GraphDispatcher
        from ascendgraph.modes import GraphMode

        self._mode = GraphMode
        self.dispatcher = GraphDispatcher(
            GraphMode[case.mode],
            capture_sizes=sorted(case.capture_sizes),
            max_num_seqs=case.max_num_seqs,
            uniform_decode_query_len=case.uniform_decode_query_len,
            max_loras=case.max_loras,
            specialize_active_lora=case.specialize_active_lora,
            specialize_lora=case.specialize_lora,
        )

    def keys(self) -> dict[str, set[tuple]]:
        result = {}
        for name in ("PIECEWISE", "FULL"):
            descs = [descriptor_tuple(d) for d in self.dispatcher.keys(self._mode[name])]
            assert len(descs) == len(set(descs)), f"duplicate {name} keys: {descs}"
            result[name] = set(descs)
        return result

    def capture_order(self) -> list[tuple[str, tuple]]:
        return [(mode.name, descriptor_tuple(d)) for mode, d in self.dispatcher.capture_order()]

    def dispatch(self, query: DispatchQuery) -> Outcome:
        def call() -> tuple:
            mode, desc = self.dispatcher.dispatch(
                query.num_tokens,
                uniform_decode=query.uniform_decode,
                has_lora=query.has_lora,
                num_active_loras=query.num_active_loras,
                valid_modes=_modes(query.valid_modes, lambda n: self._mode[n]),
                invalid_modes=_modes(query.invalid_modes, lambda n: self._mode[n]),
            )
            return (mode.name, descriptor_tuple(desc))

        return run(call)


def build_both(case: DispatcherCase) -> tuple[Outcome, Outcome]:
    """Construct both dispatchers; an Outcome holding the dispatcher or the error."""
    return run_vllm(lambda: VllmDispatcher(case)), run(lambda: OurDispatcher(case))
