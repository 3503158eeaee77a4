"""Model dimensions: the preset table and parsing of a Hugging Face ``config.json``.

Only dimensions and graph-relevant traits live here (the resolution and the planner need
them); the engine builds real modules from a `ModelSpec` in `ascendgraph.models.build`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Callable, Mapping, Optional

from ascendgraph.errors import ConfigError
from ascendgraph.readers import load_json, read_text_file, shown

__all__ = [
    "ModelSpec",
    "PRESETS",
    "DEFAULT_PRESET",
    "model_spec_from",
    "preset_for_architecture",
    "check_model_dimensions",
]


@dataclass(frozen=True)
class ModelSpec:
    """What ascendgraph needs to know about a model."""

    name: str
    architecture: str
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float = 1e-6
    qk_norm: bool = False
    attention: str = "mha"  # "mha" or "mla"
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    is_moe: bool = False
    num_experts: int = 0
    num_experts_per_tok: int = 0
    is_encoder_decoder: bool = False
    is_pooling: bool = False
    max_position_embeddings: int = 4096
    rope_theta: float = 1_000_000.0
    # Dimensions the model argument did not give (resolution needs only the architecture, the
    # layer count and the model flags); placeholders stand in, and building weights refuses.
    missing_dimensions: tuple[str, ...] = ()

    def require_dimensions(self) -> None:
        """Building weights needs real dimensions: ConfigError naming the first missing one."""
        if self.missing_dimensions:
            key = self.missing_dimensions[0]
            raise ConfigError(
                f"model {self.name!r}: missing {key!r} (an integer), needed to build the weights; give the model's "
                f"dimensions ({', '.join(self.missing_dimensions)}) or a config.json that has them",
                key=key,
            )

    def __post_init__(self) -> None:
        check_model_dimensions({f.name: getattr(self, f.name) for f in fields(self)}, source=f"model {self.name!r}")

    @property
    def natural_attention_backend(self) -> str:
        """The backend a model of this kind uses on Ascend by default."""
        return "mla" if self.attention == "mla" else "ascend"

    def with_layers(self, num_hidden_layers: Optional[int]) -> "ModelSpec":
        if num_hidden_layers is None:
            return self
        if isinstance(num_hidden_layers, bool) or not isinstance(num_hidden_layers, int) or num_hidden_layers < 1:
            raise ConfigError(
                f"num_layers must be an integer >= 1, got {num_hidden_layers!r}", key="num_layers"
            )
        return replace(self, num_hidden_layers=num_hidden_layers)


# --------------------------------------------------------------------------- dimension checks
# What the model builder (ascendgraph.models.build) relies on, checked when a spec is made so
# that `explain` and `plan` reject a model `run` could not build (instead of a kernel traceback).

_POSITIVE_INT_FIELDS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
)
_NON_NEGATIVE_INT_FIELDS = ("kv_lora_rank", "qk_rope_head_dim", "num_experts", "num_experts_per_tok")
ATTENTION_KINDS = ("mha", "mla")


def _divisors(value: int, limit: int = 8) -> str:
    found = [d for d in range(1, min(value, 4096) + 1) if value % d == 0]
    return ", ".join(str(d) for d in found[:limit]) + (", ..." if len(found) > limit else "")


def _kv_heads_divide_heads(v: Mapping[str, Any], source: str) -> Optional[str]:
    heads, kv_heads = v["num_attention_heads"], v["num_key_value_heads"]
    if v["attention"] == "mla" or heads % kv_heads == 0:
        return None
    return (
        f"{source}: num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads}): "
        f"each kv head serves an equal group of query heads; use a num_key_value_heads that divides {heads} "
        f"({_divisors(heads)})"
    )


def _head_dim_even(v: Mapping[str, Any], source: str) -> Optional[str]:
    head_dim, hidden, heads = v["head_dim"], v["hidden_size"], v["num_attention_heads"]
    if v["attention"] == "mla" or head_dim % 2 == 0:
        return None
    derived = f" (= hidden_size // num_attention_heads = {hidden} // {heads})" if hidden // heads == head_dim else ""
    return (
        f"{source}: head_dim must be even (rotary embedding rotates pairs of dimensions), got {head_dim}{derived}; "
        "give an even head_dim, or a hidden_size and num_attention_heads whose quotient is even"
    )


def _mla_latent(v: Mapping[str, Any], source: str) -> Optional[str]:
    if v["attention"] != "mla" or v["kv_lora_rank"] >= 1:
        return None
    return (
        f"{source}: attention 'mla' needs kv_lora_rank >= 1 (the width of the compressed KV latent), "
        f"got {v['kv_lora_rank']}; give kv_lora_rank (DeepSeek-V3 uses 512) or use attention 'mha'"
    )


def _mla_rope(v: Mapping[str, Any], source: str) -> Optional[str]:
    rope = v["qk_rope_head_dim"]
    if v["attention"] != "mla" or (rope >= 2 and rope % 2 == 0):
        return None
    return (
        f"{source}: attention 'mla' (kv_lora_rank {v['kv_lora_rank']}) needs an even qk_rope_head_dim >= 2 "
        f"(rotary embedding rotates pairs of dimensions), got {rope}; give qk_rope_head_dim (DeepSeek-V3 uses 64)"
    )


def _experts_per_token(v: Mapping[str, Any], source: str) -> Optional[str]:
    experts, per_token = v["num_experts"], v["num_experts_per_tok"]
    if not experts or per_token <= experts:
        return None
    return f"{source}: num_experts_per_tok must be at most the number of experts ({experts}), got {per_token}"


# (key the error names, check returning the message or None), in the order they are tried.
DIMENSION_RULES: tuple[tuple[str, Callable[[Mapping[str, Any], str], Optional[str]]], ...] = (
    ("num_key_value_heads", _kv_heads_divide_heads),
    ("head_dim", _head_dim_even),
    ("kv_lora_rank", _mla_latent),
    ("qk_rope_head_dim", _mla_rope),
    ("num_experts_per_tok", _experts_per_token),
)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


MAX_MODEL_LAYERS = 1024  # the same bound as --num-layers (ascendgraph.cli.args.LIMITS)


def check_model_dimensions(values: Mapping[str, Any], *, source: str) -> None:
    """Raise a ConfigError naming the field when ``values`` (ModelSpec fields) cannot be built."""
    for name, lowest in [(n, 1) for n in _POSITIVE_INT_FIELDS] + [(n, 0) for n in _NON_NEGATIVE_INT_FIELDS]:
        value = values[name]
        if not _is_int(value) or value < lowest:
            raise ConfigError(f"{source}: {name} must be an integer >= {lowest}, got {value!r}", key=name)
    if values["num_hidden_layers"] > MAX_MODEL_LAYERS:  # the --num-layers bound, for config.json too
        raise ConfigError(f"{source}: num_hidden_layers is {values['num_hidden_layers']}; at most {MAX_MODEL_LAYERS} "
                          "layers are modelled (no real model has more); check the file", key="num_hidden_layers")
    if values["attention"] not in ATTENTION_KINDS:
        raise ConfigError(
            f"{source}: attention must be one of {', '.join(ATTENTION_KINDS)}, got {values['attention']!r}",
            key="attention",
        )
    for key, rule in DIMENSION_RULES:
        message = rule(values, source)
        if message is not None:
            raise ConfigError(message, key=key)


_TINY: dict[str, Any] = dict(
    num_hidden_layers=4,
    hidden_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=128,
    intermediate_size=1024,
    vocab_size=2048,
)

PRESETS: dict[str, ModelSpec] = {
    "tiny": ModelSpec(name="tiny", architecture="Qwen3ForCausalLM", qk_norm=True, **_TINY),
    "tiny-llama": ModelSpec(name="tiny-llama", architecture="LlamaForCausalLM", **_TINY),
    "tiny-mla": ModelSpec(
        name="tiny-mla",
        architecture="DeepseekV3ForCausalLM",
        attention="mla",
        kv_lora_rank=256,
        qk_rope_head_dim=64,
        **_TINY,
    ),
    "tiny-moe": ModelSpec(
        name="tiny-moe",
        architecture="Qwen3MoeForCausalLM",
        qk_norm=True,
        is_moe=True,
        num_experts=8,
        num_experts_per_tok=2,
        **_TINY,
    ),
    "qwen3-0.6b": ModelSpec(
        name="qwen3-0.6b",
        architecture="Qwen3ForCausalLM",
        num_hidden_layers=28,
        hidden_size=1024,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        qk_norm=True,
        max_position_embeddings=40960,
    ),
}
DEFAULT_PRESET = "tiny"

# Architectures whose name marks an embedding / classification (pooling) model.
_POOLING_SUFFIXES = ("ForSequenceClassification", "ForEmbedding", "EmbeddingModel", "ForRewardModel", "ForTokenClassification")
_ENCODER_DECODER_ARCHS = ("BartForConditionalGeneration", "T5ForConditionalGeneration", "WhisperForConditionalGeneration", "MllamaForConditionalGeneration")


def preset_for_architecture(architecture: str) -> Optional[str]:
    """The first preset whose architecture matches (used for pasted `vllm serve` lines)."""
    for name, spec in PRESETS.items():
        if spec.architecture == architecture:
            return name
    return None


def _int_field(raw: Mapping[str, Any], key: str, source: str, default: Optional[int] = None) -> int:
    value = raw.get(key, default)
    if value is None:
        raise ConfigError(f"{source}: missing {key!r} (an integer)", key=key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{source}: {key} must be an integer >= 1, got {value!r}", key=key)
    return value


def _optional_int_field(
    raw: Mapping[str, Any], keys: tuple[str, ...], source: str, *, default: int, minimum: int
) -> int:
    """The first of ``keys`` present and not null: an integer >= ``minimum``; ``default`` when none is."""
    for key in keys:
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigError(f"{source}: {key} must be an integer >= {minimum}, got {value!r}", key=key)
        return value
    return default


def _positive_number_field(raw: Mapping[str, Any], keys: tuple[str, ...], source: str, *, default: float) -> float:
    """The first of ``keys`` present and not null: a finite number > 0; ``default`` when none is."""
    for key in keys:
        value = raw.get(key)
        if value is None:
            continue
        number: Optional[float] = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer too large for a float
                number = None
        if number is None or not math.isfinite(number) or number <= 0:
            raise ConfigError(f"{source}: {key} must be a finite number > 0, got {value!r}", key=key)
        return number
    return default


# Dimensions a model argument may leave out (resolution does not need them; weights do).
_REQUIRED_DIMENSIONS = ("hidden_size", "num_attention_heads", "vocab_size")
_DIMENSION_FIELDS = ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
                     "vocab_size")

# Aliases Hugging Face configs use for the same field (first present wins).
_EPS_KEYS = ("rms_norm_eps", "layer_norm_epsilon")
_EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")


def spec_from_hf_config(raw: Mapping[str, Any], *, source: str = "model config") -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config.json dictionary (or our own field names)."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}", key="model")
    archs = raw.get("architectures")
    architecture = raw.get("architecture")
    if architecture is None:
        if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
            raise ConfigError(
                f"{source}: missing 'architectures' (a list such as [\"Qwen3ForCausalLM\"])",
                key="architectures",
            )
        architecture = archs[0]
    if not isinstance(architecture, str):
        raise ConfigError(f"{source}: architecture must be a string, got {architecture!r}", key="architecture")
    text_config = raw.get("text_config")
    if isinstance(text_config, Mapping) and "num_hidden_layers" not in raw:
        merged = dict(text_config)
        merged["architecture"] = architecture
        return spec_from_hf_config(merged, source=source)
    layers = _int_field(raw, "num_hidden_layers", source)
    missing = tuple(key for key in _REQUIRED_DIMENSIONS if raw.get(key) is None)
    if missing:  # not needed to resolve: placeholders of the default preset, refused when weights are built
        reference = PRESETS[DEFAULT_PRESET]
        raw = {**raw, **{key: getattr(reference, key) for key in _DIMENSION_FIELDS if raw.get(key) is None}}
    hidden = _int_field(raw, "hidden_size", source)
    heads = _int_field(raw, "num_attention_heads", source)
    kv_heads = _int_field(raw, "num_key_value_heads", source, default=heads)
    head_dim = _optional_int_field(raw, ("head_dim",), source, default=hidden // heads, minimum=1)
    if head_dim < 1:  # derived: hidden_size < num_attention_heads
        raise ConfigError(
            f"{source}: head_dim = hidden_size // num_attention_heads = {hidden} // {heads} = {head_dim}; "
            "give head_dim (an integer >= 1) or a hidden_size of at least num_attention_heads",
            key="head_dim",
        )
    intermediate = _int_field(raw, "intermediate_size", source, default=4 * hidden)
    vocab = _int_field(raw, "vocab_size", source)
    eps = _positive_number_field(raw, _EPS_KEYS, source, default=1e-6)
    experts = _optional_int_field(raw, _EXPERT_KEYS, source, default=0, minimum=0)
    experts_per_tok = _optional_int_field(raw, ("num_experts_per_tok",), source, default=0, minimum=0)
    kv_lora_rank = _optional_int_field(raw, ("kv_lora_rank",), source, default=0, minimum=0)
    qk_rope_head_dim = _optional_int_field(raw, ("qk_rope_head_dim",), source, default=0, minimum=0)
    max_positions = _optional_int_field(raw, ("max_position_embeddings",), source, default=4096, minimum=1)
    rope_theta = _positive_number_field(raw, ("rope_theta",), source, default=1_000_000.0)
    is_mla = bool(kv_lora_rank) or raw.get("attention") == "mla"
    values: dict[str, Any] = dict(
        # escaped: a name from a file is printed in reports (no newline, ESC or lone surrogate)
        name=shown(str(raw.get("name") or raw.get("_name_or_path") or architecture)),
        architecture=architecture,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=intermediate,
        vocab_size=vocab,
        rms_norm_eps=eps,
        qk_norm=bool(raw.get("qk_norm", architecture.startswith("Qwen3"))),
        attention="mla" if is_mla else "mha",
        kv_lora_rank=kv_lora_rank,
        qk_rope_head_dim=qk_rope_head_dim,
        is_moe=bool(raw.get("is_moe", bool(experts))),
        num_experts=experts,
        num_experts_per_tok=experts_per_tok,
        is_encoder_decoder=bool(raw.get("is_encoder_decoder", architecture in _ENCODER_DECODER_ARCHS)),
        is_pooling=bool(raw.get("is_pooling", architecture.endswith(_POOLING_SUFFIXES))),
        max_position_embeddings=max_positions,
        rope_theta=rope_theta,
        missing_dimensions=missing,
    )
    check_model_dimensions(values, source=source)  # named after the file, before ModelSpec checks again
    return ModelSpec(**values)


def local_config_path(text: str) -> Optional[str]:
    """The config.json a model argument names (the file itself, or ``config.json`` in the
    folder), or None when nothing is there. Something there that is not a regular file is
    returned too: reading it (`ascendgraph.readers.read_text_file`) refuses it by name. A folder
    that cannot be entered is a ConfigError saying so (not "has no config.json")."""
    local = os.path.expanduser(text)
    if os.path.isdir(local):
        candidate = os.path.join(local, "config.json")
        try:
            os.stat(candidate)
        except FileNotFoundError:
            return None
        except PermissionError:
            raise ConfigError(f"model folder {text!r} cannot be entered (permission denied); make it readable "
                              "or pass the config.json file itself", key="model") from None
        except OSError:
            return candidate if os.path.lexists(candidate) else None
        return candidate
    return local if os.path.lexists(local) else None


def model_spec_from(model: Any) -> ModelSpec:
    """A ModelSpec from a preset name, a config.json path (file or folder), a dict, or a spec."""
    if model is None:
        return PRESETS[DEFAULT_PRESET]
    if isinstance(model, ModelSpec):
        return model
    if isinstance(model, Mapping):
        return spec_from_hf_config(model, source="model dict")
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if text in PRESETS:
            return PRESETS[text]
        path = local_config_path(text)
        if path is not None:
            where = f"model config {path}"
            raw = load_json(read_text_file(path, where, key="model", kind="JSON config.json"), where, key="model")
            return spec_from_hf_config(raw, source=path)
        raise ConfigError(
            f"unknown model {text!r}: give a preset ({', '.join(PRESETS)}) or the path of a "
            "Hugging Face config.json (or its folder)",
            key="model",
        )
    raise ConfigError(f"model must be a preset name, a config.json path or a dict, got {type(model).__name__}", key="model")
