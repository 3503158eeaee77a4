"""Declared leniencies: where the simulator runs what an NPU would refuse, on purpose.

The simulator refuses what torch_npu's kernels refuse; the one exception a user can ask for is
float32 (docs/decisions.md "float32 on the simulator"): ``--dtype float32`` on the sim device turns on the device option
``allow_float32_attention``. Every surface that can be affected says so under "lenient": the
run's report and ``ascendgraph explain``. On npu float32 is refused before anything is built.
This module holds the texts and the rule, so the two surfaces cannot drift apart.
"""

from __future__ import annotations

from ascendgraph.errors import ConfigError

__all__ = [
    "FLOAT32_ATTENTION_WARNING",
    "LENIENT_FLOAT32",
    "FLOAT32_ON_NPU",
    "declared_leniencies",
]

FLOAT32_ATTENTION_WARNING = "float32 attention would be refused on an NPU"
LENIENT_FLOAT32 = (
    "float32 attention (sim device option allow_float32_attention): the fused attention, rope, KV cache "
    "and quant kernels take float16/bfloat16 on an NPU"
)
FLOAT32_ON_NPU = (
    "--dtype float32 is refused on npu: torch_npu's fused attention takes float16/bfloat16; "
    "use --dtype bfloat16 (float32 exists only as a declared leniency of --device sim)"
)


def declared_leniencies(dtype: str, device: str) -> list[str]:
    """What the simulator will run leniently for ``dtype`` on ``device`` ("sim" or "npu").

    ConfigError (exit 2) for float32 on npu: no leniency exists there."""
    if dtype != "float32":
        return []
    if device == "npu":
        raise ConfigError(FLOAT32_ON_NPU, key="dtype")
    return [LENIENT_FLOAT32]
