"""The fused attention's rules v1 (`npu_fused_infer_attention_score`) and v2
(``_v2``) share, and the argument readers both use.

The mask, sparse-mode, length, precision and workspace rules hold for both kernels; each kernel
states them in its own argument names (`_FusedNames`) and at its own op-docs lines
(`_FusedLines`), so one factory (`_fused_semantics_rules`) writes both sets. What the simulator
computes for the calls they accept is sim/attention.py."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import torch

from ascendgraph.kernel_contracts.common import (
    DOCS,
    FIA_MASK_SIZE,
    FIA_V2,
    MASK_DTYPES,
    VA_COMMIT,
    VLLM_ASCEND,
    KernelRule,
    _contiguous,
    _dt,
    _ints,
    _paged,
    _present,
    _shape,
    _tnd,
    _workspace_rule,
)
from ascendgraph.workspace_sizes import fused_attention_workspace_bytes


@dataclass(frozen=True)
class FusedArguments:
    """How one fused-attention kernel spells the arguments its rules read, and the readers of
    them: v1 and v2 differ only in these names (`FIA_ARGUMENTS`, `FIA_V2_ARGUMENTS`), so each reader is written once."""

    q_lengths: str  # TND: the cumulative query ends; else one query length per batch
    kv_lengths: str
    heads: str

    def q_ends(self, a: Mapping[str, Any]) -> list[int]:
        return _ints(a.get(self.q_lengths))

    def q_lens(self, a: Mapping[str, Any]) -> list[int]:
        """Each request's query length, from TND's cumulative ends."""
        ends = self.q_ends(a)
        return [end - start for start, end in zip([0, *ends[:-1]], ends)]

    def q_s(self, a: Mapping[str, Any]) -> int:
        """The call's Q_S, which picks the op docs' branch (v1 :8201 Q_S > 1, :8269 Q_S == 1; v2
        :8759, :8806): in TND the longest request's query length (T when the ends are not
        given), else the query's S axis (BNSD: dim 2; BSH/BSND: dim 1)."""
        query = a.get("query")
        if _tnd(a):
            if a.get(self.q_lengths) is not None:
                return max(self.q_lens(a), default=0)
            return int(query.shape[0]) if query is not None else 0
        if query is None or query.dim() < 3:
            return 1
        return int(query.shape[2] if a.get("input_layout") in ("BNSD", "BNSD_BSND") else query.shape[1])

    def batch(self, a: Mapping[str, Any]) -> int:
        """B: the number of TND query ends, else the query's first axis."""
        return len(self.q_ends(a)) if _tnd(a) else int(a["query"].shape[0])

    def kv_heads(self, a: Mapping[str, Any]) -> int:
        return int(a.get("num_key_value_heads") or 0) or int(a.get(self.heads, 1))

    def gqa_ok(self, a: Mapping[str, Any]) -> bool:
        """The query heads are a multiple of the KV heads, at most 64 per KV head."""
        heads, kv_heads = int(a.get(self.heads, 1)), self.kv_heads(a)
        return kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 64

    def paged_with_kv_lengths(self, a: Mapping[str, Any]) -> bool:
        """Page attention with KV lengths and a block size: the blocks each request needs are known."""
        return _paged(a) and a.get(self.kv_lengths) is not None and int(a.get("block_size", 0) or 0) > 0

    def blocks_needed(self, a: Mapping[str, Any]) -> list[int]:
        size = int(a["block_size"])
        return [math.ceil(max(kv, 0) / size) for kv in _ints(a[self.kv_lengths])]

    def block_table_columns_ok(self, a: Mapping[str, Any]) -> bool:
        """The block table reaches the blocks of the longest KV length."""
        return int(a["block_table"].shape[1]) >= max(self.blocks_needed(a), default=0)

    def describe_block_table_columns(self, a: Mapping[str, Any]) -> str:
        return (f"block_table has {int(a['block_table'].shape[1])} columns but the longest KV length "
                f"({max(_ints(a[self.kv_lengths]), default=0)}) needs {max(self.blocks_needed(a), default=0)} "
                f"blocks of {a['block_size']}")

    def tokens_equal_last_end(self, a: Mapping[str, Any]) -> bool:
        """A TND query's T equals the last cumulative query end."""
        return int(a["query"].shape[0]) == self.q_ends(a)[-1]

    def describe_tokens_vs_last_end(self, a: Mapping[str, Any]) -> str:
        return (f"query has T={int(a['query'].shape[0])} tokens but {self.q_lengths}[-1]={self.q_ends(a)[-1]}; "
                "pad with a dummy request so the last end equals T")


FIA_ARGUMENTS = FusedArguments("actual_seq_lengths", "actual_seq_lengths_kv", "num_heads")  # npu_fused_infer_attention_score
FIA_V2_ARGUMENTS = FusedArguments("actual_seq_qlen", "actual_seq_kvlen", "num_query_heads")  # npu_fused_infer_attention_score_v2


def _q_s_gt_1_limits(kernel: str, prefix: str, n: FusedArguments, batch_source: str,
                     heads_source: str) -> tuple["KernelRule", "KernelRule"]:
    """The fused attention's limits when a request has more than one query token (v1 and v2
    state the same two, each kernel in its own argument names): B <= 65536, N <= 256."""
    applies = lambda a: _present("query")(a) and n.q_s(a) > 1  # noqa: E731
    return (
        KernelRule(kernel, f"{prefix}q_s_gt_1_batch_limit", batch_source, applies, lambda a: n.batch(a) <= 65536,
                   lambda a: f"batch of {n.batch(a)} requests with Q_S={n.q_s(a)}; the fused attention takes "
                             "at most 65536 when a request has more than one query token"),
        KernelRule(kernel, f"{prefix}q_s_gt_1_heads_limit", heads_source, applies,
                   lambda a: int(a.get(n.heads, 1)) <= 256,
                   lambda a: f"{n.heads}={a.get(n.heads)} with Q_S={n.q_s(a)}; the fused attention takes at most "
                             "256 query heads when a request has more than one query token"),
    )


def _int8_in(a: Mapping[str, Any], *names: str) -> bool:
    return any(getattr(a.get(name), "dtype", None) == torch.int8 for name in names)


def _mask_ok(a: Mapping[str, Any]) -> bool:
    """A contiguous bool/int8/uint8 2048 x 2048 mask, optionally with leading 1 dims."""
    mask = a.get("atten_mask")
    if mask is None:
        return False
    size = FIA_MASK_SIZE
    return (
        _shape(mask) in ((size, size), (1, size, size), (1, 1, size, size))
        and mask.dtype in MASK_DTYPES
        and _contiguous(mask)
    )


def _describe_causal_mask(a: Mapping[str, Any]) -> str:
    if a.get("atten_mask") is None:
        return "atten_mask is missing"
    return (f"atten_mask has shape {_shape(a['atten_mask'])}, dtype {_dt(a['atten_mask'])}; sparse_mode "
            f"{a.get('sparse_mode')} needs a contiguous {FIA_MASK_SIZE} x {FIA_MASK_SIZE} bool mask")


def _nondecreasing(values: list[int]) -> bool:
    return all(v >= 0 for v in values) and all(b >= a for a, b in zip(values, values[1:]))



NON_TND_LAYOUTS = ("BSH", "BSND", "BNSD", "BNSD_BSND")
SRC_TND_MASKED_MODE_0 = (
    f"{VLLM_ASCEND} vllm_ascend/attention/attention_mask.py@{VA_COMMIT}:58-66 (a TND call with sparse_mode 0 and a "
    "mask runs: the card applies the mask as defaultMask, so non-causal layers must pass none)"
)
SRC_OP_PLUGIN_FIA = (
    "Ascend/op-plugin op_plugin/ops/opapi/FusedInferAttentionScoreKernelNpuOpApi.cpp "
    "(get_query_and_attention_out_layout: \"query's dim should be consistent with that of Layout\"; get_value_d: "
    "an unpaged value has the query's dims)"
)


@dataclass(frozen=True)
class _FusedLines:
    """Where a kernel's op docs state each shared rule."""

    layouts: str
    lengths: str
    full_mask: str
    band: str
    inner_precise: str
    tnd_sparse: str


_V1_LINES = _FusedLines(
    layouts=f"{DOCS}:8112-8115 (BSH, BSND, BNSD, BNSD_BSND, TND; BNSD_BSND only with Q_S > 1)",
    lengths=f"{DOCS}:8082-8083 (outside TND one entry per batch, or one for all; each at most the S axis); "
            ":8222 (page attention: actual_seq_lengths_kv required)",
    full_mask=f"{DOCS}:8076 (bool/int8/uint8, contiguous); :8077-8080 (sparse_mode 0/1: (Q_S, KV_S), (B, KV_S) at "
              "Q_S == 1, (1, Q_S, KV_S), (B, 1, Q_S, KV_S), (1, 1, Q_S, KV_S), S rounded up allowed); :8119 (sparse_mode "
              "1 needs the full mask); :8225-8226 (page attention: the mask's KV_S >= maxBlockNumPerSeq * blockSize); "
              ":8292 (the mask's last dim >= block_table's second dim * block_size: the bound checked)",
    band=f"{DOCS}:8200 (sparse_mode 4: pre_tokens >= -actual_seq_qlen, next_tokens >= -actual_seq_kvlen, pre_tokens "
         "+ next_tokens >= 0); the band's two edges must meet (npu_fusion_attention, :1645)",
    inner_precise=f"{DOCS}:8124-8128 (inner_precise 0-3; Q_S == 1 takes only 0 and 1)",
    tnd_sparse=f"{DOCS}:8198, 8200 (TND: sparse_mode 0, or 3 / 4 with the mask)",
)
_V2_LINES = _FusedLines(
    layouts=f"{DOCS}:8631-8634 (BSH, BSND, BNSD, BNSD_BSND, TND and the NTD/NBSD variants; BNSD_BSND only with "
            "Q_S > 1)",
    lengths=f"{DOCS}:8609-8610 (outside TND one entry per batch, or one for all; each at most the S axis); "
            ":8779 (page attention: actual_seq_kvlen required)",
    full_mask=f"{DOCS}:8602 (bool/int8/uint8, contiguous); :8603-8606 (sparse_mode 0/1: (Q_S, KV_S), (B, KV_S) at "
              "Q_S == 1, (1, Q_S, KV_S), (B, 1, Q_S, KV_S), (1, 1, Q_S, KV_S), S rounded up allowed); :8637 (sparse_mode "
              "1 needs the full mask); :8782-8783 (page attention: the mask's KV_S >= maxBlockNumPerSeq * blockSize; "
              "checked against block_table's second dim * block_size, as v1's :8292 words it, which is stricter when "
              "the table has spare columns)",
    band=f"{DOCS}:8735 (sparse_mode 4: pre_tokens >= -actual_seq_qlen, next_tokens >= -actual_seq_kvlen, pre_tokens "
         "+ next_tokens >= 0); the band's two edges must meet (npu_fusion_attention, :1645)",
    inner_precise=f"{DOCS}:8656-8660 (inner_precise 0-3; Q_S == 1 takes only 0 and 1)",
    tnd_sparse=f"{DOCS}:8719, 8735 (TND: sparse_mode 0, or 3 / 4 with the mask)",
)


def _layout(a: Mapping[str, Any]) -> str:
    return str(a.get("input_layout", "BSH"))


def _query_batch_s(a: Mapping[str, Any]) -> tuple[int, int]:
    """(B, Q_S) of a non-TND query (BNSD keeps S at dim 2)."""
    query = a["query"]
    axis = 2 if _layout(a) in ("BNSD", "BNSD_BSND") else 1
    return int(query.shape[0]), int(query.shape[axis]) if query.dim() > axis else 1


def _kv_span(a: Mapping[str, Any]) -> int:
    """KV_S as the shapes give it: the paged table's reach, else the key's S axis."""
    key = a["key"]
    if _paged(a):
        table = a["block_table"]
        return int(table.shape[-1]) * int(a.get("block_size", 0) or 0) if table.dim() == 2 else 0
    if _tnd(a):
        return int(key.shape[0])
    axis = 2 if _layout(a) in ("BNSD", "BNSD_BSND") else 1
    return int(key.shape[axis]) if key.dim() > axis else 0


def _per_batch(values: list[int], batch: int, default: int) -> list[int]:
    if not values:
        return [default] * batch
    return values * batch if len(values) == 1 else values[:batch]


def _request_lengths(a: Mapping[str, Any], n: FusedArguments) -> list[tuple[int, int]]:
    """(q_len, kv_len) of every request of the call."""
    if _tnd(a):
        q_lens = n.q_lens(a)
        kv = _ints(a.get(n.kv_lengths))
        kv_lens = kv if _paged(a) else [b - s for s, b in zip([0, *kv[:-1]], kv)]
        return list(zip(q_lens, kv_lens))
    batch, s = _query_batch_s(a)
    q_lens = [1] * batch if s == 1 else _per_batch(_ints(a.get(n.q_lengths)), batch, s)
    kv_lens = _per_batch(_ints(a.get(n.kv_lengths)), batch, 0 if _paged(a) else _kv_span(a))
    return list(zip(q_lens, kv_lens))


def _mask_extent(a: Mapping[str, Any], n: FusedArguments) -> tuple[int, int, int]:
    """(B, Q_S, KV_S) a full mask must cover: in TND the longest request's query and (unpaged)
    key lengths, else the query's and key's S axes; paged, the block table's reach."""
    if _tnd(a):
        lengths = _request_lengths(a, n)
        kv_s = _kv_span(a) if _paged(a) else max((kv for _, kv in lengths), default=0)
        return len(lengths), max((q for q, _ in lengths), default=0), kv_s
    batch, q_s = _query_batch_s(a)
    return batch, q_s, _kv_span(a)


def _full_mask_ok(a: Mapping[str, Any], n: FusedArguments) -> bool:
    mask = a.get("atten_mask")
    if mask is None or mask.dtype not in MASK_DTYPES or not _contiguous(mask):
        return False
    batch, q_s, kv_s = _mask_extent(a, n)
    shape = _shape(mask)
    if len(shape) == 2:
        rows_ok = shape[0] == batch if q_s == 1 and not _tnd(a) else shape[0] >= q_s
        return rows_ok and shape[1] >= kv_s
    if len(shape) == 3:
        return shape[0] == 1 and shape[1] >= q_s and shape[2] >= kv_s
    if len(shape) == 4:
        return shape[0] in (1, batch) and shape[1] == 1 and shape[2] >= q_s and shape[3] >= kv_s
    return False


def _describe_full_mask(a: Mapping[str, Any], n: FusedArguments) -> str:
    mask = a.get("atten_mask")
    batch, q_s, kv_s = _mask_extent(a, n)
    need = (f"sparse_mode {a.get('sparse_mode')} needs a contiguous bool/int8/uint8 mask of (Q_S, KV_S), "
            f"(1, Q_S, KV_S) or (B|1, 1, Q_S, KV_S) with Q_S={q_s}, KV_S={kv_s}, B={batch}"
            + (" (or (B, KV_S): Q_S is 1)" if q_s == 1 and not _tnd(a) else ""))
    if mask is None:
        return f"atten_mask is missing; {need}"
    return f"atten_mask has shape {_shape(mask)}, dtype {_dt(mask)}, contiguous={_contiguous(mask)}; {need}"


def _band_ok(a: Mapping[str, Any], n: FusedArguments) -> bool:
    pre, nxt = int(a.get("pre_tokens", 2147483647)), int(a.get("next_tokens", 2147483647))
    return pre + nxt >= 0 and all(pre >= -q and nxt >= -kv for q, kv in _request_lengths(a, n))


def _lengths_ok(a: Mapping[str, Any], n: FusedArguments) -> bool:
    batch, q_s = _query_batch_s(a)
    q_values, kv_values = a.get(n.q_lengths), a.get(n.kv_lengths)
    if q_values is not None and q_s > 1:
        q = _ints(q_values)
        if not (len(q) == 1 or len(q) >= batch) or any(v < 0 or v > q_s for v in q[:batch]):
            return False
    if kv_values is None:
        return not _paged(a)
    kv = _ints(kv_values)
    limit = None if _paged(a) else _kv_span(a)
    return (len(kv) == 1 or len(kv) >= batch) and all(v >= 0 and (limit is None or v <= limit) for v in kv[:batch])


def _layout_ok(a: Mapping[str, Any], n: FusedArguments, layouts: tuple[str, ...]) -> bool:
    layout = _layout(a)
    if layout not in layouts:
        return False
    if layout not in NON_TND_LAYOUTS:
        return True  # TND: tnd_query_rank and the TND rules; v2's NTD / NBSD variants: not modelled (sim.facade)
    query = a["query"]
    if query.dim() != (3 if layout == "BSH" else 4):
        return False
    heads = int(a.get(n.heads, 1) or 1)
    if layout == "BSH" and int(query.shape[-1]) % heads:
        return False
    if layout == "BNSD_BSND" and _query_batch_s(a)[1] <= 1:
        return False
    if not _paged(a) and (a["key"].dim() != query.dim() or a["value"].dim() != query.dim()
                          or int(a["key"].shape[0]) != int(query.shape[0])):
        return False
    return True


def _inner_precise_ok(a: Mapping[str, Any], n: FusedArguments) -> bool:
    value = int(a.get("inner_precise", 0))
    return value in (0, 1) or (value in (2, 3) and n.q_s(a) > 1)


def _workspace_needed(a: Mapping[str, Any], kernel: str) -> int:
    return fused_attention_workspace_bytes(a, v2=kernel == FIA_V2)


SRC_WORKSPACE = (
    "torch-npu 2.13.0 registered schemas (the .out overloads run in the caller's Tensor? workspace); the size "
    "comes from the workspace query (Ascend/op-plugin FusedInferAttentionScoreKernelNpuOpApi.cpp, "
    "EXEC_GET_MAX_WORKSPACE_CMD); the formula is the simulator's model, ascendgraph/workspace_sizes.py "
    "(docs/facade.md, \"What is approximated\")"
)


def _full_mask_call(a: Mapping[str, Any]) -> bool:
    """A call that takes a full mask: sparse_mode 1, or sparse_mode 0 with a mask given."""
    mode = int(a.get("sparse_mode", 0))
    return _present("query", "key")(a) and (mode == 1 or (mode == 0 and a.get("atten_mask") is not None))


def _fused_semantics_rules(kernel: str, prefix: str, n: FusedArguments, lines: _FusedLines,
                           layouts: tuple[str, ...], workspace_query: str,
                           tnd_sparse_rule: bool = True) -> tuple["KernelRule", ...]:
    """The rules of masks, sparse modes, lengths, precision and workspace the two fused
    attention kernels share (see the block comment above). ``tnd_sparse_rule=False``: the
    kernel's own sparse-mode rule already covers TND (v2_sparse_mode)."""
    mode = lambda a: int(a.get("sparse_mode", 0))  # noqa: E731
    rules = (
        KernelRule(kernel, f"{prefix}input_layout", f"{lines.layouts}; {SRC_OP_PLUGIN_FIA}",
                   _present("query", "key", "value"), lambda a: _layout_ok(a, n, layouts),
                   lambda a: f"input_layout={_layout(a)!r} with query {_shape(a['query'])}, key {_shape(a['key'])}, "
                             f"value {_shape(a['value'])}, {n.heads}={a.get(n.heads)}: the layouts are "
                             f"{', '.join(layouts)}; BSH is [B, S, N*D], BSND/BNSD 4-D, an unpaged key/value has the "
                             "query's dims and batch, BNSD_BSND needs Q_S > 1"),
        KernelRule(kernel, f"{prefix}tnd_sparse_mode", f"{lines.tnd_sparse}; {SRC_TND_MASKED_MODE_0}",
                   lambda a: _tnd(a), lambda a: mode(a) in (0, 3, 4),
                   lambda a: f"sparse_mode={mode(a)} in TND: the layout takes sparse_mode 0 (no mask, or a full mask "
                             "applied as defaultMask) or 3 / 4 with the 2048 x 2048 mask"),
        KernelRule(kernel, f"{prefix}full_mask", f"{lines.full_mask}; TND: {SRC_TND_MASKED_MODE_0}",
                   _full_mask_call,
                   lambda a: _full_mask_ok(a, n), lambda a: _describe_full_mask(a, n)),
        KernelRule(kernel, f"{prefix}band_tokens", lines.band,
                   lambda a: mode(a) == 4 and _present("query", "key")(a) and n.q_s(a) > 1,
                   lambda a: _band_ok(a, n),
                   lambda a: f"pre_tokens={a.get('pre_tokens')}, next_tokens={a.get('next_tokens')} for (q_len, kv_len) "
                             f"{_request_lengths(a, n)}: the band needs pre_tokens + next_tokens >= 0, pre_tokens >= "
                             "-q_len and next_tokens >= -kv_len"),
        KernelRule(kernel, f"{prefix}inner_precise", lines.inner_precise, _present("query"),
                   lambda a: _inner_precise_ok(a, n),
                   lambda a: f"inner_precise={a.get('inner_precise')} with Q_S={n.q_s(a)}: 0-3, and only 0 or "
                             "1 when Q_S is 1"),
        KernelRule(kernel, f"{prefix}batch_lengths", lines.lengths,
                   lambda a: not _tnd(a) and _present("query", "key")(a) and _layout(a) in NON_TND_LAYOUTS,
                   lambda a: _lengths_ok(a, n),
                   lambda a: f"{n.q_lengths}={a.get(n.q_lengths)!r}, {n.kv_lengths}={a.get(n.kv_lengths)!r} for B, Q_S = "
                             f"{_query_batch_s(a)}, KV_S={_kv_span(a)}: one entry per batch (or one for all), each "
                             f"within its S axis{'; page attention needs ' + n.kv_lengths if _paged(a) else ''}"),
        _workspace_rule(kernel, prefix, lambda a: _workspace_needed(a, kernel), workspace_query, SRC_WORKSPACE),
    )
    return tuple(rule for rule in rules if tnd_sparse_rule or rule.name != f"{prefix}tnd_sparse_mode")


V1_LAYOUTS = ("TND", "BSH", "BSND", "BNSD", "BNSD_BSND")
V2_LAYOUTS = (*V1_LAYOUTS, "NTD", "TND_NTD", "NTD_TND", "BSH_NBSD", "BSND_NBSD", "BNSD_NBSD")
