"""The rules of `npu_fused_infer_attention_score_v2`: the fused attention vLLM Ascend's
A2/A3 FULL graphs issue (full_graph_fia_v2), in its own argument names (``actual_seq_qlen``,
``num_query_heads``...), with the rules v2 shares with v1 (`fused_semantics`)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ascendgraph.block_sizes import PAGED_BLOCK_SIZE_SOURCE, describe_paged_block_size, paged_block_size_ok
from ascendgraph.kernel_contracts.common import (
    DOCS,
    FIA_V2,
    HALF,
    SRC_FIA_PAD,
    SRC_FIA_V2_CALL,
    SRC_ZERO_KV,
    KernelRule,
    _always,
    _contiguous,
    _dt,
    _ints,
    _paged,
    _present,
    _shape,
    _tnd,
)
from ascendgraph.kernel_contracts.fused_semantics import (
    FIA_V2_ARGUMENTS,
    V2_LAYOUTS,
    _V2_LINES,
    _describe_causal_mask,
    _fused_semantics_rules,
    _int8_in,
    _mask_ok,
    _nondecreasing,
    _q_s_gt_1_limits,
)


def _v2_value_head_dim(a: Mapping[str, Any]) -> int:
    """D of value: a paged cache in the (blocknum, blocksize, H) layout holds KV_N * D per slot."""
    value = a["value"]
    if _paged(a) and value.dim() == 3:
        return int(value.shape[-1]) // max(FIA_V2_ARGUMENTS.kv_heads(a), 1)
    return int(value.shape[-1])


def _v2_kv_covers_q(a: Mapping[str, Any]) -> bool:
    """Every request's KV length covers its query length, or is 0 (a padded request)."""
    return all(k == 0 or k >= q for q, k in zip(FIA_V2_ARGUMENTS.q_lens(a), _ints(a["actual_seq_kvlen"])))


def _v2_tnd_lengths_ok(a: Mapping[str, Any]) -> bool:
    """Both length lists given: cumulative query ends, one non-negative KV length per request."""
    if a.get("actual_seq_qlen") is None or a.get("actual_seq_kvlen") is None:
        return False
    kv = _ints(a["actual_seq_kvlen"])
    return _nondecreasing(FIA_V2_ARGUMENTS.q_ends(a)) and len(kv) == len(FIA_V2_ARGUMENTS.q_ends(a)) and all(v >= 0 for v in kv)


def _v2_block_table_ok(a: Mapping[str, Any]) -> bool:
    """block_table is int32, 2-D, with one row per request."""
    table = a["block_table"]
    return table.dtype == torch.int32 and table.dim() == 2 and int(table.shape[0]) == FIA_V2_ARGUMENTS.batch(a)


def _v2_learnable_sink_ok(a: Mapping[str, Any]) -> bool:
    """learnable_sink is bfloat16 of shape (Q_N,), with a TND call whose value D is at most 128."""
    sink = a["learnable_sink"]
    return (sink.dtype == torch.bfloat16 and _shape(sink) == (int(a.get("num_query_heads", 1)),) and _tnd(a)
            and _v2_value_head_dim(a) <= 128)


_FIA_V2_RULES = (
    KernelRule(FIA_V2, "v2_query_dtype", f"{DOCS}:8589 (query float16/bfloat16/int8); :8781 (page attention: no int8 query)",
               _present("query"), lambda a: a["query"].dtype in HALF,
               lambda a: f"query dtype is {_dt(a['query'])}; page attention takes float16 or bfloat16"),
    KernelRule(FIA_V2, "v2_contiguous", f"{DOCS}:8589-8593 (query/key/value: non-contiguous tensors are not supported)",
               _present("query", "key", "value"),
               lambda a: _contiguous(a["query"]) and _contiguous(a["key"]) and _contiguous(a["value"]),
               lambda a: "query, key or value is not contiguous"),
    KernelRule(FIA_V2, "v2_tnd_lengths", f"{DOCS}:8720 (TND: actual_seq_qlen and actual_seq_kvlen required; qlen "
               "cumulative, non-decreasing; its length is the batch)",
               _tnd, _v2_tnd_lengths_ok,
               lambda a: f"actual_seq_qlen={a.get('actual_seq_qlen')!r}, actual_seq_kvlen={a.get('actual_seq_kvlen')!r}: "
                         "need cumulative query ends and one non-negative KV length per request"),
    KernelRule(FIA_V2, "v2_tnd_tokens_equal_last_end", SRC_FIA_PAD,
               lambda a: _tnd(a) and _present("query")(a) and len(FIA_V2_ARGUMENTS.q_ends(a)) > 0,
               FIA_V2_ARGUMENTS.tokens_equal_last_end, FIA_V2_ARGUMENTS.describe_tokens_vs_last_end),
    KernelRule(FIA_V2, "v2_block_table", f"{DOCS}:8611 (block_table int32); :8780 (page attention: 2-D, first dim == batch)",
               lambda a: _paged(a) and (a.get("actual_seq_qlen") is not None or not _tnd(a)),
               _v2_block_table_ok,
               lambda a: f"block_table {_shape(a['block_table'])} {_dt(a['block_table'])} for {FIA_V2_ARGUMENTS.batch(a)} "
                         "requests: need int32 with one row per request"),
    KernelRule(FIA_V2, "v2_block_table_columns", f"{DOCS}:8780 (second dim >= maxBlockNumPerSeq)",
               lambda a: FIA_V2_ARGUMENTS.paged_with_kv_lengths(a) and a["block_table"].dim() == 2,
               FIA_V2_ARGUMENTS.block_table_columns_ok, FIA_V2_ARGUMENTS.describe_block_table_columns),
    KernelRule(FIA_V2, "v2_paged_block_size", f"{DOCS}:8776 (Q_S > 1, the branch at :8759: at least 128, at most "
               "512, a multiple of 128); :8817 (Q_S == 1, the branch at :8806: 16-aligned for float16/bfloat16 KV, "
               f"32-aligned for int8 KV); as v1's ({PAGED_BLOCK_SIZE_SOURCE})",
               _paged, lambda a: paged_block_size_ok(a.get("block_size", 0), FIA_V2_ARGUMENTS.q_s(a), int8_kv=_int8_in(a, "key")),
               lambda a: describe_paged_block_size(a.get("block_size", 0), FIA_V2_ARGUMENTS.q_s(a), int8_kv=_int8_in(a, "key"))),
    *_q_s_gt_1_limits(FIA_V2, "v2_", FIA_V2_ARGUMENTS,
                      f"{DOCS}:8761 (Q_S > 1, the branch opening at :8759: the B axis at most 65536); as v1's "
                      "q_s_gt_1_batch_limit", f"{DOCS}:8762 (Q_S > 1: the N axis at most 256); as v1's "
                      "q_s_gt_1_heads_limit"),
    KernelRule(FIA_V2, "v2_gqa_ratio", f"{DOCS}:8627 (num_query_heads divisible by num_key_value_heads, ratio <= 64); "
               ":8731 (K_N == V_N, stated for the TND layouts)",
               _always, FIA_V2_ARGUMENTS.gqa_ok,
               lambda a: f"num_query_heads={a.get('num_query_heads')}, num_key_value_heads={FIA_V2_ARGUMENTS.kv_heads(a)}"),
    KernelRule(FIA_V2, "v2_sparse_mode", f"{DOCS}:8719, 8735 (TND: sparse 0 without mask, 3 or 4 with mask); :8770 (0-4)",
               _always, lambda a: int(a.get("sparse_mode", 0)) in ((0, 3, 4) if _tnd(a) else (0, 1, 2, 3, 4)),
               lambda a: f"sparse_mode={a.get('sparse_mode')} with input_layout={a.get('input_layout')!r}"),
    KernelRule(FIA_V2, "v2_causal_mask_2048", f"{DOCS}:8607, 8772 (sparse 2/3/4: a 2048 x 2048 mask is required)",
               lambda a: a.get("sparse_mode") in (2, 3, 4), _mask_ok, _describe_causal_mask),
    KernelRule(FIA_V2, "v2_kv_covers_query", f"{DOCS}:8734 (sparse 3: actual_seq_qlen < actual_seq_kvlen per batch), "
               f"relaxed to kv_len >= q_len or 0: a prefill without cache has kv_len == q_len and padded requests "
               f"kv_len 0 ({SRC_FIA_V2_CALL}; {SRC_ZERO_KV})",
               lambda a: a.get("sparse_mode") == 3 and _tnd(a) and a.get("actual_seq_kvlen") is not None,
               _v2_kv_covers_q,
               lambda a: f"under sparse_mode 3 every request needs kv_len >= q_len (or 0): q_lens {FIA_V2_ARGUMENTS.q_lens(a)}, "
                         f"kv_lens {_ints(a['actual_seq_kvlen'])}"),
    KernelRule(FIA_V2, "v2_learnable_sink", f"{DOCS}:8625 (learnable_sink bfloat16, shape (Q_N,)); :8755-8757 (TND "
               "only; value D <= 128)",
               _present("learnable_sink"),
               _v2_learnable_sink_ok,
               lambda a: f"learnable_sink {_shape(a['learnable_sink'])} {_dt(a['learnable_sink'])} with "
                         f"{a.get('num_query_heads')} query heads, layout {a.get('input_layout')!r}, value D "
                         f"{_v2_value_head_dim(a)}"),
    *_fused_semantics_rules(FIA_V2, "v2_", FIA_V2_ARGUMENTS, _V2_LINES, V2_LAYOUTS,
                            "_npu_fused_infer_attention_score_v2_get_max_workspace", tnd_sparse_rule=False),
)
