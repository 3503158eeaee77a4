"""Small decoder models and the tables that describe them (presets, attention backends)."""

from ascendgraph.models.backends import ATTENTION_BACKENDS, AttentionBackendInfo, attention_backend_info
from ascendgraph.models.presets import DEFAULT_PRESET, PRESETS, ModelSpec, model_spec_from

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackendInfo",
    "attention_backend_info",
    "DEFAULT_PRESET",
    "PRESETS",
    "ModelSpec",
    "model_spec_from",
]
