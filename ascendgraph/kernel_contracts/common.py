"""What every family of kernel rules shares: the `KernelRule` record, the kernel names,
the dtype lists (one per meaning), the sources the rules cite and the readers of a call's
arguments (``a``: the call's keyword arguments by torch_npu's schema names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from ascendgraph.workspace_sizes import tensor_bytes

FIA = "npu_fused_infer_attention_score"
RESHAPE_AND_CACHE = "_npu_reshape_and_cache"
ROTARY_EMBEDDING = "_npu_rotary_embedding"
SWIGLU = "npu_swiglu"
MROPE = "npu_mrope"
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
SRC_RESHAPE_CALL = (f"{VLLM_ASCEND} vllm_ascend/device/device_op.py@182b75ea:1841-1850 "
                    "(Ascend310PDeviceAdaptor.reshape_and_cache; A2/A3 write with npu_scatter_pa_kv_cache)")
SRC_ROPE_CALL = (f"{VLLM_ASCEND} vllm_ascend/_310p/ops/rotary_embedding.py@182b75ea:160-162, 177 "
                 "(contiguous [T, heads*rot] q/k)")
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


def _shape(value: Any) -> "tuple[int | torch.SymInt, ...]":
    """The shape as ints; a symbolic size (a kernel traced by torch.compile with a dynamic
    token count) stays symbolic: ``int()`` on it would specialise the traced graph to this
    call's size (Dynamo then refuses the dynamic dimension vLLM marked)."""
    return tuple(s if isinstance(s, torch.SymInt) else int(s) for s in value.shape)


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


def _trailing(gamma: Any, x: Any) -> bool:
    """gamma's shape is x's trailing dims (the dims being normalised)."""
    return _shape(gamma) == _shape(x)[-gamma.dim():]
