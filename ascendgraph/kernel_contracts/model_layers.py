"""The rules of the kernels a model's own layers issue: the rotary embedding
(`_npu_rotary_embedding`; `npu_mrope` in rope mode, vLLM Ascend's rope_forward_oot without
Triton) and the SiLU-and-multiply of the MLP (`npu_swiglu`, AscendSiluAndMul)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ascendgraph.kernel_contracts.common import (
    DOCS,
    HALF,
    MROPE,
    NORM,
    ROTARY_EMBEDDING,
    SWIGLU,
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

# The kernels a served model's own layers call on vLLM Ascend (not the graph code): the SiLU-and-
# multiply of its MLP (vllm_ascend/ops/activation.py@182b75ea:35-38 AscendSiluAndMul -> npu_swiglu)
# and the rotary embedding of its attention when Triton is absent (ops/rotary_embedding.py@182b75ea:
# 155-193 rope_forward_oot -> npu_mrope in rope mode). Schemas: npu_native_functions_by_codegen.yaml:740, 821.
_SWIGLU_RULES = (
    KernelRule(SWIGLU, "swiglu_dtype", f"{DOCS}:4404 (x: 1-8 dims, FP32, FP16 or BF16)",
               _present("self"), lambda a: a["self"].dtype in NORM,
               lambda a: f"x {_dt(a['self'])}: need float16/bfloat16/float32"),
    KernelRule(SWIGLU, "swiglu_even_split", f"{DOCS}:4398-4401, 4404 (x, of 1-8 dims, is split into A and B along dim)",
               _present("self"), lambda a: 1 <= a["self"].dim() <= 8 and int(a["self"].shape[int(a["dim"])]) % 2 == 0,
               lambda a: f"x {_shape(a['self'])} cannot be split in two along dim {a['dim']}"),
)


def _mrope_rotary_dim(a: Mapping[str, Any]) -> int:
    return int(a["cos_sin_cache"].shape[-1])


def _mrope_positions_ok(a: Mapping[str, Any]) -> bool:
    """positions are int32/int64, 1-D or 2-D, with one entry per token of query and key."""
    positions = a["positions"]
    return (positions.dtype in (torch.int32, torch.int64) and positions.dim() in (1, 2)
            and int(positions.shape[-1]) == int(a["query"].shape[0]) == int(a["key"].shape[0]))


def _mrope_heads_ok(a: Mapping[str, Any]) -> bool:
    """query and key rows are whole heads of head_size, and the rotary part fits in a head."""
    head_size = int(a["head_size"])
    return (int(a["query"].shape[-1]) % head_size == 0 and int(a["key"].shape[-1]) % head_size == 0
            and _mrope_rotary_dim(a) <= head_size)


_MROPE_RULES = (
    KernelRule(MROPE, "mrope_2d", f"{DOCS}:3626 (queryIn, keyIn and cosSinCache take 2-D shapes only)",
               _present("query", "key", "cos_sin_cache"),
               lambda a: a["query"].dim() == 2 and a["key"].dim() == 2 and a["cos_sin_cache"].dim() == 2,
               lambda a: f"query {_shape(a['query'])}, key {_shape(a['key'])}, cos_sin_cache "
                         f"{_shape(a['cos_sin_cache'])}: need 2-D"),
    KernelRule(MROPE, "mrope_dtype", f"{DOCS}:3617-3619 (BFLOAT16, FLOAT16, FLOAT32)",
               _present("query", "key"), lambda a: a["query"].dtype in NORM and a["key"].dtype == a["query"].dtype,
               lambda a: f"query {_dt(a['query'])}, key {_dt(a['key'])}"),
    KernelRule(MROPE, "mrope_positions", f"{DOCS}:3616 (positions: 1-D (numTokens) or 2-D (3, numTokens), "
               "INT32/INT64)",
               _present("positions", "query"), _mrope_positions_ok,
               lambda a: f"positions {_shape(a['positions'])} {_dt(a['positions'])}, query {_shape(a['query'])}, "
                         f"key {_shape(a['key'])}"),
    KernelRule(MROPE, "mrope_heads", f"{DOCS}:3617-3619 (query/key (numTokens, heads*headSize); cosSinCache "
               "(maxSeqLen, rotaryDim))",
               _present("query", "key"), _mrope_heads_ok,
               lambda a: f"query {_shape(a['query'])}, key {_shape(a['key'])}, head_size {a['head_size']}, "
                         f"rotary_dim {_mrope_rotary_dim(a)}"),
    KernelRule(MROPE, "mrope_rotary_dim_multiple", f"{DOCS}:3627 (BFLOAT16/FLOAT16: rotary_dim a multiple of 32; "
               "FLOAT32: of 16)",
               _present("query", "cos_sin_cache"),
               lambda a: _mrope_rotary_dim(a) % (16 if a["query"].dtype == torch.float32 else 32) == 0,
               lambda a: f"rotary_dim {_mrope_rotary_dim(a)} with {_dt(a['query'])}"),
)
