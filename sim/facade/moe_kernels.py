"""The kernels vLLM Ascend's unquantised fused MoE calls on A2/A3 (``npu_facade`` ops).

vLLM Ascend's MoE layer (ops/fused_moe/, commit 182b75ea) on its all-gather communication
method (``select_moe_comm_method``: A2 with an EP group of fewer than 16 ranks, or no expert
parallelism) runs, per layer and step:

* the router's gating top-k: ``torch.ops._C_ascend.moe_gating_top_k``
  (router/fused_topk_router.py:145-157 -> device/device_op.py:134-160), vLLM Ascend's own build
  of the MoeGatingTopK kernel, whose torch_npu twin is ``npu_moe_gating_top_k``
  (``_op_plugin_docs.py``:10816-10851). vLLM Ascend's compiled ops (vllm_ascend_C) are not
  built beside the simulator, so the facade registers a stand-in for that one op under its
  own name and schema (vllm-ascend csrc/torch_binding.cpp), computing what torch_npu's op does;
* ``npu_moe_init_routing_v2`` (token_dispatcher.py:421-432 -> device_op.py:104-127): each
  (token, choice) row copied into expert order, only the experts of ``active_expert_range``
  (this EP rank's) kept, with the per-expert counts (``_op_plugin_docs.py``:11082-11114);
* ``npu_grouped_matmul`` twice (moe_mlp.py:595-603, 668-676), with ``npu_swiglu`` between:
  rows of x split along m by ``group_list``, group g multiplied by ``weight[g]``
  (``_op_plugin_docs.py``:5799-5906);
* ``npu_moe_token_unpermute`` (token_dispatcher.py:447-451 -> device_op.py:951-954): each
  token's rows gathered back, weighted by its routing probabilities and summed
  (``_op_plugin_docs.py``:14332-14352).

Schemas as torch-npu 2.13.0 registers them (csrc/aten/npu_native_functions_by_codegen.yaml:
445, 592, 600, 969). Every call is checked against the contract table first (the rules
``gating_*``, ``init_routing_*``, ``gmm_*`` and ``unpermute_*`` of
`ascendgraph.kernel_contracts.moe`).

What is modelled, and what raises NotImplementedError naming the argument: the gating top-k
with the softmax norm, one expert group and no bias (Qwen-MoE's router; sigmoid, grouped and
biased selection are not modelled); init routing without quantisation, in count mode, all
rows active; the grouped matmul unquantised, one x against one 3-D weight grouped along m
(split_item 2/3), with an optional per-group bias. The arithmetic is float32, rounded once to
the output dtype; rows a kernel leaves undefined (past the routed rows) are zeros. Ties in the
top-k are broken as ``torch.topk`` breaks them, and rows of one expert keep their token order:
a card may order either differently, which changes no sum.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ascendgraph.kernel_contracts import (
    C_ASCEND_GATING_TOP_K,
    GATING_TOP_K,
    GROUPED_MATMUL,
    INIT_ROUTING_V2,
    TOKEN_UNPERMUTE,
)
from sim.facade.kernels import NAMESPACE, kernel_entry

__all__ = ["SCHEMAS", "C_ASCEND_SCHEMA", "register", "exported_ops"]

# The kernels' names are the contract table's (one source for both).
GATING = GATING_TOP_K
INIT_ROUTING = INIT_ROUTING_V2
UNPERMUTE = TOKEN_UNPERMUTE
C_ASCEND, C_ASCEND_GATING = C_ASCEND_GATING_TOP_K.split("::")  # "_C_ascend", "moe_gating_top_k"

SCHEMAS: dict[str, str] = {
    # npu_native_functions_by_codegen.yaml:592
    GATING: (
        "(Tensor x, int k, *, Tensor? bias=None, Tensor? input_ids=None, Tensor? tid2eid=None, int k_group=1, "
        "int group_count=1, int group_select_mode=0, int renorm=0, int norm_type=0, bool out_flag=False, "
        "float routed_scaling_factor=1.0, float eps=1e-20) -> (Tensor, Tensor, Tensor)"
    ),
    # :600
    INIT_ROUTING: (
        "(Tensor x, Tensor expert_idx, *, Tensor? scale=None, Tensor? offset=None, int active_num=-1, "
        "int expert_capacity=-1, int expert_num=-1, int drop_pad_mode=0, int expert_tokens_num_type=0, "
        "bool expert_tokens_num_flag=False, int quant_mode=-1, int[2] active_expert_range=[], int row_idx_type=0, "
        "int? x_dtype=None) -> (Tensor, Tensor, Tensor, Tensor)"
    ),
    # :445
    GROUPED_MATMUL: (
        "(Tensor[] x, Tensor[] weight, *, Tensor[]? bias=None, Tensor[]? scale=None, Tensor[]? offset=None, "
        "Tensor[]? antiquant_scale=None, Tensor[]? antiquant_offset=None, Tensor[]? per_token_scale=None, "
        "Tensor? group_list=None, Tensor[]? activation_input=None, Tensor[]? activation_quant_scale=None, "
        "Tensor[]? activation_quant_offset=None, int? split_item=0, int? group_type=None, int? group_list_type=0, "
        "int? act_type=0, int[]? tuning_config=None, int? output_dtype=None, int? x_dtype=None, "
        "int? weight_dtype=None, int? scale_dtype=None, int? per_token_scale_dtype=None) -> Tensor[]"
    ),
    # :969
    UNPERMUTE: (
        "(Tensor permuted_tokens, Tensor sorted_indices, Tensor? probs=None, bool padded_mode=False, "
        "int[]? restore_shape=None) -> Tensor"
    ),
}

# vLLM Ascend's registration of its own build (vllm-project/vllm-ascend csrc/torch_binding.cpp).
C_ASCEND_SCHEMA = (
    "(Tensor x, int k, int k_group, int group_count, int group_select_mode, int renorm, int norm_type, "
    "bool out_flag, float routed_scaling_factor, float eps, Tensor? bias_opt=None) "
    "-> (Tensor y, Tensor expert_idx, Tensor out)"
)


def _not_modelled(kernel: str, what: str, got: str) -> NotImplementedError:
    return NotImplementedError(f"sim.facade models {kernel} {what} only, got {got}")


# --------------------------------------------------------------------------- gating top-k
def gating_top_k(a: dict[str, Any], fake: bool, kernel: str = GATING) -> tuple[Tensor, Tensor, Tensor]:
    """softmax(x) per token, its k largest (weights, expert ids), renormalised to sum 1 when
    ``renorm`` is 1, times ``routed_scaling_factor``; the norm's output in float32."""
    x, k = a["x"], int(a["k"])
    bias = a.get("bias") if a.get("bias") is not None else a.get("bias_opt")
    if int(a["norm_type"]) != 0:
        raise _not_modelled(kernel, "with the softmax norm (norm_type 0)", f"norm_type {a['norm_type']}")
    if int(a["group_count"]) != 1 or int(a["k_group"]) != 1:
        raise _not_modelled(kernel, "with one expert group (group_count 1, k_group 1)",
                            f"group_count {a['group_count']}, k_group {a['k_group']}")
    if bias is not None or a.get("input_ids") is not None or a.get("tid2eid") is not None:
        raise _not_modelled(kernel, "without bias or hash routing (bias, input_ids, tid2eid None)", "one of them set")
    tokens = x.shape[0]
    if fake:
        return (x.new_empty((tokens, k)), x.new_empty((tokens, k), dtype=torch.int32),
                x.new_empty(x.shape, dtype=torch.float32))
    scores = torch.softmax(x.float(), dim=-1)
    weights, ids = torch.topk(scores, k, dim=-1)
    if int(a["renorm"]) == 1:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + float(a["eps"]))
    weights = weights * float(a["routed_scaling_factor"])
    return weights.to(x.dtype), ids.to(torch.int32), scores


def c_ascend_gating_top_k(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor, Tensor]:
    return gating_top_k(a, fake, kernel=f"{C_ASCEND}.{C_ASCEND_GATING}")


# --------------------------------------------------------------------------- init routing v2
def init_routing_v2(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Rows (token t, choice j) of ``expert_idx`` in expert order (stable: token order within an
    expert), those of experts outside ``active_expert_range`` dropped to the end:
    expanded_x[p] = x[t] for the p-th kept row; expanded_row_idx (row_idx_type 0) maps each
    row t*K+j to its position p, -1 when dropped (type 1: position p -> row, -1 past the kept
    rows); the per-expert counts of the range; expanded_scale = scale[t] when given."""
    x, ids = a["x"], a["expert_idx"]
    experts = int(a["expert_num"])
    bounds = [int(v) for v in (a["active_expert_range"] or [])] or [0, experts]
    start, end = bounds
    rows = ids.shape[0] * ids.shape[1]
    if int(a["quant_mode"]) != -1:
        raise _not_modelled(INIT_ROUTING, "without quantisation (quant_mode -1)", f"quant_mode {a['quant_mode']}")
    if int(a["expert_tokens_num_type"]) != 1:
        raise _not_modelled(INIT_ROUTING, "in count mode (expert_tokens_num_type 1)",
                            f"expert_tokens_num_type {a['expert_tokens_num_type']}")
    active_num = int(a["active_num"])
    if fake:
        return (x.new_empty((rows, x.shape[1])), x.new_empty((rows,), dtype=torch.int32),
                x.new_empty((end - start,), dtype=torch.int64), x.new_empty((rows,), dtype=torch.float32))
    if 0 < active_num < rows:
        raise _not_modelled(INIT_ROUTING, "with every row active (active_num -1, 0 or >= NUM_ROWS*K)",
                            f"active_num {active_num} of {rows} rows")
    flat = ids.reshape(-1).to(torch.int64)
    kept = (flat >= start) & (flat < end)
    order = torch.argsort(torch.where(kept, flat, experts), stable=True)  # position p -> row t*K+j
    kept_sorted = kept[order]
    source = order // ids.shape[1]  # the token of each position
    expanded_x = torch.where(kept_sorted[:, None], x[source], torch.zeros((), dtype=x.dtype))
    position = torch.empty_like(order)
    position[order] = torch.arange(rows, dtype=order.dtype)
    if int(a["row_idx_type"]) == 0:
        row_idx = torch.where(kept, position, -1)
    else:
        row_idx = torch.where(kept_sorted, order, -1)
    counts = torch.bincount(flat[kept] - start, minlength=end - start).to(torch.int64)
    scale = a["scale"]
    expanded_scale = (torch.where(kept_sorted, scale.float()[source], 0.0) if scale is not None
                      else torch.zeros(rows, dtype=torch.float32))
    return expanded_x, row_idx.to(torch.int32), counts, expanded_scale


# --------------------------------------------------------------------------- grouped matmul
def _group_sizes(group_list: Tensor, list_type: int) -> list[int]:
    values = [int(v) for v in group_list.reshape(-1).tolist()]
    if list_type == 1:
        return values
    return [b - c for c, b in zip([0, *values], values)]


def grouped_matmul(a: dict[str, Any], fake: bool) -> list[Tensor]:
    """y[rows of group g] = x[rows of group g] @ weight[g] (+ bias[g]); rows past the groups are 0."""
    xs, weights, groups = a["x"], a["weight"], a["group_list"]
    for name in ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale", "activation_input",
                 "activation_quant_scale", "activation_quant_offset"):
        if a.get(name) is not None:
            raise _not_modelled(GROUPED_MATMUL, "unquantised (scale, offset, antiquant_*, per_token_scale None)",
                                f"{name} set")
    group_type = -1 if a["group_type"] is None else int(a["group_type"])
    if (len(xs) != 1 or len(weights) != 1 or groups is None or weights[0].dim() != 3
            or int(a["split_item"] or 0) not in (2, 3) or group_type != 0):
        raise _not_modelled(GROUPED_MATMUL, "with one x against one 3-D weight grouped along m by a group_list "
                            "tensor (split_item 2/3, group_type 0)",
                            f"{len(xs)} x, {len(weights)} weight {tuple(weights[0].shape)}, split_item "
                            f"{a['split_item']}, group_type {a['group_type']}")
    if int(a["act_type"] or 0) != 0 or a["output_dtype"] is not None:
        raise _not_modelled(GROUPED_MATMUL, "without activation or output_dtype (act_type 0, output_dtype None)",
                            f"act_type {a['act_type']}, output_dtype {a['output_dtype']}")
    x, weight = xs[0], weights[0]
    if fake:
        return [x.new_empty((x.shape[0], weight.shape[2]))]
    bias = a["bias"][0].float() if a.get("bias") else None
    out = torch.zeros((x.shape[0], weight.shape[2]), dtype=torch.float32)
    begin = 0
    for group, size in enumerate(_group_sizes(groups, int(a["group_list_type"] or 0))):
        rows = slice(begin, begin + size)
        product = x[rows].float() @ weight[group].float()
        out[rows] = product + bias[group] if bias is not None else product
        begin += size
    return [out.to(x.dtype)]


# --------------------------------------------------------------------------- token un-permute
def token_unpermute(a: dict[str, Any], fake: bool) -> Tensor:
    """out[t] = sum_j permuted_tokens[sorted_indices[t*K + j]] * probs[t, j] (probs absent: K = 1)."""
    permuted, indices, probs = a["permuted_tokens"], a["sorted_indices"], a["probs"]
    top_k = int(probs.shape[1]) if probs is not None else 1
    tokens = indices.shape[0] // top_k
    if fake:
        return permuted.new_empty((tokens, permuted.shape[1]))
    rows = permuted.float()[indices.to(torch.int64)].reshape(tokens, top_k, permuted.shape[1])
    if probs is not None:
        rows = rows * probs.float()[:, :, None]
    return rows.sum(dim=1).to(permuted.dtype)


IMPLEMENTATIONS: dict[str, Callable[[dict[str, Any], bool], Any]] = {
    GATING: gating_top_k, INIT_ROUTING: init_routing_v2, GROUPED_MATMUL: grouped_matmul, UNPERMUTE: token_unpermute,
}

_LIBRARIES: list[torch.library.Library] = []


def _c_ascend_defined() -> bool:
    """Whether vLLM Ascend's own ``_C_ascend::moe_gating_top_k`` is registered (its compiled ops loaded)."""
    try:
        torch._C._dispatch_find_schema_or_throw(f"{C_ASCEND}::{C_ASCEND_GATING}", "")
    except RuntimeError:
        return False
    return True


def register() -> None:
    """Define the ops once per process: the torch_npu kernels in the ``npu_facade`` namespace,
    the stand-in for vLLM Ascend's ``_C_ascend::moe_gating_top_k`` unless its own is loaded."""
    if _LIBRARIES:
        return
    from sim.facade import kernels

    kernels.register()
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    for name, schema in SCHEMAS.items():
        library.define(f"{name}{schema}")
        library.impl(name, kernel_entry(name, IMPLEMENTATIONS[name], name, False), "CPU")
        torch.library.register_fake(f"{NAMESPACE}::{name}", kernel_entry(name, IMPLEMENTATIONS[name], name, True),
                                    lib=library)
    _LIBRARIES.append(library)
    if _c_ascend_defined():
        return
    stand_in = torch.library.Library(C_ASCEND, "FRAGMENT")
    stand_in.define(f"{C_ASCEND_GATING}{C_ASCEND_SCHEMA}")
    for fake in (False, True):
        entry = kernel_entry(C_ASCEND_GATING, c_ascend_gating_top_k, C_ASCEND_GATING_TOP_K, fake, namespace=C_ASCEND)
        if fake:
            torch.library.register_fake(f"{C_ASCEND}::{C_ASCEND_GATING}", entry, lib=stand_in)
        else:
            stand_in.impl(C_ASCEND_GATING, entry, "CPU")
    _LIBRARIES.append(stand_in)


def exported_ops() -> dict[str, Any]:
    """``torch_npu.<name>`` for each kernel here (OpOverloadPackets, as torch_npu exports)."""
    register()
    return {name: getattr(getattr(torch.ops, NAMESPACE), name) for name in SCHEMAS}


def c_ascend_op() -> Optional[Any]:
    """The ``_C_ascend.moe_gating_top_k`` op vLLM Ascend calls (the stand-in or its own)."""
    register()
    return getattr(getattr(torch.ops, C_ASCEND), C_ASCEND_GATING)
