"""The one place every facade kernel checks its arguments: the kernel-contract table.

`check(kernel, arguments)` hands the call (arguments keyed by torch_npu's schema keyword
names) to `ascendgraph.kernel_contracts.check`, which raises `KernelContractError` naming
the rule, the values and the source. Until that table is importable the facade applies
the interim rules below (the FIA TND rules the hw/ fixes depend on), so the seam exists
from the start and is wired to the table by one import.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Optional

__all__ = ["check", "table_check"]


def _interim(kernel: str, arguments: Mapping[str, Any]) -> None:
    if kernel != "npu_fused_infer_attention_score" or arguments.get("input_layout") != "TND":
        return
    ends = [int(v) for v in (arguments.get("actual_seq_lengths") or [])]
    query = arguments["query"]
    if ends and int(query.shape[0]) != ends[-1]:
        raise RuntimeError(
            f"{kernel}: TND layout needs query.shape[0] == actual_seq_lengths[-1], got {int(query.shape[0])} "
            f"tokens and actual_seq_lengths {ends} (vLLM Ascend _pad_query_start_loc_for_fia)"
        )
    table = arguments.get("block_table")
    if table is not None and int(table.shape[0]) != len(ends):
        raise RuntimeError(
            f"{kernel}: block_table needs one row per request ({len(ends)}), got {int(table.shape[0])} "
            "(torch_npu _op_plugin_docs.py:8223)"
        )


def table_check() -> Callable[[str, Mapping[str, Any]], None]:
    """The contract table's check, or the interim rules when it is not there yet."""
    try:
        from ascendgraph.kernel_contracts import check as contract_check
    except ImportError:
        return _interim
    return contract_check


_CHECK: Optional[Callable[[str, Mapping[str, Any]], None]] = None


def check(kernel: str, arguments: Mapping[str, Any]) -> None:
    global _CHECK
    if _CHECK is None:
        _CHECK = table_check()
    _CHECK(kernel, arguments)
