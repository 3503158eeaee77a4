"""The rules of `npu_fused_infer_attention_score_v2`: the fused attention vLLM Ascend's
A2/A3 FULL graphs issue (full_graph_fia_v2), in its own argument names (``actual_seq_qlen``,
``num_query_heads``...), with the rules v2 shares with v1 (`fused_semantics`)."""

from __future__ import annotations

import math
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
)
from ascendgraph.kernel_contracts.fused_semantics import (
    V2_LAYOUTS,
    _V2_LINES,
    _V2_NAMES,
    _fused_semantics_rules,
    _int8_in,
    _mask_ok,
    _nondecreasing,
    _q_s,
    _q_s_gt_1_limits,
)


def _v2_tnd(a: Mapping[str, Any]) -> bool:
    """v2's TND layout."""
    return a.get("input_layout") == "TND"


def _v2_ends(a: Mapping[str, Any]) -> list[int]:
    return _ints(a.get("actual_seq_qlen"))


def _v2_q_lens(a: Mapping[str, Any]) -> list[int]:
    ends = _v2_ends(a)
    return [end - start for start, end in zip([0, *ends[:-1]], ends)]


def _v2_q_s(a: Mapping[str, Any]) -> int:
    """Q_S of a v2 call (the branches at :8759 / :8806): in TND the longest request's query length."""
    if _v2_tnd(a) and a.get("actual_seq_qlen") is not None:
        return max(_v2_q_lens(a), default=0)
    return _q_s({**a, "actual_seq_lengths": None})


def _v2_batch(a: Mapping[str, Any]) -> int:
    if _v2_tnd(a):
        return len(_v2_ends(a))
    return int(a["query"].shape[0])


def _v2_paged_lengths(a: Mapping[str, Any]) -> bool:
    """v2 page attention with KV lengths and a block size."""
    return _paged(a) and a.get("actual_seq_kvlen") is not None and int(a.get("block_size", 0)) > 0


def _v2_blocks_needed(a: Mapping[str, Any]) -> list[int]:
    size = int(a["block_size"])
    return [math.ceil(max(n, 0) / size) for n in _ints(a["actual_seq_kvlen"])]


def _v2_kv_heads(a: Mapping[str, Any]) -> int:
    return int(a.get("num_key_value_heads") or 0) or int(a.get("num_query_heads", 1))


def _v2_value_head_dim(a: Mapping[str, Any]) -> int:
    """D of value: a paged cache in the (blocknum, blocksize, H) layout holds KV_N * D per slot."""
    value = a["value"]
    if _paged(a) and value.dim() == 3:
        return int(value.shape[-1]) // max(_v2_kv_heads(a), 1)
    return int(value.shape[-1])


def _v2_kv_covers_q(a: Mapping[str, Any]) -> bool:
    """Every request's KV length covers its query length, or is 0 (a padded request)."""
    return all(k == 0 or k >= q for q, k in zip(_v2_q_lens(a), _ints(a["actual_seq_kvlen"])))


def _v2_tnd_lengths_ok(a: Mapping[str, Any]) -> bool:
    """Both length lists given: cumulative query ends, one non-negative KV length per request."""
    if a.get("actual_seq_qlen") is None or a.get("actual_seq_kvlen") is None:
        return False
    kv = _ints(a["actual_seq_kvlen"])
    return _nondecreasing(_v2_ends(a)) and len(kv) == len(_v2_ends(a)) and all(v >= 0 for v in kv)


def _v2_block_table_ok(a: Mapping[str, Any]) -> bool:
    """block_table is int32, 2-D, with one row per request."""
    table = a["block_table"]
    return table.dtype == torch.int32 and table.dim() == 2 and int(table.shape[0]) == _v2_batch(a)


def _v2_gqa_ok(a: Mapping[str, Any]) -> bool:
    """num_query_heads is a multiple of the KV heads, at most 64 per KV head."""
    heads, kv_heads = int(a.get("num_query_heads", 1)), _v2_kv_heads(a)
    return kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 64


def _v2_learnable_sink_ok(a: Mapping[str, Any]) -> bool:
    """learnable_sink is bfloat16 of shape (Q_N,), with a TND call whose value D is at most 128."""
    sink = a["learnable_sink"]
    return (sink.dtype == torch.bfloat16 and _shape(sink) == (int(a.get("num_query_heads", 1)),) and _v2_tnd(a)
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
               _v2_tnd, _v2_tnd_lengths_ok,
               lambda a: f"actual_seq_qlen={a.get('actual_seq_qlen')!r}, actual_seq_kvlen={a.get('actual_seq_kvlen')!r}: "
                         "need cumulative query ends and one non-negative KV length per request"),
    KernelRule(FIA_V2, "v2_tnd_tokens_equal_last_end", SRC_FIA_PAD,
               lambda a: _v2_tnd(a) and _present("query")(a) and len(_v2_ends(a)) > 0,
               lambda a: int(a["query"].shape[0]) == _v2_ends(a)[-1],
               lambda a: f"query has T={int(a['query'].shape[0])} tokens but actual_seq_qlen[-1]={_v2_ends(a)[-1]}; "
                         "pad with a dummy request so the last end equals T"),
    KernelRule(FIA_V2, "v2_block_table", f"{DOCS}:8611 (block_table int32); :8780 (page attention: 2-D, first dim == batch)",
               lambda a: _paged(a) and (a.get("actual_seq_qlen") is not None or not _v2_tnd(a)),
               _v2_block_table_ok,
               lambda a: f"block_table {_shape(a['block_table'])} {_dt(a['block_table'])} for {_v2_batch(a)} "
                         "requests: need int32 with one row per request"),
    KernelRule(FIA_V2, "v2_block_table_columns", f"{DOCS}:8780 (second dim >= maxBlockNumPerSeq)",
               lambda a: _v2_paged_lengths(a) and a["block_table"].dim() == 2,
               lambda a: int(a["block_table"].shape[1]) >= max(_v2_blocks_needed(a), default=0),
               lambda a: f"block_table has {int(a['block_table'].shape[1])} columns but the longest KV length needs "
                         f"{max(_v2_blocks_needed(a), default=0)} blocks of {a['block_size']}"),
    KernelRule(FIA_V2, "v2_paged_block_size", f"{DOCS}:8776 (Q_S > 1, the branch at :8759: at least 128, at most "
               "512, a multiple of 128); :8817 (Q_S == 1, the branch at :8806: 16-aligned for float16/bfloat16 KV, "
               f"32-aligned for int8 KV); as v1's ({PAGED_BLOCK_SIZE_SOURCE})",
               _paged, lambda a: paged_block_size_ok(a.get("block_size", 0), _v2_q_s(a), int8_kv=_int8_in(a, "key")),
               lambda a: describe_paged_block_size(a.get("block_size", 0), _v2_q_s(a), int8_kv=_int8_in(a, "key"))),
    *_q_s_gt_1_limits(FIA_V2, "v2_", _v2_q_s, _v2_batch, "num_query_heads",
                      f"{DOCS}:8761 (Q_S > 1, the branch opening at :8759: the B axis at most 65536); as v1's "
                      "q_s_gt_1_batch_limit", f"{DOCS}:8762 (Q_S > 1: the N axis at most 256); as v1's "
                      "q_s_gt_1_heads_limit"),
    KernelRule(FIA_V2, "v2_gqa_ratio", f"{DOCS}:8731 (K_N == V_N, Q_N divisible by K_N, ratio <= 64)",
               _always, _v2_gqa_ok,
               lambda a: f"num_query_heads={a.get('num_query_heads')}, num_key_value_heads={_v2_kv_heads(a)}"),
    KernelRule(FIA_V2, "v2_sparse_mode", f"{DOCS}:8719, 8735 (TND: sparse 0 without mask, 3 or 4 with mask); :8770 (0-4)",
               _always, lambda a: int(a.get("sparse_mode", 0)) in ((0, 3, 4) if _v2_tnd(a) else (0, 1, 2, 3, 4)),
               lambda a: f"sparse_mode={a.get('sparse_mode')} with input_layout={a.get('input_layout')!r}"),
    KernelRule(FIA_V2, "v2_causal_mask_2048", f"{DOCS}:8607, 8772 (sparse 2/3/4: a 2048 x 2048 mask is required)",
               lambda a: a.get("sparse_mode") in (2, 3, 4), _mask_ok,
               lambda a: "atten_mask is missing" if a.get("atten_mask") is None else
               f"atten_mask has shape {_shape(a['atten_mask'])}, dtype {_dt(a['atten_mask'])}; sparse_mode "
               f"{a.get('sparse_mode')} needs a contiguous 2048 x 2048 bool mask"),
    KernelRule(FIA_V2, "v2_kv_covers_query", f"{DOCS}:8734 (sparse 3: actual_seq_qlen < actual_seq_kvlen per batch), "
               f"relaxed to kv_len >= q_len or 0: a prefill without cache has kv_len == q_len and padded requests "
               f"kv_len 0 ({SRC_FIA_V2_CALL}; {SRC_ZERO_KV})",
               lambda a: a.get("sparse_mode") == 3 and _v2_tnd(a) and a.get("actual_seq_kvlen") is not None,
               _v2_kv_covers_q,
               lambda a: f"under sparse_mode 3 every request needs kv_len >= q_len (or 0): q_lens {_v2_q_lens(a)}, "
                         f"kv_lens {_ints(a['actual_seq_kvlen'])}"),
    KernelRule(FIA_V2, "v2_learnable_sink", f"{DOCS}:8625 (learnable_sink bfloat16, shape (Q_N,)); :8755-8757 (TND "
               "only; value D <= 128)",
               _present("learnable_sink"),
               _v2_learnable_sink_ok,
               lambda a: f"learnable_sink {_shape(a['learnable_sink'])} {_dt(a['learnable_sink'])} with "
                         f"{a.get('num_query_heads')} query heads, layout {a.get('input_layout')!r}, value D "
                         f"{_v2_value_head_dim(a)}"),
    *_fused_semantics_rules(FIA_V2, "v2_", _V2_NAMES, _V2_LINES, V2_LAYOUTS,
                            "_npu_fused_infer_attention_score_v2_get_max_workspace", tnd_sparse_rule=False),
)
