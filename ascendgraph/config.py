"""GraphConfig: everything graph mode depends on, parsed from vLLM-style arguments.

`GraphConfig.from_vllm_args` accepts what users pass to ``vllm serve``: the JSON strings
(or dicts) of ``--compilation-config`` and ``--additional-config``, the model, and engine
arguments by their vLLM names. Every check that needs nothing but the configuration
itself lives here (types, ranges, unknown keys, the npugraph_ex -> static kernel -> super
kernel chain of docs/semantics.md §10); rules that change the mode live in `ascendgraph.resolve`.

Unknown keys: a top-level engine argument or a ``--compilation-config`` key that vLLM does
not have is a ConfigError suggesting the closest valid key; a real vLLM compilation key
that graph mode does not depend on is accepted with a warning; ``--additional-config``
accepts any top-level key (as vLLM Ascend does) and warns on keys it does not model.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping, Optional, Sequence, Union

from ascendgraph.errors import ConfigError
from ascendgraph.readers import MAX_INT_DIGITS, check_tree, load_json
from ascendgraph.models.backends import ATTENTION_BACKENDS, attention_backend_info
from ascendgraph.models.presets import ModelSpec, model_spec_from
from ascendgraph.modes import CompilationMode, GraphMode

__all__ = [
    "GraphConfig",
    "AscendCompilationConfig",
    "XliteGraphConfig",
    "SOCS",
    "STATIC_NEEDS_NPUGRAPH_EX",
    "SUPER_NEEDS_STATIC",
    "parse_json_argument",
]

SOCS = ("A2", "A3", "310P", "A5")
OPTIMIZATION_LEVELS = (0, 1, 2, 3)
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")

# vLLM's defaults (SchedulerConfig.DEFAULT_MAX_NUM_SEQS / DEFAULT_MAX_NUM_BATCHED_TOKENS on the serve path).
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192

STATIC_NEEDS_NPUGRAPH_EX = "Static kernel generation requires npugraph_ex to be enabled."
SUPER_NEEDS_STATIC = "Super kernel generation requires static kernel to be enabled"

# vLLM 0.32 CompilationConfig fields: the modelled ones, and the others (accepted, ignored).
MODELLED_COMPILATION_KEYS = (
    "mode",
    "level",
    "cudagraph_mode",
    "cudagraph_capture_sizes",
    "max_cudagraph_capture_size",
    "cudagraph_num_of_warmups",
    "splitting_ops",
    "use_inductor_graph_partition",
    "cudagraph_specialize_lora",
)
IGNORED_COMPILATION_KEYS = (
    "debug_dump_path",
    "cache_dir",
    "compile_cache_save_format",
    "backend",
    "custom_ops",
    "ir_enable_torch_wrap",
    "compile_mm_encoder",
    "cudagraph_mm_encoder",
    "encoder_cudagraph_token_budgets",
    "encoder_cudagraph_max_vision_items_per_batch",
    "encoder_cudagraph_max_frames_per_batch",
    "cudagraph_decoder_replay",
    "decoder_replay_cudagraph_capture_sizes",
    "decoder_replay_trim_threshold",
    "compile_sizes",
    "compile_ranges_endpoints",
    "inductor_compile_config",
    "inductor_passes",
    "cudagraph_copy_inputs",
    "pass_config",
    "dynamic_shapes_config",
    "fast_moe_cold_start",
    "use_inductor",
)

# --additional-config: modelled top-level keys (vLLM Ascend's names).
MODELLED_ADDITIONAL_KEYS = (
    "ascend_compilation_config",
    "xlite_graph_config",
    "multistream_overlap_shared_expert",
    "enable_shared_expert_dp",
    "enable_dsa_cp",
    "soc",
)


class _KeywordChecked:
    """Refuses an unknown keyword with a ConfigError and a "did you mean" (instead of the
    TypeError a dataclass constructor raises), so the API raises only ascendgraph's errors."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        names = {f.name for f in fields(cls)}  # type: ignore[arg-type]  # cls is always a dataclass (the sub-config classes)
        for key in kwargs:
            if key not in names:
                raise ConfigError(_unknown_key_message(f"{cls.__name__} field", key, frozenset(names)), key=key)
        if len(args) > len(names):
            raise ConfigError(f"{cls.__name__} takes at most {len(names)} values, got {len(args)}")
        return super().__new__(cls)


def _check_bools(owner: Any, where: str) -> None:
    for item in fields(owner):
        value = getattr(owner, item.name)
        if value is None and item.name == "enable_super_kernel":
            continue
        if not isinstance(value, bool):
            raise ConfigError(f"{where}.{item.name} must be true or false, got {_short(value)}",
                              key=f"{where}.{item.name}")


@dataclass(frozen=True)
class AscendCompilationConfig(_KeywordChecked):
    """``additional_config.ascend_compilation_config`` (docs/semantics.md §10)."""

    enable_npugraph_ex: bool = True
    enable_static_kernel: bool = False
    enable_super_kernel: Optional[bool] = None  # None: follows enable_static_kernel
    fuse_norm_quant: bool = True
    fuse_qknorm_rope: bool = True
    fuse_muls_add: bool = True

    def __post_init__(self) -> None:
        _check_bools(self, "ascend_compilation_config")

    @property
    def super_kernel(self) -> bool:
        return self.enable_static_kernel if self.enable_super_kernel is None else self.enable_super_kernel


@dataclass(frozen=True)
class XliteGraphConfig(_KeywordChecked):
    """``additional_config.xlite_graph_config`` (docs/semantics.md §11)."""

    enabled: bool = False
    full_mode: bool = False

    def __post_init__(self) -> None:
        _check_bools(self, "xlite_graph_config")


@dataclass(frozen=True)
class GraphConfig(_KeywordChecked):
    """The configuration graph mode depends on, with vLLM's field names.

    ``None`` in a field means "not set by the user"; resolution fills the default and
    records that it did.
    """

    cudagraph_mode: Optional[GraphMode] = None
    compilation_mode: Optional[CompilationMode] = None
    optimization_level: int = 2
    cudagraph_capture_sizes: Optional[tuple[int, ...]] = None
    max_cudagraph_capture_size: Optional[int] = None
    cudagraph_num_of_warmups: Optional[int] = None
    splitting_ops: Optional[tuple[str, ...]] = None
    use_inductor_graph_partition: bool = False
    cudagraph_specialize_lora: bool = True
    enforce_eager: bool = False
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    num_speculative_tokens: int = 0
    draft_num_hidden_layers: Optional[int] = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    prefill_context_parallel_size: int = 1
    decode_context_parallel_size: int = 1
    enable_expert_parallel: bool = False
    enable_sequence_parallel: bool = False
    enable_shared_expert_dp: bool = False
    enable_dsa_cp: bool = False
    multistream_overlap_shared_expert: bool = False
    block_size: int = 128
    soc: str = "A2"
    model: ModelSpec = field(default_factory=lambda: model_spec_from(None))
    attention_backend: Optional[str] = None  # None: the model's natural backend
    performance_mode: str = "balanced"
    use_v2_model_runner: bool = False
    max_loras: int = 0
    ascend_compilation_config: AscendCompilationConfig = field(default_factory=AscendCompilationConfig)
    xlite_graph_config: XliteGraphConfig = field(default_factory=XliteGraphConfig)
    parse_warnings: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    # -- derived -------------------------------------------------------------------
    @property
    def uniform_decode_query_len(self) -> int:
        return 1 + self.num_speculative_tokens

    @property
    def effective_attention_backend(self) -> str:
        return self.attention_backend or self.model.natural_attention_backend

    @property
    def num_hidden_layers(self) -> int:
        return self.model.num_hidden_layers

    def replace(self, **changes: Any) -> "GraphConfig":
        return replace(self, **changes)

    # -- parsing -------------------------------------------------------------------
    @classmethod
    def from_vllm_args(
        cls,
        compilation_config: Union[str, Mapping[str, Any], None] = None,
        additional_config: Union[str, Mapping[str, Any], None] = None,
        model: Union[str, Mapping[str, Any], ModelSpec, None] = None,
        **engine_args: Any,
    ) -> "GraphConfig":
        """Build a config from ``vllm serve`` style arguments (JSON strings or dicts)."""
        warnings: list[str] = []
        values: dict[str, Any] = {}
        comp = parse_json_argument("--compilation-config", compilation_config)
        add = parse_json_argument("--additional-config", additional_config)
        _parse_compilation_config(comp, values, warnings)
        _parse_additional_config(add, values, warnings)
        layers_override = None
        for key, value in engine_args.items():
            if value is None:
                continue
            if key in ("num_layers", "num_hidden_layers"):
                layers_override = value
                continue
            if key == "speculative_config":
                _parse_speculative_config(value, values)
                _check_one_token_count(value, engine_args.get("num_speculative_tokens"))
                continue
            if key == "optimization_level":
                values["optimization_level"] = _parse_level(value)
                continue
            if key in ("enable_lora",):
                if value and "max_loras" not in engine_args:
                    values["max_loras"] = 1
                continue
            if key not in _ENGINE_KEYS:
                raise ConfigError(_unknown_key_message("engine argument", key, _ARGUMENT_NAMES), key=key)
            values[key] = value
        spec = model_spec_from(model)  # checks every field itself: a bad one is a ConfigError naming it
        if layers_override is not None:
            spec = spec.with_layers(layers_override)
        values["model"] = spec
        _default_max_num_seqs(values)
        if isinstance(values.get("soc"), str):
            values["soc"] = values["soc"].strip().upper()
        if isinstance(values.get("attention_backend"), str):
            values["attention_backend"] = values["attention_backend"].strip().lower()
        values["parse_warnings"] = tuple(warnings)
        return cls(**values)


# Every argument name from_vllm_args takes (for the "did you mean" of an unknown one).
_SPECIAL_ARGUMENTS = ("compilation_config", "additional_config", "model", "num_layers", "num_hidden_layers",
                      "speculative_config", "optimization_level", "enable_lora")

# Engine arguments accepted by from_vllm_args (vLLM spellings), besides those handled above.
_ENGINE_KEYS = frozenset(
    f.name
    for f in fields(GraphConfig)
    if f.name
    not in (
        "model",
        "parse_warnings",
        "ascend_compilation_config",
        "xlite_graph_config",
        "optimization_level",
    )
)
_ARGUMENT_NAMES = _ENGINE_KEYS | frozenset(_SPECIAL_ARGUMENTS)


def parse_json_argument(flag: str, value: Union[str, Mapping[str, Any], None]) -> dict[str, Any]:
    """A dict from a JSON string or a mapping; bad JSON names the flag and the position."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        bad = [key for key in value if not isinstance(key, str)]
        if bad:
            raise ConfigError(f"{flag}: keys must be strings (as in JSON), got {bad[0]!r}", key=flag)
        return dict(check_tree(value, flag, key=flag))
    if not isinstance(value, str):
        raise ConfigError(f"{flag} must be a JSON object (string or dict), got {type(value).__name__}", key=flag)
    text = value.strip()
    if not text:
        return {}
    parsed = load_json(
        text, flag, key=flag,
        hint=". Quote keys and strings with double quotes, e.g. '{\"cudagraph_mode\": \"FULL\"}'",
    )
    if not isinstance(parsed, dict):
        raise ConfigError(f"{flag} must be a JSON object like {{\"key\": value}}, got {type(parsed).__name__}", key=flag)
    return parsed


def _unknown_key_message(where: str, key: str, valid: Sequence[str] | frozenset[str]) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(sorted(valid))}"
    return f"unknown {where} {key!r}{hint}"


def _parse_level(value: Any) -> int:
    if isinstance(value, str):
        text = value.strip().upper()
        if text.startswith("O"):
            text = text[1:]
        if text.isascii() and text.isdigit() and len(text) <= MAX_INT_DIGITS:
            value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or value not in OPTIMIZATION_LEVELS:
        raise ConfigError(
            f"optimization_level must be 0, 1, 2 or 3 (-O0..-O3), got {_short(value)}", key="optimization_level"
        )
    return value


def _short(value: Any) -> str:
    """``repr(value)``, cut to a readable length (a pasted megabyte is not echoed back)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _parse_named(where: str, key: str, parse: Any, value: Any) -> Any:
    """An enum parse whose error names the key it came from (the enum's own says only the kind)."""
    try:
        return parse(value)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}", key=key) from None


def _parse_compilation_config(comp: Mapping[str, Any], values: dict[str, Any], warnings: list[str]) -> None:
    valid = MODELLED_COMPILATION_KEYS + IGNORED_COMPILATION_KEYS
    for key, value in comp.items():
        if key not in valid:
            raise ConfigError(_unknown_key_message("--compilation-config key", key, valid), key=key)
        if key in IGNORED_COMPILATION_KEYS:
            warnings.append(
                f"--compilation-config key {key!r} is a real vLLM setting that graph mode does not "
                "depend on; ascendgraph ignores it"
            )
            continue
        if value is None:
            continue
        if key in ("mode", "level"):
            values["compilation_mode"] = _parse_named(f"--compilation-config {key}", key, CompilationMode.parse, value)
        elif key == "cudagraph_mode":
            values["cudagraph_mode"] = _parse_named(f"--compilation-config {key}", key, GraphMode.parse, value)
        elif key == "cudagraph_capture_sizes":
            if not isinstance(value, (list, tuple)):
                raise ConfigError(
                    f"cudagraph_capture_sizes must be a list of integers, got {value!r}",
                    key="cudagraph_capture_sizes",
                )
            values["cudagraph_capture_sizes"] = tuple(value)
        elif key == "splitting_ops":
            if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f"splitting_ops must be a list of op names, got {value!r}", key="splitting_ops")
            values["splitting_ops"] = tuple(value)
        else:
            values[key] = value


def _parse_sub_config(
    name: str, raw: Any, cls: type, warnings: list[str]
) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"additional_config.{name} must be a JSON object, got {raw!r}", key=name)
    known = {f.name for f in fields(cls)}
    kwargs = {}
    for key, value in raw.items():
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            warnings.append(f"additional_config.{name}: unknown key {key!r} is ignored{hint}")
            continue
        if value is None and key == "enable_super_kernel":
            continue
        if not isinstance(value, bool):
            raise ConfigError(
                f"additional_config.{name}.{key} must be true or false, got {value!r}", key=f"{name}.{key}"
            )
        kwargs[key] = value
    return cls(**kwargs)


def _parse_additional_config(add: Mapping[str, Any], values: dict[str, Any], warnings: list[str]) -> None:
    for key, value in add.items():
        if key == "ascend_compilation_config":
            values[key] = _parse_sub_config(key, value, AscendCompilationConfig, warnings)
        elif key == "xlite_graph_config":
            values[key] = _parse_sub_config(key, value, XliteGraphConfig, warnings)
        elif key in MODELLED_ADDITIONAL_KEYS:
            values[key] = value
        else:
            warnings.append(f"additional_config key {key!r} is not modelled by ascendgraph; ignored")


def _default_max_num_seqs(values: dict[str, Any]) -> None:
    """vLLM 0.32 (EngineArgs): an unset max_num_seqs defaults to min(256, max_num_batched_tokens),
    so that a small token budget alone is not refused by the check below."""
    tokens: Any = values.get("max_num_batched_tokens")
    if values.get("max_num_seqs") is None and _is_int(tokens) and 1 <= tokens < DEFAULT_MAX_NUM_SEQS:
        values["max_num_seqs"] = tokens


def _check_one_token_count(speculative_config: Any, num_speculative_tokens: Any) -> None:
    """Both --speculative-config's num_speculative_tokens and num_speculative_tokens, differing:
    say so instead of letting argument order pick one (the CLI refuses the same)."""
    spec = parse_json_argument("--speculative-config", speculative_config)
    inner = spec.get("num_speculative_tokens")
    if num_speculative_tokens is not None and inner is not None and inner != num_speculative_tokens:
        raise ConfigError(
            f"num_speculative_tokens={num_speculative_tokens!r} conflicts with speculative_config's "
            f"num_speculative_tokens={inner!r}: give the number once",
            key="num_speculative_tokens",
        )


def _parse_speculative_config(value: Any, values: dict[str, Any]) -> None:
    spec = parse_json_argument("--speculative-config", value)
    for key, item in spec.items():
        if key == "num_speculative_tokens":
            values["num_speculative_tokens"] = item
        elif key in ("draft_num_hidden_layers", "num_hidden_layers"):
            values["draft_num_hidden_layers"] = item
        # method, model, ...: the engine makes up draft tokens; only the shapes matter.


# --------------------------------------------------------------------------- validation

_INT_FIELDS: dict[str, int] = {
    # field -> minimum value
    "max_num_seqs": 1,
    "max_num_batched_tokens": 1,
    "num_speculative_tokens": 0,
    "tensor_parallel_size": 1,
    "data_parallel_size": 1,
    "pipeline_parallel_size": 1,
    "prefill_context_parallel_size": 1,
    "decode_context_parallel_size": 1,
    "block_size": 1,
    "max_loras": 0,
}
_OPTIONAL_INT_FIELDS: dict[str, int] = {
    "max_cudagraph_capture_size": 1,
    "cudagraph_num_of_warmups": 0,
    "draft_num_hidden_layers": 1,
}
_BOOL_FIELDS = (
    "use_inductor_graph_partition",
    "cudagraph_specialize_lora",
    "enforce_eager",
    "enable_expert_parallel",
    "enable_sequence_parallel",
    "enable_shared_expert_dp",
    "enable_dsa_cp",
    "multistream_overlap_shared_expert",
    "use_v2_model_runner",
)
# Values past these are almost certainly typos (and would make planning tables huge).
_SANITY_LIMITS = {
    "max_num_seqs": 1 << 20,
    "max_num_batched_tokens": 1 << 24,
    "num_speculative_tokens": 64,
    "max_cudagraph_capture_size": 1 << 24,
    "cudagraph_num_of_warmups": 100,
}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _validate(config: GraphConfig) -> None:
    for name, lowest in _INT_FIELDS.items():
        value = getattr(config, name)
        if not _is_int(value) or value < lowest:
            raise ConfigError(f"{name} must be an integer >= {lowest}, got {value!r}", key=name)
    for name, lowest in _OPTIONAL_INT_FIELDS.items():
        value = getattr(config, name)
        if value is not None and (not _is_int(value) or value < lowest):
            raise ConfigError(f"{name} must be an integer >= {lowest} (or unset), got {value!r}", key=name)
    for name, limit in _SANITY_LIMITS.items():
        value = getattr(config, name)
        if value is not None and value > limit:
            raise ConfigError(f"{name}={value} is larger than ascendgraph supports (at most {limit})", key=name)
    _check_token_budget(config)
    from ascendgraph.block_sizes import block_size_problem  # the contract table's rule, torch-free

    problem = block_size_problem(config.block_size, config.attention_backend or "default")
    if problem is not None:
        raise ConfigError(f"block_size={config.block_size} is refused by the NPU's paged attention: {problem}",
                          key="block_size")
    from ascendgraph.attention_limits import decode_query_len_problem  # the same table's config-level rule

    problem = decode_query_len_problem(config.num_speculative_tokens, config.attention_backend or "default")
    if problem is not None:
        raise ConfigError(f"num_speculative_tokens={config.num_speculative_tokens} is refused by the NPU's attention: "
                          f"{problem}", key="num_speculative_tokens")
    for name in _BOOL_FIELDS:
        value = getattr(config, name)
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be true or false, got {value!r}", key=name)
    if config.cudagraph_mode is not None and not isinstance(config.cudagraph_mode, GraphMode):
        mode = _parse_named("cudagraph_mode", "cudagraph_mode", GraphMode.parse, config.cudagraph_mode)
        object.__setattr__(config, "cudagraph_mode", mode)
    if config.compilation_mode is not None and not isinstance(config.compilation_mode, CompilationMode):
        mode = _parse_named("compilation_mode", "compilation_mode", CompilationMode.parse, config.compilation_mode)
        object.__setattr__(config, "compilation_mode", mode)
    if not _is_int(config.optimization_level) or config.optimization_level not in OPTIMIZATION_LEVELS:
        raise ConfigError(
            f"optimization_level must be 0, 1, 2 or 3, got {config.optimization_level!r}", key="optimization_level"
        )
    sizes = config.cudagraph_capture_sizes
    if sizes is not None:
        if isinstance(sizes, list):
            object.__setattr__(config, "cudagraph_capture_sizes", tuple(sizes))
            sizes = config.cudagraph_capture_sizes
        if not isinstance(sizes, tuple):
            raise ConfigError(
                f"cudagraph_capture_sizes must be a list of integers, got {sizes!r}", key="cudagraph_capture_sizes"
            )
        for size in sizes:
            if not _is_int(size) or size < 1:
                raise ConfigError(
                    f"cudagraph_capture_sizes entries must be integers >= 1, got {size!r} in {list(sizes)}",
                    key="cudagraph_capture_sizes",
                )
            if size > _SANITY_LIMITS["max_cudagraph_capture_size"]:
                raise ConfigError(
                    f"cudagraph_capture_sizes entry {size} is larger than ascendgraph supports",
                    key="cudagraph_capture_sizes",
                )
    if not isinstance(config.soc, str) or config.soc not in SOCS:
        raise ConfigError(f"soc must be one of {', '.join(SOCS)}, got {config.soc!r}", key="soc")
    backend = config.attention_backend
    if backend is not None and not isinstance(backend, str):
        raise ConfigError(
            f"attention_backend must be a backend name ({', '.join(ATTENTION_BACKENDS)}), got {backend!r}",
            key="attention_backend",
        )
    if backend is not None and backend not in ATTENTION_BACKENDS:
        attention_backend_info(backend)  # raises with the valid names
    if config.performance_mode not in PERFORMANCE_MODES:
        raise ConfigError(
            f"performance_mode must be one of {', '.join(PERFORMANCE_MODES)}, got {config.performance_mode!r}",
            key="performance_mode",
        )
    if not isinstance(config.model, ModelSpec):
        raise ConfigError(f"model must be a ModelSpec, got {type(config.model).__name__}", key="model")
    for name, kind in (("ascend_compilation_config", AscendCompilationConfig),
                       ("xlite_graph_config", XliteGraphConfig)):
        if not isinstance(getattr(config, name), kind):
            raise ConfigError(f"{name} must be an {kind.__name__} (or pass additional_config={{{name!r}: {{...}}}} "
                              f"to GraphConfig.from_vllm_args), got {_short(getattr(config, name))}", key=name)
    ops = config.splitting_ops
    if ops is not None:
        if isinstance(ops, list):
            object.__setattr__(config, "splitting_ops", tuple(ops))
            ops = config.splitting_ops
        if not isinstance(ops, tuple) or not all(isinstance(op, str) for op in ops):
            raise ConfigError(f"splitting_ops must be a list of op names, got {_short(ops)}", key="splitting_ops")
    if not isinstance(config.parse_warnings, tuple):
        raise ConfigError(f"parse_warnings must be a tuple of strings, got {_short(config.parse_warnings)}",
                          key="parse_warnings")
    _check_kernel_chain(config.ascend_compilation_config)


def _check_token_budget(config: GraphConfig) -> None:
    """vLLM 0.32 SchedulerConfig: every running sequence needs a token of the step's budget."""
    tokens, seqs = config.max_num_batched_tokens, config.max_num_seqs
    if tokens < seqs:
        raise ConfigError(
            f"max_num_batched_tokens ({tokens}) must be greater than or equal to max_num_seqs ({seqs}). "
            f"Raise max_num_batched_tokens to at least {seqs} or lower max_num_seqs to at most {tokens}.",
            key="max_num_batched_tokens",
        )


def _check_kernel_chain(acc: AscendCompilationConfig) -> None:
    """docs/semantics.md §10: super kernel -> static kernel -> npugraph_ex, on the user's values."""
    if acc.enable_static_kernel and not acc.enable_npugraph_ex:
        raise ConfigError(STATIC_NEEDS_NPUGRAPH_EX, key="ascend_compilation_config.enable_static_kernel")
    if acc.super_kernel and not acc.enable_static_kernel:
        raise ConfigError(SUPER_NEEDS_STATIC, key="ascend_compilation_config.enable_super_kernel")
