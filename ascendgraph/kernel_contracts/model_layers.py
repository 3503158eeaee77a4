"""The rules of the kernels a model's own layers issue: the rotary embedding
(`_npu_rotary_embedding`)."""

from __future__ import annotations

from typing import Any, Mapping

from ascendgraph.kernel_contracts.common import (
    HALF,
    ROTARY_EMBEDDING,
    SRC_ATB_SIGNATURE,
    SRC_ROPE_CALL,
    KernelRule,
    _contiguous,
    _dt,
    _present,
    _shape,
)


def _rope_layout_ok(a: Mapping[str, Any]) -> bool:
    """query and key are contiguous [T, heads * head_size] rows, with one position per token."""
    query, key = a["query"], a["key"]
    return (query.dim() == 2 and key.dim() == 2 and _contiguous(query) and _contiguous(key)
            and int(a["positions"].numel()) == int(query.shape[0]) == int(key.shape[0])
            and int(query.shape[1]) % int(a["head_size"]) == 0)


_ROPE_RULES = (
    KernelRule(ROTARY_EMBEDDING, "rope_dtype", f"{SRC_ROPE_CALL}; float16/bfloat16 assumed (no op doc in the wheel)",
               _present("query"), lambda a: a["query"].dtype in HALF and a["key"].dtype == a["query"].dtype,
               lambda a: f"query {_dt(a['query'])}, key {_dt(a['key'])}: need float16/bfloat16"),
    KernelRule(ROTARY_EMBEDDING, "rope_layout", f"{SRC_ROPE_CALL}; {SRC_ATB_SIGNATURE} (query/key rotated in place)",
               _present("query", "key", "positions"),
               _rope_layout_ok,
               lambda a: f"query {_shape(a['query'])}, key {_shape(a['key'])}, {int(a['positions'].numel())} positions, "
                         f"head_size {a['head_size']}: need contiguous [T, heads*head_size] and one position per token"),
    KernelRule(ROTARY_EMBEDDING, "rope_cache_width", f"{SRC_ROPE_CALL} (cos_sin_cache rows hold head_size values)",
               _present("cos_sin_cache"), lambda a: int(a["cos_sin_cache"].shape[-1]) == int(a["head_size"]),
               lambda a: f"cos_sin_cache last dim {int(a['cos_sin_cache'].shape[-1])} != head_size {a['head_size']}"),
)
