"""The rules of the KV-cache writes: ATB's `_npu_reshape_and_cache` (310P) and
`npu_scatter_pa_kv_cache` (A2, A3, A5), as vLLM Ascend picks them per SoC."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from ascendgraph.kernel_contracts.common import (
    DOCS,
    HALF,
    RESHAPE_AND_CACHE,
    SCATTER_PA_KV_CACHE,
    SLOT_DTYPES,
    SRC_ATB_SIGNATURE,
    SRC_RESHAPE_CALL,
    SRC_SCATTER_CALL,
    VLLM_ASCEND,
    KernelRule,
    _contiguous,
    _dt,
    _present,
    _shape,
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
    KernelRule(RESHAPE_AND_CACHE, "slot_indices_int32", f"{VLLM_ASCEND} vllm_ascend/worker/v2/block_table.py@182b75ea:54-55 "
               "(comment: the reshape-and-cache operator requires int32 slot mappings)",
               _present("slot_indices"), lambda a: a["slot_indices"].dtype == torch.int32,
               lambda a: f"slot_indices dtype is {_dt(a['slot_indices'])}, not int32"),
    KernelRule(RESHAPE_AND_CACHE, "one_slot_per_token", f"{SRC_RESHAPE_CALL}: key/value [tokens, kv_heads, D], one slot each",
               _present("slot_indices", "key"),
               _one_slot_per_token,
               lambda a: f"key {_shape(a['key'])}, value {_shape(a['value'])}, {int(a['slot_indices'].numel())} slots, "
                         f"key_cache {_shape(a['key_cache'])}"),
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
