"""XliteGraph: configuration checks and the architecture registry (SEMANTICS.md §11).

XliteGraph is an alternative graph path: batches that fit xlite's preallocated token
budget run on the xlite runtime, larger ones on the native runnable (ACLGraph or eager).
This module owns the validation and the supported-architecture table; routing and the
budget sit beside them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ascendgraph.errors import XliteConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.config import GraphConfig

__all__ = [
    "XLITE_ARCHITECTURES",
    "XLITE_SPEC_DECODE_ERROR",
    "XLITE_PIPELINE_PARALLEL_ERROR",
    "XLITE_BLOCK_SIZE",
    "validate_xlite",
]

XLITE_SPEC_DECODE_ERROR = "Xlite graph mode only support speculative decoding with num_speculative_tokens=1."
XLITE_PIPELINE_PARALLEL_ERROR = (
    "Xlite graph mode is not compatible with pipeline parallelism. Please set pipeline_parallel_size to 1."
)
XLITE_BLOCK_SIZE = 128
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
