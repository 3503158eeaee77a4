"""The rules of paged attention: the level our op ``ascendgraph::paged_attention`` implies
for hw/'s mapping onto the fused attention (cache layout, output like the query), and ATB's
`_npu_paged_attention` (vLLM Ascend's decode-only paged attention)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ascendgraph.kernel_contracts.common import (
    ATB_PAGED_ATTENTION,
    DOCS,
    HALF,
    PAGED_ATTENTION_OP,
    SRC_PA_CALL,
    KernelRule,
    _always,
    _contiguous,
    _dt,
    _present,
    _shape,
    _workspace_rule,
)
from ascendgraph.workspace_sizes import paged_attention_workspace_bytes


def _paged_cache_layout_ok(a: Mapping[str, Any]) -> bool:
    """The query is [T, heads, D]; the caches are two equal [blocks, block_size, kv_heads, D]."""
    key_cache, query = a["key_cache"], a["query"]
    return (key_cache.dim() == 4 and _shape(key_cache) == _shape(a["value_cache"]) and query.dim() == 3
            and int(query.shape[-1]) == int(key_cache.shape[-1]))


def _out_like_query(a: Mapping[str, Any]) -> bool:
    """``out`` is contiguous, with the query's shape and dtype."""
    return _shape(a["out"]) == _shape(a["query"]) and a["out"].dtype == a["query"].dtype and _contiguous(a["out"])


_PAGED_ATTENTION_RULES = (
    KernelRule(PAGED_ATTENTION_OP, "paged_cache_layout", "hw/kernels.py _paged_attention: caches "
               "[num_blocks, block_size, kv_heads, head_dim] viewed as FIA's (blocknum, blocksize, H)",
               _always, _paged_cache_layout_ok,
               lambda a: f"query {_shape(a['query'])}, key_cache {_shape(a['key_cache'])}, value_cache "
                         f"{_shape(a['value_cache'])}: need [T, heads, D] and two equal [blocks, block_size, kv_heads, D]"),
    KernelRule(PAGED_ATTENTION_OP, "out_like_query", f"{DOCS}:8147 (attention_out has the query's shape); hw passes "
               "out=[out, lse]", _always,
               _out_like_query,
               lambda a: f"out {_shape(a['out'])} {_dt(a['out'])} (contiguous={_contiguous(a['out'])}) vs query "
                         f"{_shape(a['query'])} {_dt(a['query'])}"),
    KernelRule(PAGED_ATTENTION_OP, "cache_dtype_like_query", "hw/kernels.py _paged_attention (no quantised "
               f"KV: the caches share the query dtype); {DOCS}:8221 (no antiquant with page attention)",
               _always, lambda a: a["key_cache"].dtype == a["query"].dtype == a["value_cache"].dtype,
               lambda a: f"query {_dt(a['query'])}, key_cache {_dt(a['key_cache'])}, value_cache {_dt(a['value_cache'])}"),
)


def _pa_layout_ok(a: Mapping[str, Any]) -> bool:
    """The paged cache layout, with the heads named: query a contiguous [T, num_heads, D], the
    caches two equal [blocks, block_size, num_kv_heads, D]."""
    return (_paged_cache_layout_ok(a) and int(a["query"].shape[1]) == int(a["num_heads"])
            and int(a["key_cache"].shape[2]) == int(a["num_kv_heads"]) and _contiguous(a["query"]))


def _pa_one_token_per_request(a: Mapping[str, Any]) -> bool:
    """An int32 2-D block_table with one row per query token, and one context length per row."""
    table, tokens = a["block_table"], int(a["query"].shape[0])
    return (table.dtype == torch.int32 and table.dim() == 2 and int(table.shape[0]) == tokens
            and int(a["context_lens"].numel()) == tokens)


_ATB_PAGED_ATTENTION_RULES = (
    KernelRule(ATB_PAGED_ATTENTION, "pa_dtype", f"{SRC_PA_CALL}: the non-quantised op (quantised KV has "
               "_npu_paged_attention_quant); query and caches share one float16/bfloat16 dtype",
               _present("query", "key_cache", "value_cache"),
               lambda a: a["query"].dtype in HALF and a["key_cache"].dtype == a["query"].dtype == a["value_cache"].dtype,
               lambda a: f"query {_dt(a['query'])}, key_cache {_dt(a['key_cache'])}, value_cache {_dt(a['value_cache'])}"),
    KernelRule(ATB_PAGED_ATTENTION, "pa_layout", f"{SRC_PA_CALL}: query [T, num_heads, D]; caches "
               "[blocks, block_size, num_kv_heads, D] (AscendAttentionBackend.get_kv_cache_shape)",
               _present("query", "key_cache", "value_cache"),
               _pa_layout_ok,
               lambda a: f"query {_shape(a['query'])} (num_heads {a['num_heads']}), key_cache {_shape(a['key_cache'])}, "
                         f"value_cache {_shape(a['value_cache'])} (num_kv_heads {a['num_kv_heads']})"),
    KernelRule(ATB_PAGED_ATTENTION, "pa_gqa", f"{SRC_PA_CALL} (AscendAttentionBackendImpl asserts num_heads % "
               "num_kv_heads == 0)",
               _always, lambda a: int(a["num_kv_heads"]) > 0 and int(a["num_heads"]) % int(a["num_kv_heads"]) == 0,
               lambda a: f"num_heads={a['num_heads']}, num_kv_heads={a['num_kv_heads']}"),
    KernelRule(ATB_PAGED_ATTENTION, "pa_one_token_per_request", f"{SRC_PA_CALL}: decode only (DecodeOnly state); "
               "block_table int32 2-D with one row per query token, context_lens one entry per row",
               _present("query", "block_table", "context_lens"),
               _pa_one_token_per_request,
               lambda a: f"query has {int(a['query'].shape[0])} tokens, block_table {_shape(a['block_table'])} "
                         f"{_dt(a['block_table'])}, context_lens of {int(a['context_lens'].numel())}"),
    KernelRule(ATB_PAGED_ATTENTION, "pa_context_lens_int32", f"{SRC_PA_CALL} (context_lens is the int32 seq_lens "
               "host tensor)",
               _present("context_lens"), lambda a: a["context_lens"].dtype == torch.int32,
               lambda a: f"context_lens dtype is {_dt(a['context_lens'])}, not int32"),
    KernelRule(ATB_PAGED_ATTENTION, "pa_out_like_query", f"{SRC_PA_CALL} (out is the layer's output buffer "
               "[T, num_heads, D])",
               _present("out", "query"),
               _out_like_query,
               lambda a: f"out {_shape(a['out'])} {_dt(a['out'])} vs query {_shape(a['query'])} {_dt(a['query'])}"),
    _workspace_rule(ATB_PAGED_ATTENTION, "pa_", paged_attention_workspace_bytes, "_npu_paged_attention_get_workspace",
                    f"{SRC_PA_CALL} (full_graph_pa queries _npu_paged_attention_get_workspace once per capture size "
                    "and hands it to every launch); the formula is the simulator's model, ascendgraph/workspace_sizes.py "
                    "(docs/facade.md, \"What is approximated\")"),
)
