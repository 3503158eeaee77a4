"""The contract table: every family's rules in one tuple (`RULES`), the rule sets a device
or hw/ treats specially, and the lookups (`rules_for`, `violations`, `message`, `check`)."""

from __future__ import annotations

from typing import Any, Mapping

from ascendgraph.attention_limits import TND_DECODE_QUERY_LEN_SOURCE
from ascendgraph.block_sizes import PAGED_BLOCK_SIZE_SOURCE
from ascendgraph.errors import KernelContractError
from ascendgraph.kernel_contracts.common import ATB_PAGED_ATTENTION, FIA, FIA_MAX_WORKSPACE, FIA_V2, KernelRule
from ascendgraph.kernel_contracts.fused_attention import _FIA_RULES
from ascendgraph.kernel_contracts.fused_attention_v2 import _FIA_V2_RULES
from ascendgraph.kernel_contracts.kv_cache import _RESHAPE_AND_CACHE_RULES, _SCATTER_RULES
from ascendgraph.kernel_contracts.model_layers import _MROPE_RULES, _ROPE_RULES, _SWIGLU_RULES
from ascendgraph.kernel_contracts.moe import _MOE_RULES
from ascendgraph.kernel_contracts.norms import _NORM_RULES
from ascendgraph.kernel_contracts.paged_attention import _ATB_PAGED_ATTENTION_RULES, _PAGED_ATTENTION_RULES
from ascendgraph.kernel_contracts.quantisation import _QUANT_RULES

# Rules relaxed by the simulator's declared float32 leniency (device option
# ``allow_float32_attention``, docs/decisions.md "float32 on the simulator"): the kernels' half-precision dtype rules.
FLOAT32_LENIENT_RULES = frozenset(
    {
        "query_dtype",
        "paged_kv_dtype",
        "cache_dtype",
        "rope_dtype",
        "input_dtype_half",
        "x_dtype_half",
        "v2_query_dtype",
        "pa_dtype",
        "scatter_dtypes_equal",
    }
)

RULES: tuple[KernelRule, ...] = (
    *_FIA_RULES,
    *_PAGED_ATTENTION_RULES,
    *_RESHAPE_AND_CACHE_RULES,
    *_ROPE_RULES,
    *_NORM_RULES,
    *_QUANT_RULES,
    *_FIA_V2_RULES,
    *_ATB_PAGED_ATTENTION_RULES,
    *_SCATTER_RULES,
    *_SWIGLU_RULES,
    *_MROPE_RULES,
    *_MOE_RULES,
)

KERNELS: tuple[str, ...] = tuple(dict.fromkeys(rule.kernel for rule in RULES))

# Rules whose limit is the simulator's model, not a card's (the workspace sizes of
# ascendgraph/workspace_sizes.py): the simulator enforces them, hw's pre-check on a card
# leaves them to CANN, which sized the workspace itself.
SIMULATOR_MODEL_RULES = frozenset(rule.name for rule in RULES if rule.name.endswith("workspace_too_small"))

# Rules a single kernel call cannot show, checked on the configuration (`ascendgraph.config`,
# torch-free modules): name -> source.
CONFIG_RULES: dict[str, str] = {
    "paged_block_size": PAGED_BLOCK_SIZE_SOURCE + " (configuration: the Q_S > 1 branch, every engine runs prefills)",
    "tnd_decode_query_len": TND_DECODE_QUERY_LEN_SOURCE,
}

# Overloads and helpers that take the base kernel's arguments (docs:8442 "inputs as
# npu_fused_infer_attention_score"; the .out overload adds workspace and out).
_ALIASES = {
    f"{FIA}.out": FIA,
    f"{FIA}.default": FIA,
    FIA_MAX_WORKSPACE: FIA,
    f"{FIA_V2}.out": FIA_V2,
    f"{FIA_V2}.default": FIA_V2,
    "_npu_fused_infer_attention_score_v2_get_max_workspace": FIA_V2,
    "_npu_paged_attention_get_workspace": ATB_PAGED_ATTENTION,
}


# kernel -> its rules in table order: every checked kernel call looks its rules up (thousands
# per run), so once here rather than a scan of the whole table per call.
_RULES_BY_KERNEL: dict[str, tuple[KernelRule, ...]] = {
    kernel: tuple(rule for rule in RULES if rule.kernel == kernel) for kernel in KERNELS
}


def rules_for(kernel: str) -> tuple[KernelRule, ...]:
    """The rules of one kernel (overloads and the workspace query share the base kernel's)."""
    return _RULES_BY_KERNEL.get(_ALIASES.get(kernel, kernel), ())


def violations(kernel: str, arguments: Mapping[str, Any]) -> list[KernelRule]:
    """The rules of ``kernel`` that apply to ``arguments`` and do not hold."""
    return [rule for rule in rules_for(kernel) if rule.applies(arguments) and not rule.holds(arguments)]


def message(kernel: str, rule: KernelRule, arguments: Mapping[str, Any]) -> str:
    return f"{kernel}: kernel contract {rule.name!r} violated: {rule.describe(arguments)} (source: {rule.source})"


def check(kernel: str, arguments: Mapping[str, Any]) -> None:
    """Raise KernelContractError for the first rule ``arguments`` violate (all are listed)."""
    broken = violations(kernel, arguments)
    if broken:
        lines = [message(kernel, rule, arguments) for rule in broken]
        raise KernelContractError("\n".join(lines), kernel=kernel, rules=tuple(rule.name for rule in broken))
