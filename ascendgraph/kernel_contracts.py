"""What the Ascend kernels demand of their arguments: one table of rules, as data.

Theory of operation. Each `KernelRule` belongs to one torch_npu kernel (``kernel``, its
torch_npu name) and reads the kernel's arguments keyed by torch_npu's schema keyword
names (``query``, ``block_table``, ``actual_seq_lengths_kv``...). ``applies`` says whether
the rule's branch matches the call (page attention, TND, sparse_mode 3...), ``holds``
whether the call satisfies it and ``describe`` names the offending values. ``source``
cites where the rule comes from: the torch-npu 2.13.0 wheel's op documentation
(``torch_npu/_op_plugin_docs.py`` line), its registered schema, or vLLM Ascend's call site
(file@commit or pull request) where the wheel documents nothing (docs/decisions.md "Kernel contracts": where the docs and
vLLM Ascend's production calls disagree, vLLM Ascend wins and the rule is relaxed).

Two levels. The torch_npu rules above; and the rules our own ops imply
(``kernel="ascendgraph::paged_attention"`` ...), keyed by the op's argument names, for
what hw/'s mapping of the op onto the torch_npu call needs (cache layout, output like the
query). `ascendgraph.kernel_calls.kernel_calls(op, args, in_graph=...)` is that mapping,
written once so the simulator (which enforces the table) and hw/ (whose pre-checks use
it) agree on which torch_npu arguments an op call becomes. Eagerly hw passes attention only the real query
tokens (``query[:actual_seq_lengths[-1]]``); in a graph (capture or task update) the
whole captured query, so there ``T == actual_seq_lengths[-1]`` is the caller's job (the
FULL padding of `ascendgraph.forward_context.fia_padded_lengths`).

`check(kernel, arguments)` raises `KernelContractError` naming the rule, the values and
the source. The kernels' own error texts come from CANN's tiling code, which the wheel does
not ship; where vLLM Ascend's threads quote them (``CANN_TEXT_*``: PR #10769, issue #6076),
the rule's source quotes them too, so a card's message can be matched to the rule.
Rules never read tensor *values* (only dtype, shape, contiguity and host lists): reading
values would be a host synchronisation inside a capture.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ascendgraph.block_sizes import (
    PAGED_BLOCK_SIZE_SOURCE,
    block_size_problem,
    describe_paged_block_size,
    paged_block_size_ok,
)
from ascendgraph.attention_limits import TND_DECODE_QUERY_LEN_SOURCE
from ascendgraph.errors import KernelContractError
from ascendgraph.workspace_sizes import (
    fused_attention_workspace_bytes,
    paged_attention_workspace_bytes,
    tensor_bytes,
)

__all__ = [
    "KernelRule",
    "RULES",
    "KERNELS",
    "FLOAT32_LENIENT_RULES",
    "violations",
    "check",
    "message",
    "rules_for",
    "block_size_problem",
    "FIA",
    "FIA_MASK_SIZE",
    "FIA_SPARSE_MODE",
    "CONFIG_RULES",
    "SIMULATOR_MODEL_RULES",
]

FIA = "npu_fused_infer_attention_score"
RESHAPE_AND_CACHE = "_npu_reshape_and_cache"
ROTARY_EMBEDDING = "_npu_rotary_embedding"
RMS_NORM = "npu_rms_norm"
ADD_RMS_NORM = "npu_add_rms_norm"
DYNAMIC_QUANT = "npu_dynamic_quant"
QUANTIZE = "npu_quantize"
ADD_RMS_NORM_QUANT = "npu_add_rms_norm_quant"
ADD_RMS_NORM_DYNAMIC_QUANT = "npu_add_rms_norm_dynamic_quant"
PAGED_ATTENTION_OP = "ascendgraph::paged_attention"
FIA_V2 = "npu_fused_infer_attention_score_v2"
FIA_MAX_WORKSPACE = "_npu_fused_infer_attention_score_get_max_workspace"  # takes FIA's arguments (docs:8442)
ATB_PAGED_ATTENTION = "_npu_paged_attention"
SCATTER_PA_KV_CACHE = "npu_scatter_pa_kv_cache"

FIA_MASK_SIZE = 2048  # sparse_mode 2/3/4 take a compressed 2048 x 2048 mask
FIA_SPARSE_MODE = 3  # rightDownCausal, the mode hw/ and vLLM Ascend pass

# The dtype lists, one per meaning; the rules, hw/ and the simulator read them from here.
HALF = (torch.float16, torch.bfloat16)
NORM = (torch.float16, torch.bfloat16, torch.float32)
MASK_DTYPES = (torch.bool, torch.int8, torch.uint8)  # the fused attention's atten_mask
SLOT_DTYPES = (torch.int32, torch.int64)  # npu_scatter_pa_kv_cache's slot_mapping
QUANT_SCALE_DTYPES = (torch.float32, torch.bfloat16)  # static quantisation's scales (div_mode)
QUANT_OFFSET_DTYPES = (torch.int8, torch.uint8, torch.int32, torch.bfloat16)  # npu_quantize's zero_points

# Sources (the wheel's op docs are torch-npu 2.13.0's torch_npu/_op_plugin_docs.py).
DOCS = "torch-npu 2.13.0 torch_npu/_op_plugin_docs.py"
VLLM_ASCEND = "vllm-project/vllm-ascend"
SRC_FIA_PAD = (
    f"{VLLM_ASCEND} PR #6357 (merged) 'Pads query_start_loc to satisfy FIA/TND constraint': "
    "NPUModelRunner._pad_query_start_loc_for_fia (vllm_ascend/worker/model_runner_v1.py); queryT != "
    "actualSequenceLengthQ[-1] fails aclnnFusedInferAttentionScoreV3 tiling (error 561002, PR #6535)"
)
# CANN's texts (FIA tiling, error 561002) as vLLM Ascend's threads quote them.
CANN_TEXT_KV_LENGTHS = (
    f"CANN's text, quoted in {VLLM_ASCEND} PR #10769 (merged, 'Pad seq_lens/block_table to fix FIA error 561002 "
    "with flashcomm1'): \"The size(20) of actualSeqLengthsKv is not equal to the batchSize(21)\""
)
CANN_TEXT_BLOCK_TABLE = (
    f"CANN's text, quoted in {VLLM_ASCEND} PR #10769 (merged): \"When page attention enable, block table shape "
    "should be [21, >=29], now is [20, 1104]. [FUNC:CheckBlockTableShape]\" (reported once the KV lengths were "
    "padded: FIA checks them first)"
)
CANN_TEXT_QUERY_T = (
    f"CANN's text, quoted in {VLLM_ASCEND} issue #6076: \"When layout is TND, queryT(8) must be equal to the last "
    "element of actualSequenceLengthQ(5)[FUNC:CheckFAISeqlenDataInTND][FILE:fused_infer_attention_score_tiling.cpp]\""
)
SRC_ZERO_KV = (
    f"{VLLM_ASCEND} vllm_ascend/compilation/acl_graph.py@f575cbb3 (update_*_attn_params pad "
    "seq_lens_list with 0 for padded requests) and _pad_query_start_loc_for_fia (padded requests)"
)
SRC_ATB_SIGNATURE = "torch-npu 2.13.0 lib/libop_plugin_atb.so (schema inferred from the C++ signature)"
SRC_RESHAPE_CALL = f"{VLLM_ASCEND} vllm_ascend/device/device_op.py@5fd1a15d (BaseDeviceAdaptor.reshape_and_cache)"
SRC_ROPE_CALL = f"{VLLM_ASCEND} vllm_ascend/ops/rotary_embedding.py (rope_forward_oot: contiguous [T, heads*rot] q/k)"
SRC_ADD_RMS_NORM = (
    "torch-npu 2.13.0 csrc/aten/npu_native_functions_by_codegen.yaml:123 (schema only, no op doc); "
    f"{VLLM_ASCEND} vllm_ascend/ops/layernorm.py call site"
)

# vLLM Ascend's call sites of the kernels its A2/A3 graph paths issue (commit 182b75ea).
VA_COMMIT = "182b75ea"
SRC_SCATTER_CALL = f"{VLLM_ASCEND} vllm_ascend/device/device_op.py@{VA_COMMIT}:45-53 (BaseDeviceAdaptor.reshape_and_cache)"
SRC_PA_CALL = (
    f"{VLLM_ASCEND} vllm_ascend/attention/attention_v1.py@{VA_COMMIT}:1563-1573 (forward_paged_attention) and "
    "1265-1276 (full_graph_pa); torch-npu 2.13.0 lib/libop_plugin_atb.so atb::_npu_paged_attention (no op doc)"
)
SRC_FIA_V2_CALL = f"{VLLM_ASCEND} vllm_ascend/attention/attention_v1.py@{VA_COMMIT}:1191-1210 (full_graph_fia_v2)"

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


@dataclass(frozen=True)
class KernelRule:
    """One thing a kernel demands of its arguments, with where the demand is written."""

    kernel: str  # torch_npu kernel name, or "ascendgraph::<op>" for a rule our op implies
    name: str  # rule id, snake_case
    source: str  # citation
    applies: Callable[[Mapping[str, Any]], bool]
    holds: Callable[[Mapping[str, Any]], bool]
    describe: Callable[[Mapping[str, Any]], str]  # names the offending values


# --------------------------------------------------------------------------- argument helpers


def _dt(value: Any) -> str:
    return str(getattr(value, "dtype", value)).replace("torch.", "")


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(int(s) for s in value.shape)


def _contiguous(value: Any) -> bool:
    return value is None or bool(value.is_contiguous())


def _ints(values: Optional[Sequence[Any]]) -> list[int]:
    return [int(v) for v in values] if values is not None else []


def _present(*names: str) -> Callable[[Mapping[str, Any]], bool]:
    return lambda a: all(a.get(n) is not None for n in names)


def _always(a: Mapping[str, Any]) -> bool:
    """Every call."""
    return True


def _paged(a: Mapping[str, Any]) -> bool:
    """Page attention: the call passes a block table."""
    return a.get("block_table") is not None


def _tnd(a: Mapping[str, Any]) -> bool:
    """The TND layout (tokens of all requests, heads, head dim)."""
    return a.get("input_layout") == "TND"


def _tnd_with_lengths(a: Mapping[str, Any]) -> bool:
    """TND with its cumulative query lengths given."""
    return _tnd(a) and a.get("actual_seq_lengths") is not None


def _paged_with_lengths(a: Mapping[str, Any]) -> bool:
    """Page attention with KV lengths and a block size: the blocks each request needs are known."""
    return _paged(a) and a.get("actual_seq_lengths_kv") is not None and a.get("block_size", 0) > 0


def _q_lens(a: Mapping[str, Any]) -> list[int]:
    ends = _ints(a.get("actual_seq_lengths"))
    return [end - start for start, end in zip([0, *ends[:-1]], ends)]


def _q_s(a: Mapping[str, Any]) -> int:
    """The call's Q_S, which picks the op docs' branch (:8201 Q_S > 1, :8269 Q_S == 1): in TND
    the longest request's query length, else the query's S axis (BNSD: dim 2; BSH/BSND: dim 1)."""
    query = a.get("query")
    if _tnd(a):
        if a.get("actual_seq_lengths") is not None:
            return max(_q_lens(a), default=0)
        return int(query.shape[0]) if query is not None else 0
    if query is None or query.dim() < 3:
        return 1
    return int(query.shape[2] if a.get("input_layout") in ("BNSD", "BNSD_BSND") else query.shape[1])


def _batch(a: Mapping[str, Any]) -> int:
    if _tnd(a):
        return len(_ints(a.get("actual_seq_lengths")))
    return int(a["query"].shape[0])


def _q_s_gt_1_limits(kernel: str, prefix: str, q_s: Callable[[Mapping[str, Any]], int],
                     batch: Callable[[Mapping[str, Any]], int], heads: str, batch_source: str,
                     heads_source: str) -> tuple["KernelRule", "KernelRule"]:
    """The fused attention's limits when a request has more than one query token (v1 and v2
    state the same two, each kernel in its own argument names): B <= 65536, N <= 256."""
    applies = lambda a: _present("query")(a) and q_s(a) > 1  # noqa: E731
    return (
        KernelRule(kernel, f"{prefix}q_s_gt_1_batch_limit", batch_source, applies, lambda a: batch(a) <= 65536,
                   lambda a: f"batch of {batch(a)} requests with Q_S={q_s(a)}; the fused attention takes at most "
                             "65536 when a request has more than one query token"),
        KernelRule(kernel, f"{prefix}q_s_gt_1_heads_limit", heads_source, applies,
                   lambda a: int(a.get(heads, 1)) <= 256,
                   lambda a: f"{heads}={a.get(heads)} with Q_S={q_s(a)}; the fused attention takes at most 256 "
                             "query heads when a request has more than one query token"),
    )


def _blocks_needed(a: Mapping[str, Any]) -> list[int]:
    size = int(a["block_size"])
    return [math.ceil(max(n, 0) / size) for n in _ints(a["actual_seq_lengths_kv"])]


def _kv_heads(a: Mapping[str, Any]) -> int:
    return int(a.get("num_key_value_heads") or 0) or int(a.get("num_heads", 1))


def _head_dim(a: Mapping[str, Any]) -> int:
    """The query's D (:8064: D = H/N): its last axis, except in BSH (the schema's default
    layout), whose last axis is H = N*D."""
    last = int(a["query"].shape[-1])
    if (a.get("input_layout") or "BSH") == "BSH":
        return last // max(int(a.get("num_heads") or 1), 1)
    return last


def _int8_in(a: Mapping[str, Any], *names: str) -> bool:
    return any(getattr(a.get(name), "dtype", None) == torch.int8 for name in names)


def _query_dtype_ok(a: Mapping[str, Any]) -> bool:
    """:8065: float16, bfloat16 or int8; the Q_S > 1 branch refuses an int8 query with page
    attention (:8224), the Q_S == 1 branch int8 query, key and value together (:8272)."""
    dtype = a["query"].dtype
    if dtype in HALF:
        return True
    if dtype != torch.int8:
        return False
    if _q_s(a) > 1:
        return not _paged(a)
    return not _int8_in(a, "key") or not _int8_in(a, "value")


def _describe_query_dtype(a: Mapping[str, Any]) -> str:
    if a["query"].dtype != torch.int8:
        return (f"query dtype is {_dt(a['query'])}; the fused attention takes float16, bfloat16 or int8 "
                "(run the model in --dtype bfloat16)")
    if _q_s(a) > 1:
        return f"an int8 query with page attention (block_table) and Q_S={_q_s(a)} > 1; use float16 or bfloat16"
    return "int8 query, key and value together with Q_S == 1; use a float16 or bfloat16 query"


def _head_dim_alignment(a: Mapping[str, Any]) -> int:
    """:8210 (the Q_S > 1 branch): 32 when query, key or value is int8, 16 when all are half."""
    return 32 if _int8_in(a, "query", "key", "value") else 16


def _kv_hidden_limit(a: Mapping[str, Any]) -> int:
    """KV_N*D of the (blocknum, blocksize, H) cache layout: :8220 (Q_S > 1) refuses it "over
    65535", :8287 (Q_S == 1) "over 64k"."""
    return 65535 if _q_s(a) > 1 else 65536


def _gqa_ok(a: Mapping[str, Any]) -> bool:
    """num_heads is a multiple of the KV heads, at most 64 per KV head."""
    heads, kv_heads = int(a.get("num_heads", 1)), _kv_heads(a)
    return kv_heads > 0 and heads % kv_heads == 0 and heads // kv_heads <= 64


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


def _nondecreasing(values: list[int]) -> bool:
    return all(v >= 0 for v in values) and all(b >= a for a, b in zip(values, values[1:]))


# --------------------------------------------------------------------------- the fused attention's semantics (v1 and v2)
# The rules below hold for both fused-attention kernels; each kernel states them in its own
# argument names (`_FusedNames`) and at its own op-docs lines (`_FusedLines`), so one factory
# (`_fused_semantics_rules`) writes both sets. What the simulator computes for the calls they
# accept is sim/attention.py.

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
class _FusedNames:
    """A fused-attention kernel's spelling of the arguments the shared rules read."""

    q_lengths: str
    kv_lengths: str
    heads: str


_V1_NAMES = _FusedNames("actual_seq_lengths", "actual_seq_lengths_kv", "num_heads")
_V2_NAMES = _FusedNames("actual_seq_qlen", "actual_seq_kvlen", "num_query_heads")


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
              "1 needs the full mask); :8225-8226 (page attention: KV_S >= block_table columns * block_size)",
    band=f"{DOCS}:8200 (sparse_mode 4: pre_tokens >= -actual_seq_qlen, next_tokens >= -actual_seq_kvlen, pre_tokens "
         "+ next_tokens >= 0); the band's two edges must meet (npu_fusion_attention, :1645)",
    inner_precise=f"{DOCS}:8124-8128 (inner_precise 0-3; Q_S == 1 takes only 0 and 1)",
    tnd_sparse=f"{DOCS}:8198, 8200 (TND: sparse_mode 0, or 3 / 4 with the mask)",
)
_V2_LINES = _FusedLines(
    layouts=f"{DOCS}:8631-8634 (BSH, BSND, BNSD, BNSD_BSND, TND and the NTD/NBSD variants; BNSD_BSND only with "
            "Q_S > 1)",
    lengths=f"{DOCS}:8609-8610 (outside TND one entry per batch, or one for all; each at most the S axis); "
            ":8780 (page attention: actual_seq_kvlen required)",
    full_mask=f"{DOCS}:8602 (bool/int8/uint8, contiguous); :8603-8606 (sparse_mode 0/1: (Q_S, KV_S), (B, KV_S) at "
              "Q_S == 1, (1, Q_S, KV_S), (B, 1, Q_S, KV_S), (1, 1, Q_S, KV_S), S rounded up allowed); :8637 (sparse_mode "
              "1 needs the full mask); :8782-8783 (page attention: KV_S >= block_table columns * block_size)",
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


def _fused_q_s(a: Mapping[str, Any], n: _FusedNames) -> int:
    if _tnd(a):
        ends = _ints(a.get(n.q_lengths))
        return max((b - s for s, b in zip([0, *ends[:-1]], ends)), default=0)
    return _query_batch_s(a)[1]


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


def _request_lengths(a: Mapping[str, Any], n: _FusedNames) -> list[tuple[int, int]]:
    """(q_len, kv_len) of every request of the call."""
    if _tnd(a):
        ends = _ints(a.get(n.q_lengths))
        q_lens = [b - s for s, b in zip([0, *ends[:-1]], ends)]
        kv = _ints(a.get(n.kv_lengths))
        kv_lens = kv if _paged(a) else [b - s for s, b in zip([0, *kv[:-1]], kv)]
        return list(zip(q_lens, kv_lens))
    batch, s = _query_batch_s(a)
    q_lens = [1] * batch if s == 1 else _per_batch(_ints(a.get(n.q_lengths)), batch, s)
    kv_lens = _per_batch(_ints(a.get(n.kv_lengths)), batch, 0 if _paged(a) else _kv_span(a))
    return list(zip(q_lens, kv_lens))


def _mask_extent(a: Mapping[str, Any], n: _FusedNames) -> tuple[int, int, int]:
    """(B, Q_S, KV_S) a full mask must cover: in TND the longest request's query and (unpaged)
    key lengths, else the query's and key's S axes; paged, the block table's reach."""
    if _tnd(a):
        lengths = _request_lengths(a, n)
        kv_s = _kv_span(a) if _paged(a) else max((kv for _, kv in lengths), default=0)
        return len(lengths), max((q for q, _ in lengths), default=0), kv_s
    batch, q_s = _query_batch_s(a)
    return batch, q_s, _kv_span(a)


def _full_mask_ok(a: Mapping[str, Any], n: _FusedNames) -> bool:
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


def _describe_full_mask(a: Mapping[str, Any], n: _FusedNames) -> str:
    mask = a.get("atten_mask")
    batch, q_s, kv_s = _mask_extent(a, n)
    need = (f"sparse_mode {a.get('sparse_mode')} needs a contiguous bool/int8/uint8 mask of (Q_S, KV_S), "
            f"(1, Q_S, KV_S) or (B|1, 1, Q_S, KV_S) with Q_S={q_s}, KV_S={kv_s}, B={batch}"
            + (" (or (B, KV_S): Q_S is 1)" if q_s == 1 and not _tnd(a) else ""))
    if mask is None:
        return f"atten_mask is missing; {need}"
    return f"atten_mask has shape {_shape(mask)}, dtype {_dt(mask)}, contiguous={_contiguous(mask)}; {need}"


def _band_ok(a: Mapping[str, Any], n: _FusedNames) -> bool:
    pre, nxt = int(a.get("pre_tokens", 2147483647)), int(a.get("next_tokens", 2147483647))
    return pre + nxt >= 0 and all(pre >= -q and nxt >= -kv for q, kv in _request_lengths(a, n))


def _lengths_ok(a: Mapping[str, Any], n: _FusedNames) -> bool:
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


def _layout_ok(a: Mapping[str, Any], n: _FusedNames, layouts: tuple[str, ...]) -> bool:
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


def _inner_precise_ok(a: Mapping[str, Any], n: _FusedNames) -> bool:
    value = int(a.get("inner_precise", 0))
    return value in (0, 1) or (value in (2, 3) and _fused_q_s(a, n) > 1)


def _workspace_needed(a: Mapping[str, Any], kernel: str) -> int:
    return fused_attention_workspace_bytes(a, v2=kernel == FIA_V2)


def _workspace_rule(kernel: str, prefix: str, needed: Callable[[Mapping[str, Any]], int], query: str,
                    source: str) -> "KernelRule":
    return KernelRule(
        kernel, f"{prefix}workspace_too_small", source,
        lambda a: a.get("workspace") is not None and hasattr(a["workspace"], "numel"),
        lambda a: tensor_bytes(a["workspace"]) >= needed(a),
        lambda a: f"workspace holds {tensor_bytes(a['workspace'])} bytes but this call needs {needed(a)} (what "
                  f"{query} returns for its arguments): a workspace queried for a smaller call (another capture size, "
                  "a layer with fewer heads, a narrower block table) cannot serve it; query it for the largest call "
                  "that will use it and keep the largest",
    )


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


def _fused_semantics_rules(kernel: str, prefix: str, n: _FusedNames, lines: _FusedLines,
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
                   lambda a: mode(a) == 4 and _present("query", "key")(a) and _fused_q_s(a, n) > 1,
                   lambda a: _band_ok(a, n),
                   lambda a: f"pre_tokens={a.get('pre_tokens')}, next_tokens={a.get('next_tokens')} for (q_len, kv_len) "
                             f"{_request_lengths(a, n)}: the band needs pre_tokens + next_tokens >= 0, pre_tokens >= "
                             "-q_len and next_tokens >= -kv_len"),
        KernelRule(kernel, f"{prefix}inner_precise", lines.inner_precise, _present("query"),
                   lambda a: _inner_precise_ok(a, n),
                   lambda a: f"inner_precise={a.get('inner_precise')} with Q_S={_fused_q_s(a, n)}: 0-3, and only 0 or "
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


# --------------------------------------------------------------------------- the table

def _paged_kv_layout_ok(a: Mapping[str, Any]) -> bool:
    """A paged cache is (blocknum, blocksize, H), or (blocknum, KV_N, blocksize, D) with a BNSD or TND query."""
    return a["key"].dim() == 3 or (a["key"].dim() == 4 and (a.get("input_layout") or "BSH") in ("BNSD", "BNSD_BSND", "TND"))


def _paged_kv_lengths_ok(a: Mapping[str, Any]) -> bool:
    """actual_seq_lengths_kv is given, with one non-negative KV length per request of actual_seq_lengths."""
    kv = a.get("actual_seq_lengths_kv")
    return kv is not None and len(kv) == len(a["actual_seq_lengths"]) and all(v >= 0 for v in _ints(kv))


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
               lambda a: _tnd_with_lengths(a) and _present("query")(a) and len(a["actual_seq_lengths"]) > 0,
               lambda a: int(a["query"].shape[0]) == int(a["actual_seq_lengths"][-1]),
               lambda a: f"query has T={int(a['query'].shape[0])} tokens but actual_seq_lengths[-1]="
                         f"{int(a['actual_seq_lengths'][-1])}; pad with a dummy request so the last end equals T"),
    KernelRule(FIA, "paged_kv_lengths_per_request", f"{DOCS}:8222 (page attention: actual_seq_lengths_kv "
               f"required); :8275 (TND+PA: one entry per batch, each the request's KV length); {CANN_TEXT_KV_LENGTHS}",
               lambda a: _paged(a) and _tnd_with_lengths(a),
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
               lambda a: a["block_table"].dim() == 2 and int(a["block_table"].shape[0]) == _batch(a),
               lambda a: f"block_table has shape {_shape(a['block_table'])} for {_batch(a)} "
                         "requests; it needs one row per request"),
    KernelRule(FIA, "block_table_columns", f"{DOCS}:8223, 8284 (second dim >= maxBlockNumPerSeq of the longest "
               f"actual_seq_lengths_kv); {CANN_TEXT_BLOCK_TABLE}",
               lambda a: _paged_with_lengths(a) and a["block_table"].dim() == 2,
               lambda a: int(a["block_table"].shape[1]) >= max(_blocks_needed(a), default=0),
               lambda a: f"block_table has {int(a['block_table'].shape[1])} columns but the longest KV length "
                         f"({max(_ints(a['actual_seq_lengths_kv']), default=0)}) needs {max(_blocks_needed(a), default=0)} "
                         f"blocks of {a['block_size']}"),
    KernelRule(FIA, "enough_cache_blocks", f"{DOCS}:8220, 8285 (blocknum >= sum of the blocks every batch needs)",
               lambda a: _paged_with_lengths(a) and _present("key")(a),
               lambda a: int(a["key"].shape[0]) >= sum(_blocks_needed(a)),
               lambda a: f"the cache holds {int(a['key'].shape[0])} blocks but the KV lengths "
                         f"{_ints(a['actual_seq_lengths_kv'])} need {sum(_blocks_needed(a))} of {a['block_size']}"),
    KernelRule(FIA, "paged_block_size", PAGED_BLOCK_SIZE_SOURCE,
               _paged, lambda a: paged_block_size_ok(a.get("block_size", 0), _q_s(a), int8_kv=_int8_in(a, "key")),
               lambda a: describe_paged_block_size(a.get("block_size", 0), _q_s(a), int8_kv=_int8_in(a, "key"))),
    *_q_s_gt_1_limits(FIA, "", _q_s, _batch, "num_heads", f"{DOCS}:8203 (Q_S > 1, the branch opening at :8201: "
                      "the B axis at most 65536)", f"{DOCS}:8204 (Q_S > 1: the N axis at most 256)"),
    # No kv_len >= q_len rule: the op docs' sparse_mode 3 interception (:8248) belongs to the
    # int8-output list (:8244, "输出为int8 ... quant_offset2"), and the TND one (:8198) to the
    # D=192 branch (:8193-8199); neither is this call (bf16 out, D 128), and the rule refused
    # vLLM Ascend's own dummy request (kv_len 1 behind a longer padded query).
    KernelRule(FIA, "head_dim_16_aligned", f"{DOCS}:8210 (Q_S > 1, the branch opening at :8201: D 16-aligned when "
               "query, key and value are float16/bfloat16, 32-aligned when one is int8; the Q_S == 1 branch at :8269 "
               "asks no alignment)",
               lambda a: _present("query")(a) and _q_s(a) > 1, lambda a: _head_dim(a) % _head_dim_alignment(a) == 0,
               lambda a: f"head_dim={_head_dim(a)} with Q_S={_q_s(a)} > 1; the fused attention needs a multiple of "
                         f"{_head_dim_alignment(a)}"),
    KernelRule(FIA, "head_dim_limit", f"{DOCS}:8204 (Q_S > 1: the D axis at most 512); :8271 (Q_S == 1: the D axis "
               "at most 512)",
               _present("query"), lambda a: _head_dim(a) <= 512,
               lambda a: f"head_dim={_head_dim(a)}; the fused attention takes at most 512"),
    KernelRule(FIA, "gqa_ratio", f"{DOCS}:8116 (num_heads divisible by num_key_value_heads, ratio <= 64)",
               _always, _gqa_ok,
               lambda a: f"num_heads={a.get('num_heads', 1)}, num_key_value_heads={_kv_heads(a)}: heads must be a "
                         "multiple of kv heads with at most 64 per kv head"),
    KernelRule(FIA, "kv_hidden_limit", f"{DOCS}:8220 (Q_S > 1: a (blocknum, blocksize, H) cache with KV_N*D over "
               "65535 is rejected; the (blocknum, KV_N, blocksize, D) layout is the way out); :8287 (Q_S == 1: over 64k)",
               lambda a: _paged(a) and _present("query", "key")(a) and a["key"].dim() == 3,
               lambda a: _kv_heads(a) * _head_dim(a) <= _kv_hidden_limit(a),
               lambda a: f"num_key_value_heads*head_dim={_kv_heads(a) * _head_dim(a)} exceeds {_kv_hidden_limit(a)} "
                         "in the (blocknum, blocksize, H) cache layout; use GQA or the (blocknum, KV_N, blocksize, D) "
                         "layout"),
    KernelRule(FIA, "sparse_mode_range", f"{DOCS}:8212 (sparse_mode only 0-4)",
               _always, lambda a: int(a.get("sparse_mode", 0)) in (0, 1, 2, 3, 4),
               lambda a: f"sparse_mode={a.get('sparse_mode')} is not one of 0-4"),
    KernelRule(FIA, "causal_mask_2048", f"{DOCS}:8076 (mask bool/int8/uint8, contiguous); :8081, 8214 (sparse 2/3/4: "
               "mask required, (2048, 2048) or (1, 2048, 2048) or (1, 1, 2048, 2048))",
               lambda a: a.get("sparse_mode") in (2, 3, 4), _mask_ok,
               lambda a: "atten_mask is missing" if a.get("atten_mask") is None else
               f"atten_mask has shape {_shape(a['atten_mask'])}, dtype {_dt(a['atten_mask'])}; sparse_mode "
               f"{a.get('sparse_mode')} needs a contiguous 2048 x 2048 bool mask"),
    *_fused_semantics_rules(FIA, "", _V1_NAMES, _V1_LINES, V1_LAYOUTS,
                            "_npu_fused_infer_attention_score_get_max_workspace"),
)

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

def _kv_write_dtype_ok(a: Mapping[str, Any]) -> bool:
    """key, value and both caches share one float16/bfloat16 dtype."""
    dtype = a["key_cache"].dtype
    return dtype in HALF and a["value_cache"].dtype == dtype and a["key"].dtype == dtype and a["value"].dtype == dtype


def _one_slot_per_token(a: Mapping[str, Any]) -> bool:
    """One slot per key/value row, and rows shaped like a cache slot [kv_heads, D]."""
    return (int(a["slot_indices"].numel()) == int(a["key"].shape[0]) == int(a["value"].shape[0])
            and _shape(a["key"])[1:] == _shape(a["key_cache"])[2:])


_RESHAPE_AND_CACHE_RULES = (
    KernelRule(RESHAPE_AND_CACHE, "cache_dtype", f"{SRC_RESHAPE_CALL}; float16/bfloat16 assumed (no op doc in the wheel)",
               _present("key_cache"), _kv_write_dtype_ok,
               lambda a: f"key {_dt(a['key'])}, value {_dt(a['value'])}, key_cache {_dt(a['key_cache'])}, value_cache "
                         f"{_dt(a['value_cache'])}: need one float16/bfloat16 dtype"),
    KernelRule(RESHAPE_AND_CACHE, "caches_contiguous", f"{SRC_ATB_SIGNATURE}: key_cache/value_cache are written in place",
               _present("key_cache"), lambda a: _contiguous(a["key_cache"]) and _contiguous(a["value_cache"]),
               lambda a: "key_cache or value_cache is not contiguous"),
    KernelRule(RESHAPE_AND_CACHE, "slot_indices_int32", f"{VLLM_ASCEND} vllm_ascend/worker/v2/model_runner.py (comment: the "
               "reshape-and-cache operator requires int32 slot mappings)",
               _present("slot_indices"), lambda a: a["slot_indices"].dtype == torch.int32,
               lambda a: f"slot_indices dtype is {_dt(a['slot_indices'])}, not int32"),
    KernelRule(RESHAPE_AND_CACHE, "one_slot_per_token", f"{SRC_RESHAPE_CALL}: key/value [tokens, kv_heads, D], one slot each",
               _present("slot_indices", "key"),
               _one_slot_per_token,
               lambda a: f"key {_shape(a['key'])}, value {_shape(a['value'])}, {int(a['slot_indices'].numel())} slots, "
                         f"key_cache {_shape(a['key_cache'])}"),
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

def _trailing(gamma: Any, x: Any) -> bool:
    """gamma's shape is x's trailing dims (the dims being normalised)."""
    return _shape(gamma) == _shape(x)[-gamma.dim():]


def _gamma_like_input(a: Mapping[str, Any]) -> bool:
    """npu_rms_norm's gamma has the input's dtype and its trailing dims."""
    return a["gamma"].dtype == a["input"].dtype and _trailing(a["gamma"], a["input"])


def _add_norm_inputs_ok(a: Mapping[str, Any]) -> bool:
    """x1 and x2 have one shape and one float16/bfloat16/float32 dtype."""
    return a["x1"].dtype in NORM and a["x2"].dtype == a["x1"].dtype and _shape(a["x1"]) == _shape(a["x2"])


def _gamma_like_x1(a: Mapping[str, Any]) -> bool:
    """gamma has x1's dtype and its trailing dims."""
    return a["gamma"].dtype == a["x1"].dtype and _trailing(a["gamma"], a["x1"])


_NORM_RULES = (
    KernelRule(RMS_NORM, "input_dtype", f"{DOCS}:3447, 3458 (float16, bfloat16, float32)",
               _present("input"), lambda a: a["input"].dtype in NORM,
               lambda a: f"input dtype is {_dt(a['input'])}"),
    KernelRule(RMS_NORM, "input_rank", f"{DOCS}:3447 (input has 2-8 dims)",
               _present("input"), lambda a: 2 <= a["input"].dim() <= 8,
               lambda a: f"input has {a['input'].dim()} dims (shape {_shape(a['input'])}); npu_rms_norm takes 2-8"),
    KernelRule(RMS_NORM, "gamma_like_input", f"{DOCS}:3448 (gamma dtype equals input's; the normalised last dims)",
               _present("input", "gamma"), _gamma_like_input,
               lambda a: f"gamma {_shape(a['gamma'])} {_dt(a['gamma'])} vs input {_shape(a['input'])} {_dt(a['input'])}"),
    KernelRule(ADD_RMS_NORM, "x_dtype", SRC_ADD_RMS_NORM,
               _present("x1", "x2"), _add_norm_inputs_ok,
               lambda a: f"x1 {_shape(a['x1'])} {_dt(a['x1'])}, x2 {_shape(a['x2'])} {_dt(a['x2'])}: need equal "
                         "shapes and one float16/bfloat16/float32 dtype"),
    KernelRule(ADD_RMS_NORM, "gamma_like_x", SRC_ADD_RMS_NORM,
               _present("x1", "gamma"), _gamma_like_x1,
               lambda a: f"gamma {_shape(a['gamma'])} {_dt(a['gamma'])} vs x1 {_shape(a['x1'])} {_dt(a['x1'])}"),
)

_DYN_LIKE_GAMMA = ("smooth_scale1", "smooth_scale2", "beta")


def _quant_axis_width(a: Mapping[str, Any]) -> Optional[int]:
    """The size of npu_quantize's elementwise axis (:11377, schema default 1; without div_mode
    -2, or else the last axis: :11378); None when the axis is outside the input's dims."""
    axis, dims = int(a.get("axis", 1)), a["input"].dim()
    if not a.get("div_mode", True):
        axis = -2 if axis == -2 else -1
    return int(a["input"].shape[axis]) if -dims <= axis < dims else None


def _quant_per_channel_ok(a: Mapping[str, Any]) -> bool:
    """scales and zero_points hold one value for the whole input, or one per element of its
    elementwise axis (the other axes broadcast)."""
    width = _quant_axis_width(a)
    return width is not None and all(
        a.get(name) is None or int(a[name].numel()) in (1, width) for name in ("scales", "zero_points"))

def _quant_scales_ok(a: Mapping[str, Any]) -> bool:
    """npu_quantize's scales: float32/bfloat16, contiguous, at most 1-D."""
    scales = a["scales"]
    return scales.dtype in QUANT_SCALE_DTYPES and _contiguous(scales) and scales.dim() <= 1


def _quant_zero_points_ok(a: Mapping[str, Any]) -> bool:
    """npu_quantize's zero_points: int8/uint8/int32/bfloat16, contiguous."""
    return a["zero_points"].dtype in QUANT_OFFSET_DTYPES and _contiguous(a["zero_points"])


def _scales1_like_gamma(a: Mapping[str, Any]) -> bool:
    """scales1 has gamma's shape, a float32/bfloat16 dtype and is contiguous."""
    scales = a["scales1"]
    return _shape(scales) == _shape(a["gamma"]) and scales.dtype in QUANT_SCALE_DTYPES and _contiguous(scales)


def _zero_points1_like_gamma(a: Mapping[str, Any]) -> bool:
    """zero_points1 has gamma's shape and an int32/bfloat16 dtype."""
    return _shape(a["zero_points1"]) == _shape(a["gamma"]) and a["zero_points1"].dtype in (torch.int32, torch.bfloat16)


def _gamma_shape_ok(a: Mapping[str, Any]) -> bool:
    """gamma has 1-8 dims, no more than x1, and they are x1's trailing dims."""
    return 1 <= a["gamma"].dim() <= min(8, a["x1"].dim()) and _trailing(a["gamma"], a["x1"])


def _dynamic_quant_inputs_ok(a: Mapping[str, Any]) -> bool:
    """x1 and x2 share one float16/bfloat16 dtype; x1 has 2-8 dims."""
    return a["x1"].dtype in HALF and a["x2"].dtype == a["x1"].dtype and 2 <= a["x1"].dim() <= 8


def _smooth_scales_and_beta_like_gamma(a: Mapping[str, Any]) -> bool:
    """smooth_scale1, smooth_scale2 and beta, where given, have gamma's shape and dtype."""
    gamma = a["gamma"]
    return all(_shape(a[n]) == _shape(gamma) and a[n].dtype == gamma.dtype
               for n in _DYN_LIKE_GAMMA if a.get(n) is not None)


def _gamma_vector_ok(a: Mapping[str, Any]) -> bool:
    """gamma is 1-D, as long as x1's last dim, in x1's dtype."""
    gamma, x1 = a["gamma"], a["x1"]
    return gamma.dim() == 1 and int(gamma.shape[0]) == int(x1.shape[-1]) and gamma.dtype == x1.dtype


def _output_mask_ok(a: Mapping[str, Any]) -> bool:
    """Two bools, not both False; a smooth scale given needs its bit set."""
    mask = a["output_mask"]
    return (len(mask) == 2 and any(mask) and (a.get("smooth_scale1") is None or bool(mask[0]))
            and (a.get("smooth_scale2") is None or bool(mask[1])))


_QUANT_RULES = (
    KernelRule(DYNAMIC_QUANT, "input_dtype_half", f"{DOCS}:4673 (float16, bfloat16)",
               _present("input"), lambda a: a["input"].dtype in HALF, lambda a: f"input dtype is {_dt(a['input'])}"),
    KernelRule(DYNAMIC_QUANT, "input_rank", f"{DOCS}:4673 (input needs more than 1 dim)",
               _present("input"), lambda a: a["input"].dim() > 1, lambda a: f"input has shape {_shape(a['input'])}"),
    KernelRule(QUANTIZE, "input_dtype", f"{DOCS}:11357 (float, float16, bfloat16)",
               _present("input"), lambda a: a["input"].dtype in NORM, lambda a: f"input dtype is {_dt(a['input'])}"),
    KernelRule(QUANTIZE, "scales", f"{DOCS}:11359-11361 (div_mode: scales float32/bfloat16); issue #15 (contiguous "
               "per-tensor or per-channel scales)",
               _present("scales"), _quant_scales_ok,
               lambda a: f"scales {_shape(a['scales'])} {_dt(a['scales'])} contiguous={_contiguous(a['scales'])}"),
    KernelRule(QUANTIZE, "zero_points", f"{DOCS}:11366-11368 (int8, uint8, int32, bfloat16)",
               _present("zero_points"), _quant_zero_points_ok,
               lambda a: f"zero_points dtype is {_dt(a['zero_points'])}"),
    KernelRule(QUANTIZE, "scales_per_channel", f"{DOCS}:11377 (axis: the elementwise axis, the other axes "
               "broadcast); :11362, 11369 (a 1-D scales / zero_points holds input.shape[axis] values or 1)",
               _present("input", "scales"), _quant_per_channel_ok,
               lambda a: f"scales of {int(a['scales'].numel())} and zero_points of "
                         f"{None if a.get('zero_points') is None else int(a['zero_points'].numel())} values for input "
                         f"{_shape(a['input'])} along axis {a.get('axis', 1)} ({_quant_axis_width(a)} wide): need 1 or "
                         "one per element of the axis"),
    KernelRule(QUANTIZE, "out_dtype", f"{DOCS}:11373-11375 (qint8, quint8, int32)",
               lambda a: "dtype" in a, lambda a: a["dtype"] in (torch.qint8, torch.quint8, torch.int32),
               lambda a: f"dtype={a['dtype']}"),
    KernelRule(ADD_RMS_NORM_QUANT, "x_dtype_half", f"{DOCS}:12300-12301 (x1, x2 bfloat16/float16, equal dtypes)",
               _present("x1", "x2"), lambda a: a["x1"].dtype in HALF and a["x2"].dtype == a["x1"].dtype,
               lambda a: f"x1 {_dt(a['x1'])}, x2 {_dt(a['x2'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "gamma_like_x", f"{DOCS}:12302 (gamma dtype equals x1's)",
               _present("x1", "gamma"), lambda a: a["gamma"].dtype == a["x1"].dtype,
               lambda a: f"gamma {_dt(a['gamma'])} vs x1 {_dt(a['x1'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "scales_like_gamma", f"{DOCS}:12303 (scales1 shape equals gamma's, float32/bfloat16); "
               "issue #15 (contiguous scales)",
               _present("scales1", "gamma"), _scales1_like_gamma,
               lambda a: f"scales1 {_shape(a['scales1'])} {_dt(a['scales1'])} vs gamma {_shape(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "zero_points_like_gamma", f"{DOCS}:12304 (zero_points1 shape equals gamma's, int32/bfloat16)",
               _present("zero_points1", "gamma"), _zero_points1_like_gamma,
               lambda a: f"zero_points1 {_shape(a['zero_points1'])} {_dt(a['zero_points1'])} vs gamma {_shape(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "axis_minus_one", f"{DOCS}:12308 (axis: only -1)",
               lambda a: "axis" in a, lambda a: int(a["axis"]) == -1, lambda a: f"axis={a['axis']}"),
    KernelRule(ADD_RMS_NORM_QUANT, "x_shapes", f"{DOCS}:12300-12301 (x1, x2 1-8 dims); :12312, 12314 (y1 and x_out "
               "have x1's and x2's shape: the two agree)",
               _present("x1", "x2"), lambda a: 1 <= a["x1"].dim() <= 8 and _shape(a["x2"]) == _shape(a["x1"]),
               lambda a: f"x1 {_shape(a['x1'])}, x2 {_shape(a['x2'])}: need one shape of 1-8 dims"),
    KernelRule(ADD_RMS_NORM_QUANT, "gamma_shape", f"{DOCS}:12302 (gamma 1-8 dims, the dims of x1 being normalised: "
               "its trailing dims)",
               _present("x1", "gamma"),
               _gamma_shape_ok,
               lambda a: f"gamma {_shape(a['gamma'])} vs x1 {_shape(a['x1'])}: gamma must be x1's trailing dims"),
    KernelRule(ADD_RMS_NORM_QUANT, "beta_like_gamma", f"{DOCS}:12305 (beta: gamma's shape and dtype)",
               _present("beta", "gamma"),
               lambda a: _shape(a["beta"]) == _shape(a["gamma"]) and a["beta"].dtype == a["gamma"].dtype,
               lambda a: f"beta {_shape(a['beta'])} {_dt(a['beta'])} vs gamma {_shape(a['gamma'])} {_dt(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "x_dtype_half", f"{DOCS}:12199-12200 (x1, x2 float16/bfloat16, 2-8 dims)",
               _present("x1", "x2"), _dynamic_quant_inputs_ok,
               lambda a: f"x1 {_shape(a['x1'])} {_dt(a['x1'])}, x2 {_dt(a['x2'])}"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "x_shapes", f"{DOCS}:12199-12200 (x1, x2 2-8 dims); :12212 (x_out = x1 "
               "+ x2 has x1's shape: the two agree)",
               _present("x1", "x2"), lambda a: 2 <= a["x2"].dim() <= 8 and _shape(a["x2"]) == _shape(a["x1"]),
               lambda a: f"x1 {_shape(a['x1'])}, x2 {_shape(a['x2'])}: need one shape of 2-8 dims"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "smooth_scales_and_beta_like_gamma", f"{DOCS}:12202-12204 (smooth_scale1, "
               "smooth_scale2 and beta: gamma's shape and dtype)",
               lambda a: a.get("gamma") is not None and any(a.get(n) is not None for n in _DYN_LIKE_GAMMA),
               _smooth_scales_and_beta_like_gamma,
               lambda a: ", ".join(f"{n} {_shape(a[n])} {_dt(a[n])}" for n in _DYN_LIKE_GAMMA if a.get(n) is not None)
               + f" vs gamma {_shape(a['gamma'])} {_dt(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "gamma_vector", f"{DOCS}:12201 (gamma 1-D, x1's last dim, x1's dtype)",
               _present("x1", "gamma"), _gamma_vector_ok,
               lambda a: f"gamma {_shape(a['gamma'])} {_dt(a['gamma'])} vs x1 {_shape(a['x1'])} {_dt(a['x1'])}"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "output_mask", f"{DOCS}:12206, 12218-12220 (None or 2 bools, not both "
               "False; a smooth scale needs its mask bit)",
               _present("output_mask"),
               _output_mask_ok,
               lambda a: f"output_mask={list(a['output_mask'])!r} (smooth_scale1 given: {a.get('smooth_scale1') is not None}, "
                         f"smooth_scale2 given: {a.get('smooth_scale2') is not None})"),
)

# --------------------------------------------------------------------------- vLLM Ascend's A2 graph kernels


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

def _pa_layout_ok(a: Mapping[str, Any]) -> bool:
    """query is a contiguous [T, num_heads, D]; the caches two equal [blocks, block_size, num_kv_heads, D]."""
    query, key_cache = a["query"], a["key_cache"]
    return (query.dim() == 3 and int(query.shape[1]) == int(a["num_heads"]) and key_cache.dim() == 4
            and _shape(key_cache) == _shape(a["value_cache"]) and int(key_cache.shape[2]) == int(a["num_kv_heads"])
            and int(key_cache.shape[3]) == int(query.shape[2]) and _contiguous(query))


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

def _scatter_norm_call(a: Mapping[str, Any]) -> bool:
    """A 'Norm' (ND cache) call with a 3-D key: scene 2 of the op docs."""
    return (a.get("cache_mode") in (None, "Norm") and _present("key", "value", "key_cache", "slot_mapping")(a)
            and a["key"].dim() == 3)


def _scatter_norm_layout_ok(a: Mapping[str, Any]) -> bool:
    """key/value [T, N, D] agree on T and N, the cache is [blocks, block_size, N, D], slot_mapping [T]."""
    key, slots = a["key"], a["slot_mapping"]
    return (_shape(key)[:2] == _shape(a["value"])[:2] and a["key_cache"].dim() == 4
            and _shape(a["key_cache"])[2:] == _shape(key)[1:] and int(slots.numel()) == int(key.shape[0])
            and slots.dim() == 1)


_SCATTER_RULES = (
    KernelRule(SCATTER_PA_KV_CACHE, "scatter_dtypes_equal", f"{DOCS}:7031 (key, value, key_cache, value_cache share "
               "one dtype)",
               _present("key", "value", "key_cache", "value_cache"),
               lambda a: a["key"].dtype == a["value"].dtype == a["key_cache"].dtype == a["value_cache"].dtype,
               lambda a: f"key {_dt(a['key'])}, value {_dt(a['value'])}, key_cache {_dt(a['key_cache'])}, "
                         f"value_cache {_dt(a['value_cache'])}"),
    KernelRule(SCATTER_PA_KV_CACHE, "scatter_contiguous", f"{DOCS}:7030 (non-contiguous inputs are not supported)",
               _present("key", "value", "key_cache", "value_cache", "slot_mapping"),
               lambda a: all(_contiguous(a[n]) for n in ("key", "value", "key_cache", "value_cache", "slot_mapping")),
               lambda a: "key, value, key_cache, value_cache or slot_mapping is not contiguous "
                         f"(vLLM Ascend passes .contiguous() copies: {SRC_SCATTER_CALL})"),
    KernelRule(SCATTER_PA_KV_CACHE, "scatter_slot_mapping_dtype", f"{DOCS}:7019 (slot_mapping int32 or int64)",
               _present("slot_mapping"), lambda a: a["slot_mapping"].dtype in SLOT_DTYPES,
               lambda a: f"slot_mapping dtype is {_dt(a['slot_mapping'])}"),
    KernelRule(SCATTER_PA_KV_CACHE, "scatter_cache_rank", f"{DOCS}:7017-7018 (key_cache / value_cache only 4-D)",
               _present("key_cache", "value_cache"),
               lambda a: a["key_cache"].dim() == 4 and a["value_cache"].dim() == 4,
               lambda a: f"key_cache {_shape(a['key_cache'])}, value_cache {_shape(a['value_cache'])}"),
    KernelRule(SCATTER_PA_KV_CACHE, "scatter_norm_layout", f"{DOCS}:6989-6994 (scene 2: key [T, N, D], cache "
               "[blocks, block_size, N, D], slot_mapping [T]); :7023 ('Norm': ND caches); :7034 (3-D key/value: "
               f"first two dims equal); {SRC_SCATTER_CALL}",
               _scatter_norm_call,
               _scatter_norm_layout_ok,
               lambda a: f"key {_shape(a['key'])}, value {_shape(a['value'])}, key_cache {_shape(a['key_cache'])}, "
                         f"slot_mapping {_shape(a['slot_mapping'])}"),
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


def rules_for(kernel: str) -> tuple[KernelRule, ...]:
    """The rules of one kernel (overloads and the workspace query share the base kernel's)."""
    name = _ALIASES.get(kernel, kernel)
    return tuple(rule for rule in RULES if rule.kernel == name)


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


