"""The rules of `npu_fused_infer_attention_score` (v1): the kernel hw/ issues for
``ascendgraph::paged_attention`` (TND, paged KV, sparse_mode 3), with the rules v1 shares with
v2 (`ascendgraph.kernel_contracts.fused_semantics`)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ascendgraph.block_sizes import PAGED_BLOCK_SIZE_SOURCE, describe_paged_block_size, paged_block_size_ok
from ascendgraph.kernel_contracts.common import (
    CANN_TEXT_BLOCK_TABLE,
    CANN_TEXT_KV_LENGTHS,
    CANN_TEXT_QUERY_T,
    DOCS,
    FIA,
    HALF,
    SRC_FIA_PAD,
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
    FIA_ARGUMENTS,
    V1_LAYOUTS,
    _V1_LINES,
    _describe_causal_mask,
    _fused_semantics_rules,
    _int8_in,
    _mask_ok,
    _nondecreasing,
    _q_s_gt_1_limits,
)






def _head_dim(a: Mapping[str, Any]) -> int:
    """The query's D (:8064: D = H/N): its last axis, except in BSH (the schema's default
    layout), whose last axis is H = N*D."""
    last = int(a["query"].shape[-1])
    if (a.get("input_layout") or "BSH") == "BSH":
        return last // max(int(a.get("num_heads") or 1), 1)
    return last


def _query_dtype_ok(a: Mapping[str, Any]) -> bool:
    """:8065: float16, bfloat16 or int8; the Q_S > 1 branch refuses an int8 query with page
    attention (:8224), the Q_S == 1 branch int8 query, key and value together (:8272)."""
    dtype = a["query"].dtype
    if dtype in HALF:
        return True
    if dtype != torch.int8:
        return False
    if FIA_ARGUMENTS.q_s(a) > 1:
        return not _paged(a)
    return not _int8_in(a, "key") or not _int8_in(a, "value")


def _describe_query_dtype(a: Mapping[str, Any]) -> str:
    if a["query"].dtype != torch.int8:
        return (f"query dtype is {_dt(a['query'])}; the fused attention takes float16, bfloat16 or int8 "
                "(run the model in --dtype bfloat16)")
    if FIA_ARGUMENTS.q_s(a) > 1:
        return f"an int8 query with page attention (block_table) and Q_S={FIA_ARGUMENTS.q_s(a)} > 1; use float16 or bfloat16"
    return "int8 query, key and value together with Q_S == 1; use a float16 or bfloat16 query"


def _head_dim_alignment(a: Mapping[str, Any]) -> int:
    """:8210 (the Q_S > 1 branch): 32 when query, key or value is int8, 16 when all are half."""
    return 32 if _int8_in(a, "query", "key", "value") else 16


def _kv_hidden_limit(a: Mapping[str, Any]) -> int:
    """KV_N*D of the (blocknum, blocksize, H) cache layout: :8220 (Q_S > 1) refuses it "over
    65535", :8287 (Q_S == 1) "over 64k"."""
    return 65535 if FIA_ARGUMENTS.q_s(a) > 1 else 65536




def _paged_kv_layout_ok(a: Mapping[str, Any]) -> bool:
    """A paged cache is (blocknum, blocksize, H), or (blocknum, KV_N, blocksize, D) with a BNSD or TND query."""
    return a["key"].dim() == 3 or (a["key"].dim() == 4 and (a.get("input_layout") or "BSH") in ("BNSD", "BNSD_BSND", "TND"))


def _paged_kv_lengths_ok(a: Mapping[str, Any]) -> bool:
    """actual_seq_lengths_kv is given, with one non-negative KV length per request of actual_seq_lengths."""
    kv = a.get("actual_seq_lengths_kv")
    return kv is not None and len(kv) == len(FIA_ARGUMENTS.q_ends(a)) and all(v >= 0 for v in _ints(kv))


def _either_rope(a: Mapping[str, Any]) -> bool:
    """An MLA call: query_rope or key_rope given (:8105-8106)."""
    return a.get("query_rope") is not None or a.get("key_rope") is not None


def _rope_dtypes_ok(a: Mapping[str, Any]) -> bool:
    """:8172-8173: query_rope's dtype is the query's, key_rope's the key's."""
    return a["query_rope"].dtype == a["query"].dtype and a["key_rope"].dtype == a["key"].dtype


_MLA_ROPE_HEAD_DIM = 64  # :8176-8177, 8185-8186 (every MLA branch: the rope inputs' D is 64)


def _rope_shape_ok(rope: Any, base: Any) -> bool:
    """:8176-8177, 8185-8186: a rope input has its base tensor's shape but for D, which is 64."""
    return (rope.dim() == base.dim() and tuple(rope.shape[:-1]) == tuple(base.shape[:-1])
            and int(rope.shape[-1]) == _MLA_ROPE_HEAD_DIM)


def _describe_rope_shapes(a: Mapping[str, Any]) -> str:
    return (f"query_rope {_shape(a['query_rope'])} for query {_shape(a['query'])}, key_rope {_shape(a['key_rope'])} "
            f"for key {_shape(a['key'])}: a rope input takes its base tensor's shape with D={_MLA_ROPE_HEAD_DIM}")


_FIA_RULES = (
    KernelRule(FIA, "query_dtype", f"{DOCS}:8065 (query float16/bfloat16/int8); :8224 (Q_S > 1, the branch opening "
               "at :8201: no int8 query with page attention); :8272 (Q_S == 1, the branch at :8269: query, key and "
               "value all int8 not supported)",
               _present("query"), _query_dtype_ok, _describe_query_dtype),
    KernelRule(FIA, "query_contiguous", f"{DOCS}:8065 (query: non-contiguous tensors are not supported)",
               _present("query"), lambda a: _contiguous(a["query"]),
               lambda a: f"query of shape {_shape(a['query'])} is not contiguous"),
    KernelRule(FIA, "kv_contiguous", f"{DOCS}:8066-8071 (key/value: non-contiguous tensors are not supported)",
               _present("key", "value"), lambda a: _contiguous(a["key"]) and _contiguous(a["value"]),
               lambda a: "key or value is not contiguous"),
    KernelRule(FIA, "rope_pair", f"{DOCS}:8171 (query_rope and key_rope: both or neither)",
               _either_rope, _present("query_rope", "key_rope"),
               lambda a: f"query_rope {'given' if a.get('query_rope') is not None else 'None'}, key_rope "
                         f"{'given' if a.get('key_rope') is not None else 'None'}: pass both (MLA) or neither"),
    KernelRule(FIA, "rope_contiguous", f"{DOCS}:8105-8106 (query_rope/key_rope: non-contiguous tensors are not "
               "supported)",
               _either_rope, lambda a: _contiguous(a.get("query_rope")) and _contiguous(a.get("key_rope")),
               lambda a: "query_rope or key_rope is not contiguous"),
    KernelRule(FIA, "rope_dtype", f"{DOCS}:8172-8173 (query_rope's dtype is the query's, key_rope's the key's)",
               _present("query", "key", "query_rope", "key_rope"), _rope_dtypes_ok,
               lambda a: f"query {_dt(a['query'])} with query_rope {_dt(a['query_rope'])}, key {_dt(a['key'])} with "
                         f"key_rope {_dt(a['key_rope'])}: a rope input takes its base tensor's dtype"),
    KernelRule(FIA, "rope_shape", f"{DOCS}:8176-8177, 8185-8186 (B, N, S as the query's / key's, D 64)",
               _present("query", "key", "query_rope", "key_rope"),
               lambda a: _rope_shape_ok(a["query_rope"], a["query"]) and _rope_shape_ok(a["key_rope"], a["key"]),
               _describe_rope_shapes),
    KernelRule(FIA, "paged_kv_dtype", f"{DOCS}:8218, 8278-8279 (page attention: key/value float16, bfloat16, int8)",
               lambda a: _paged(a) and _present("key", "value")(a),
               lambda a: a["key"].dtype == a["value"].dtype and a["key"].dtype in (*HALF, torch.int8),
               lambda a: f"key dtype {_dt(a['key'])}, value dtype {_dt(a['value'])}; page attention takes equal "
                         "float16/bfloat16/int8 caches"),
    KernelRule(FIA, "paged_kv_layout", f"{DOCS}:8220, 8285 (page attention: the cache is (blocknum, blocksize, H) or, "
               "for a BNSD or TND query only, (blocknum, KV_N, blocksize, D))",
               lambda a: _paged(a) and _present("key")(a),
               _paged_kv_layout_ok,
               lambda a: f"key cache of shape {_shape(a['key'])} with input_layout={a.get('input_layout') or 'BSH'!r}; "
                         "page attention takes (blocknum, blocksize, H), or (blocknum, KV_N, blocksize, D) with a "
                         "BNSD or TND query"),
    KernelRule(FIA, "paged_kv_same_shape", f"{DOCS}:8220 (key and value shapes must agree)",
               lambda a: _paged(a) and _present("key", "value")(a), lambda a: _shape(a["key"]) == _shape(a["value"]),
               lambda a: f"key shape {_shape(a['key'])} != value shape {_shape(a['value'])}"),
    KernelRule(FIA, "tnd_query_rank", f"{DOCS}:8064 (the layout letters: T the tokens of all batches, N the heads, "
               "D the head dim, so a TND query is [T, N, D]); :8113 (TND is an input_layout)",
               lambda a: _tnd(a) and _present("query")(a), lambda a: a["query"].dim() == 3,
               lambda a: f"TND query has shape {_shape(a['query'])}, not [T, N, D]"),
    KernelRule(FIA, "tnd_actual_seq_lengths", f"{DOCS}:8082 (TND: actual_seq_lengths required, cumulative, "
               "non-decreasing, non-negative; its length is the batch)",
               _tnd, lambda a: a.get("actual_seq_lengths") is not None and _nondecreasing(_ints(a["actual_seq_lengths"])),
               lambda a: f"actual_seq_lengths={a.get('actual_seq_lengths')!r} is missing or not cumulative"),
    KernelRule(FIA, "tnd_tokens_equal_last_end", f"{SRC_FIA_PAD}; {CANN_TEXT_QUERY_T}",
               lambda a: _tnd(a) and _present("query")(a) and len(FIA_ARGUMENTS.q_ends(a)) > 0,
               FIA_ARGUMENTS.tokens_equal_last_end, FIA_ARGUMENTS.describe_tokens_vs_last_end),
    KernelRule(FIA, "paged_kv_lengths_per_request", f"{DOCS}:8222 (page attention: actual_seq_lengths_kv "
               f"required); :8275 (TND+PA: one entry per batch, each the request's KV length); {CANN_TEXT_KV_LENGTHS}",
               lambda a: _paged(a) and _tnd(a) and a.get(FIA_ARGUMENTS.q_lengths) is not None,
               _paged_kv_lengths_ok,
               lambda a: f"actual_seq_lengths_kv={a.get('actual_seq_lengths_kv')!r} for "
                         f"{len(a['actual_seq_lengths'])} requests (actual_seq_lengths); need one non-negative "
                         "KV length per request"),
    KernelRule(FIA, "block_table_int32", f"{DOCS}:8091 (block_table: int32)",
               _paged, lambda a: a["block_table"].dtype == torch.int32,
               lambda a: f"block_table dtype is {_dt(a['block_table'])}, not int32"),
    KernelRule(FIA, "block_table_rows", f"{DOCS}:8223, 8284 (page attention: block_table 2-D, first dim == batch); "
               f"{CANN_TEXT_BLOCK_TABLE}",
               lambda a: _paged(a) and (a.get("actual_seq_lengths") is not None or not _tnd(a)),
               lambda a: a["block_table"].dim() == 2 and int(a["block_table"].shape[0]) == FIA_ARGUMENTS.batch(a),
               lambda a: f"block_table has shape {_shape(a['block_table'])} for {FIA_ARGUMENTS.batch(a)} "
                         "requests; it needs one row per request"),
    KernelRule(FIA, "block_table_columns", f"{DOCS}:8223, 8284 (second dim >= maxBlockNumPerSeq of the longest "
               f"actual_seq_lengths_kv); {CANN_TEXT_BLOCK_TABLE}",
               lambda a: FIA_ARGUMENTS.paged_with_kv_lengths(a) and a["block_table"].dim() == 2,
               FIA_ARGUMENTS.block_table_columns_ok, FIA_ARGUMENTS.describe_block_table_columns),
    KernelRule(FIA, "enough_cache_blocks", f"{DOCS}:8220, 8285 (blocknum >= sum of the blocks every batch needs)",
               lambda a: FIA_ARGUMENTS.paged_with_kv_lengths(a) and _present("key")(a),
               lambda a: int(a["key"].shape[0]) >= sum(FIA_ARGUMENTS.blocks_needed(a)),
               lambda a: f"the cache holds {int(a['key'].shape[0])} blocks but the KV lengths "
                         f"{_ints(a['actual_seq_lengths_kv'])} need {sum(FIA_ARGUMENTS.blocks_needed(a))} of {a['block_size']}"),
    KernelRule(FIA, "paged_block_size", PAGED_BLOCK_SIZE_SOURCE,
               _paged, lambda a: paged_block_size_ok(a.get("block_size", 0), FIA_ARGUMENTS.q_s(a), int8_kv=_int8_in(a, "key")),
               lambda a: describe_paged_block_size(a.get("block_size", 0), FIA_ARGUMENTS.q_s(a), int8_kv=_int8_in(a, "key"))),
    *_q_s_gt_1_limits(FIA, "", FIA_ARGUMENTS, f"{DOCS}:8203 (Q_S > 1, the branch opening at :8201: "
                      "the B axis at most 65536)", f"{DOCS}:8204 (Q_S > 1: the N axis at most 256)"),
    # No kv_len >= q_len rule: the op docs' sparse_mode 3 interception (:8248) belongs to the
    # int8-output list (:8244, "输出为int8 ... quant_offset2"), and the TND one (:8198) to the
    # D=192 branch (:8193-8199); neither is this call (bf16 out, D 128), and the rule refused
    # vLLM Ascend's own dummy request (kv_len 1 behind a longer padded query).
    KernelRule(FIA, "head_dim_16_aligned", f"{DOCS}:8210 (Q_S > 1, the branch opening at :8201: D 16-aligned when "
               "query, key and value are float16/bfloat16, 32-aligned when one is int8; the Q_S == 1 branch at :8269 "
               "asks no alignment)",
               lambda a: _present("query")(a) and FIA_ARGUMENTS.q_s(a) > 1, lambda a: _head_dim(a) % _head_dim_alignment(a) == 0,
               lambda a: f"head_dim={_head_dim(a)} with Q_S={FIA_ARGUMENTS.q_s(a)} > 1; the fused attention needs a multiple of "
                         f"{_head_dim_alignment(a)}"),
    KernelRule(FIA, "head_dim_limit", f"{DOCS}:8204 (Q_S > 1: the D axis at most 512); :8271 (Q_S == 1: the D axis "
               "at most 512)",
               _present("query"), lambda a: _head_dim(a) <= 512,
               lambda a: f"head_dim={_head_dim(a)}; the fused attention takes at most 512"),
    KernelRule(FIA, "gqa_ratio", f"{DOCS}:8116 (num_heads divisible by num_key_value_heads, ratio <= 64)",
               _always, FIA_ARGUMENTS.gqa_ok,
               lambda a: f"num_heads={a.get('num_heads', 1)}, num_key_value_heads={FIA_ARGUMENTS.kv_heads(a)}: heads must be a "
                         "multiple of kv heads with at most 64 per kv head"),
    KernelRule(FIA, "kv_hidden_limit", f"{DOCS}:8220 (Q_S > 1: a (blocknum, blocksize, H) cache with KV_N*D over "
               "65535 is rejected; the (blocknum, KV_N, blocksize, D) layout is the way out); :8287 (Q_S == 1: over 64k)",
               lambda a: _paged(a) and _present("query", "key")(a) and a["key"].dim() == 3,
               lambda a: FIA_ARGUMENTS.kv_heads(a) * _head_dim(a) <= _kv_hidden_limit(a),
               lambda a: f"num_key_value_heads*head_dim={FIA_ARGUMENTS.kv_heads(a) * _head_dim(a)} exceeds {_kv_hidden_limit(a)} "
                         "in the (blocknum, blocksize, H) cache layout; use GQA or the (blocknum, KV_N, blocksize, D) "
                         "layout"),
    KernelRule(FIA, "sparse_mode_range", f"{DOCS}:8212 (sparse_mode only 0-4)",
               _always, lambda a: int(a.get("sparse_mode", 0)) in (0, 1, 2, 3, 4),
               lambda a: f"sparse_mode={a.get('sparse_mode')} is not one of 0-4"),
    KernelRule(FIA, "causal_mask_2048", f"{DOCS}:8076 (mask bool/int8/uint8, contiguous); :8081, 8214 (sparse 2/3/4: "
               "mask required, (2048, 2048) or (1, 2048, 2048) or (1, 1, 2048, 2048))",
               lambda a: a.get("sparse_mode") in (2, 3, 4), _mask_ok, _describe_causal_mask),
    *_fused_semantics_rules(FIA, "", FIA_ARGUMENTS, _V1_LINES, V1_LAYOUTS,
                            "_npu_fused_infer_attention_score_get_max_workspace"),
)
