"""How much workspace an attention kernel call needs: the simulator's model, one formula for every query and check.

Why. torch_npu's workspace queries (``_npu_fused_infer_attention_score_get_max_workspace``,
its ``_v2`` twin, ATB's ``_npu_paged_attention_get_workspace``) ask CANN's tiling how many
bytes a call needs (Ascend/op-plugin ``op_plugin/ops/opapi/FusedInferAttentionScoreKernelNpuOpApi.cpp``:
``EXEC_GET_MAX_WORKSPACE_CMD(aclnnFusedInferAttentionScoreV3, ...)`` returns a byte count,
handed back as a tensor of that many elements of the query's dtype). The ``.out`` kernels
then run in the caller's workspace (their registered schemas take ``Tensor? workspace``),
so a workspace queried for one call and handed to a call that needs more is too small.
The tiling code is not public, so the byte count is a model (docs/facade.md, "What is
approximated"):

    bytes = WORKSPACE_BASE_BYTES + rows * splits * (Dv + 2) * 4   (+ 4 per query head with a sink)

``rows`` are the query's (token, head) rows, ``Dv`` the value head dim and ``splits`` the
key/value axis cut into pieces of `KV_SPLIT_POSITIONS` positions (a split-KV kernel keeps a
float32 partial output and its running max and sum per row and split). The span is what
the call's *shapes* allow: for a paged cache the block table's columns times the block
size, else the key's S axis. The host lists (``actual_seq_lengths*``) do not enter: the
query is named "get max workspace" and vLLM Ascend queries it once at capture with a dummy
batch's lengths and re-issues every step's lengths into it (attention_v1.py@182b75ea
``full_graph_fia``: query at 972-1015, re-issue at 1062-1081; ``update_graph_params``:
888-910), which a card runs. So the model grows, and only grows, with the query's tokens
and heads, the value head dim, the block table's width (or the key's length) and the
block size; nothing else changes it.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

__all__ = [
    "WORKSPACE_BASE_BYTES",
    "KV_SPLIT_POSITIONS",
    "fused_attention_workspace_bytes",
    "paged_attention_workspace_bytes",
    "paged_attention_op_workspace_bytes",
    "tensor_bytes",
]

WORKSPACE_BASE_BYTES = 16 * 1024  # tiling data and synchronisation flags, whatever the shapes
KV_SPLIT_POSITIONS = 2048  # key/value positions per split of the KV axis


def tensor_bytes(tensor: Any) -> int:
    """Bytes of a tensor (or a `TensorSpec`-like stand-in with ``numel`` and ``dtype``)."""
    dtype = tensor.dtype
    itemsize = dtype.itemsize if hasattr(dtype, "itemsize") else 1
    return int(tensor.numel()) * int(itemsize)


def _model(rows: int, value_dim: int, kv_span: int, sink_heads: int = 0) -> int:
    splits = max(1, math.ceil(max(kv_span, 1) / KV_SPLIT_POSITIONS))
    return WORKSPACE_BASE_BYTES + rows * splits * (value_dim + 2) * 4 + 4 * sink_heads


def _layout_s_axis(layout: str) -> int:
    return 2 if layout in ("BNSD", "BNSD_BSND") else 1


def fused_attention_workspace_bytes(a: Mapping[str, Any], *, v2: bool = False) -> int:
    """Bytes the fused attention (v1, or v2 with ``v2=True``) needs for a call, its
    arguments keyed by the schema's names."""
    query, key, value = a["query"], a["key"], a["value"]
    layout = str(a.get("input_layout", "BSH"))
    heads = int(a.get("num_query_heads" if v2 else "num_heads", 1) or 1)
    kv_heads = int(a.get("num_key_value_heads") or 0) or heads
    head_dim = int(query.shape[-1])
    rows = int(query.numel()) // max(head_dim, 1)
    if layout == "BSH":
        rows *= heads  # [B, S, N*D]: one row per (token, head)
    table: Optional[Any] = a.get("block_table")
    if table is not None:
        value_dim = int(value.shape[-1]) // kv_heads if value.dim() == 3 else int(value.shape[-1])
        kv_span = int(table.shape[-1]) * int(a.get("block_size", 0) or 0) if table.dim() == 2 else 0
    else:
        value_dim = int(value.shape[-1]) // kv_heads if layout == "BSH" else int(value.shape[-1])
        kv_span = int(key.shape[0]) if layout == "TND" else int(key.shape[_layout_s_axis(layout)])
    sink = a.get("learnable_sink") if v2 else None
    return _model(rows, value_dim, kv_span, heads if sink is not None else 0)


def paged_attention_workspace_bytes(a: Mapping[str, Any]) -> int:
    """Bytes ATB's ``_npu_paged_attention`` needs: one query token per request over the
    ``[blocks, block_size, kv_heads, D]`` caches, ``context_lens`` up to the table's span."""
    query, key_cache, table = a["query"], a["key_cache"], a["block_table"]
    rows = int(query.shape[0]) * int(a.get("num_heads", 1) or 1)
    kv_span = int(table.shape[-1]) * int(key_cache.shape[1]) if table.dim() == 2 and key_cache.dim() == 4 else 0
    return _model(rows, int(key_cache.shape[-1]), kv_span)


def paged_attention_op_workspace_bytes(query: Any, key_cache: Any, block_table: Any) -> int:
    """Bytes of ``ascendgraph::attention_workspace``: the fused attention's need for the TND
    call its ``paged_attention`` becomes (`ascendgraph.kernel_calls`: caches
    ``[blocks, block_size, kv_heads, D]`` viewed as ``(blocknum, blocksize, H)``)."""
    rows = int(query.shape[0]) * int(query.shape[1]) if query.dim() == 3 else int(query.numel())
    kv_span = int(block_table.shape[-1]) * int(key_cache.shape[1]) if key_cache.dim() == 4 else 0
    return _model(rows, int(key_cache.shape[-1]), kv_span)
