"""The rules of the kernels vLLM Ascend's unquantised fused MoE issues on A2/A3 (the
all-gather communication method): the router's gating top-k, the token routing into
expert order (`npu_moe_init_routing_v2`), the experts' grouped matmuls (`npu_grouped_matmul`)
and the weighted un-permute back to token order (`npu_moe_token_unpermute`).

Call sites (vLLM Ascend 182b75ea): ops/fused_moe/router/fused_topk_router.py:145-157 ->
device/device_op.py:134-160 (``torch.ops._C_ascend.moe_gating_top_k``, vLLM Ascend's own
build of the MoeGatingTopK kernel, whose torch_npu twin is ``npu_moe_gating_top_k``);
ops/fused_moe/token_dispatcher.py:421-432 -> device_op.py:104-127 (init routing v2);
ops/fused_moe/moe_mlp.py:595-603, 668-676 (the two grouped matmuls); token_dispatcher.py:
447-451 -> device_op.py:951-954 (un-permute, ``sorted_indices=abs(expanded_row_idx)``).

A rule that reads tensor values (the group sizes of a grouped matmul) applies to tensors that
hold values only: a kernel traced by torch.compile or captured into a graph sees fake/meta
tensors, and reading them would need the device's data on the host.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from ascendgraph.kernel_contracts.common import (
    DOCS,
    NORM,
    KernelRule,
    _dt,
    _present,
    _shape,
)

GATING_TOP_K = "npu_moe_gating_top_k"
C_ASCEND_GATING_TOP_K = "_C_ascend::moe_gating_top_k"
INIT_ROUTING_V2 = "npu_moe_init_routing_v2"
GROUPED_MATMUL = "npu_grouped_matmul"
TOKEN_UNPERMUTE = "npu_moe_token_unpermute"

# The kernels some of whose rules read tensor values (expert ids, group lists, sorted
# indices; only on tensors that hold values, `_holds_values`): a check of their calls is not
# a function of the arguments' metadata (ascendgraph.kernel_calls remembers no such call).
VALUE_READING_KERNELS = frozenset({GATING_TOP_K, C_ASCEND_GATING_TOP_K, INIT_ROUTING_V2, GROUPED_MATMUL, TOKEN_UNPERMUTE})

_MAX_GATING_EXPERTS = 2048  # docs:10823 (x's last dim, the expert count, at most 2048)
_MAX_INIT_ROUTING_EXPERTS = 10240  # docs:11099 (expert_num in (0, 10240] outside key_value mode)
_MAX_GMM_LIST = 128  # docs:5821, 5829
_GMM_INNER_LIMIT = 65536  # docs:5906 (A2/A3)
_ROUTING_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.int8)  # docs:11089

_SRC_VA_GATING = (
    "vllm-project/vllm-ascend csrc/torch_binding.cpp (schema of _C_ascend::moe_gating_top_k) and "
    "vllm_ascend/device/device_op.py@182b75ea:134-160"
)


def _holds_values(tensor: Any) -> bool:
    """Whether ``tensor`` has values the host may read (not fake, not meta)."""
    from torch._subclasses.fake_tensor import is_fake

    return isinstance(tensor, torch.Tensor) and tensor.device.type != "meta" and not is_fake(tensor)


# --------------------------------------------------------------------------- gating top-k
def _groups(a: Mapping[str, Any]) -> tuple[int, int, int]:
    """(experts, group_count, k_group)."""
    return int(a["x"].shape[-1]), int(a["group_count"]), int(a["k_group"])


def _gating_groups_ok(a: Mapping[str, Any]) -> bool:
    """group_count > 0 divides the expert count into groups of more than 2, and
    1 <= k_group <= group_count."""
    experts, count, k_group = _groups(a)
    return count > 0 and experts % count == 0 and experts // count > 2 and 1 <= k_group <= count


def _gating_k_ok(a: Mapping[str, Any]) -> bool:
    """1 <= k <= experts / group_count * k_group."""
    experts, count, k_group = _groups(a)
    return count > 0 and 1 <= int(a["k"]) <= experts // count * k_group


def _bias(a: Mapping[str, Any]) -> Any:
    return a.get("bias") if a.get("bias") is not None else a.get("bias_opt")


def _gating_bias_ok(a: Mapping[str, Any]) -> bool:
    """bias is 1-D with one value per expert, in x's dtype."""
    bias = _bias(a)
    return bias.dim() == 1 and int(bias.shape[0]) == int(a["x"].shape[-1]) and bias.dtype == a["x"].dtype


_GATING_SHARED = (
    KernelRule(GATING_TOP_K, "gating_x", f"{DOCS}:10823 (x: 2-D, float16/bfloat16/float32, last dim (experts) "
               f"<= {_MAX_GATING_EXPERTS})",
               _present("x"),
               lambda a: a["x"].dim() == 2 and a["x"].dtype in NORM and int(a["x"].shape[-1]) <= _MAX_GATING_EXPERTS,
               lambda a: f"x {_shape(a['x'])} {_dt(a['x'])}"),
    KernelRule(GATING_TOP_K, "gating_groups", f"{DOCS}:10835, 10837 (group_count > 0 divides the experts into "
               "groups of more than 2; 1 <= k_group <= group_count)",
               lambda a: a.get("x") is not None and a["x"].dim() == 2, _gating_groups_ok,
               lambda a: f"{int(a['x'].shape[-1])} experts, group_count {a['group_count']}, k_group {a['k_group']}"),
    KernelRule(GATING_TOP_K, "gating_k", f"{DOCS}:10825 (1 <= k <= x.shape[-1] / group_count * k_group)",
               lambda a: a.get("x") is not None and a["x"].dim() == 2, _gating_k_ok,
               lambda a: f"k {a['k']} with {int(a['x'].shape[-1])} experts, group_count {a['group_count']}, "
                         f"k_group {a['k_group']}"),
    KernelRule(GATING_TOP_K, "gating_bias", f"{DOCS}:10829 (bias: 1-D, one value per expert, x's dtype)",
               lambda a: a.get("x") is not None and _bias(a) is not None,
               _gating_bias_ok,
               lambda a: f"bias {_shape(_bias(a))} {_dt(_bias(a))} for x {_shape(a['x'])} {_dt(a['x'])}"),
    KernelRule(GATING_TOP_K, "gating_norm_type", f"{DOCS}:10842 (norm_type 0: softmax, 1: sigmoid)",
               lambda a: True, lambda a: int(a["norm_type"]) in (0, 1),
               lambda a: f"norm_type {a['norm_type']}"),
)
# torch_npu's op doc allows renorm 0 only; vLLM Ascend's own build takes renorm 1 too (it passes
# int(renormalize), fused_topk_router.py:100, 151), so the rule is torch_npu's alone.
_GATING_RENORM = KernelRule(GATING_TOP_K, "gating_renorm", f"{DOCS}:10841 (renorm: only 0 is supported)",
                            lambda a: True, lambda a: int(a["renorm"]) == 0, lambda a: f"renorm {a['renorm']}")

_C_ASCEND_GATING_RENORM = KernelRule(
    C_ASCEND_GATING_TOP_K, "gating_renorm_flag", f"{_SRC_VA_GATING} (renorm = int(renormalize): 0 or 1)",
    lambda a: True, lambda a: int(a["renorm"]) in (0, 1), lambda a: f"renorm {a['renorm']}")

_GATING_RULES = (
    *_GATING_SHARED,
    _GATING_RENORM,
    # vLLM Ascend's build of the same kernel: torch_npu's rules but renorm (it is one kernel,
    # aclnnMoeGatingTopK; its torch_npu doc is the only written contract)
    *(dataclasses.replace(rule, kernel=C_ASCEND_GATING_TOP_K) for rule in _GATING_SHARED),
    _C_ASCEND_GATING_RENORM,
)


# --------------------------------------------------------------------------- init routing v2
def _range(a: Mapping[str, Any]) -> list[int]:
    return [int(v) for v in (a.get("active_expert_range") or [])]


def _expert_idx_ok(a: Mapping[str, Any]) -> bool:
    """expert_idx is 2-D int32 with one row per row of x."""
    ids, x = a["expert_idx"], a["x"]
    return ids.dim() == 2 and ids.dtype == torch.int32 and x.dim() == 2 and ids.shape[0] == x.shape[0]


def _expert_num_ok(a: Mapping[str, Any]) -> bool:
    """0 < expert_num <= 10240 (5120 in key_value mode, expert_tokens_num_type 2)."""
    limit = 5120 if int(a["expert_tokens_num_type"]) == 2 else _MAX_INIT_ROUTING_EXPERTS
    return 0 < int(a["expert_num"]) <= limit


def _active_range_ok(a: Mapping[str, Any]) -> bool:
    """[] or [start, end) with 0 <= start < end <= expert_num."""
    bounds = _range(a)
    return not bounds or (len(bounds) == 2 and 0 <= bounds[0] < bounds[1] <= int(a["expert_num"]))


def _expert_ids_ok(a: Mapping[str, Any]) -> bool:
    """Every expert id (when the ids hold values) is in [0, expert_num)."""
    ids = a["expert_idx"]
    return not _holds_values(ids) or ids.numel() == 0 or (int(ids.min()) >= 0 and int(ids.max()) < int(a["expert_num"]))


_INIT_ROUTING_RULES = (
    KernelRule(INIT_ROUTING_V2, "init_routing_x", f"{DOCS}:11089 (x: 2-D (NUM_ROWS, H), float16/bfloat16/"
               "float32/int8)",
               _present("x"), lambda a: a["x"].dim() == 2 and a["x"].dtype in _ROUTING_X_DTYPES,
               lambda a: f"x {_shape(a['x'])} {_dt(a['x'])}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_expert_idx", f"{DOCS}:11090 (expert_idx: 2-D (NUM_ROWS, K), int32)",
               _present("x", "expert_idx"),
               _expert_idx_ok,
               lambda a: f"expert_idx {_shape(a['expert_idx'])} {_dt(a['expert_idx'])} for x {_shape(a['x'])}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_expert_num", f"{DOCS}:11099 (expert_num > 0; at most "
               f"{_MAX_INIT_ROUTING_EXPERTS} outside key_value mode, 5120 in it)",
               lambda a: True,
               _expert_num_ok,
               lambda a: f"expert_num {a['expert_num']} (expert_tokens_num_type {a['expert_tokens_num_type']})"),
    KernelRule(INIT_ROUTING_V2, "init_routing_expert_ids", f"{DOCS}:11090 (expert ids must not exceed the expert "
               "count)",
               _present("expert_idx"), _expert_ids_ok,
               lambda a: f"expert ids in [{int(a['expert_idx'].min())}, {int(a['expert_idx'].max())}] with "
                         f"expert_num {a['expert_num']}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_drop_pad_mode", f"{DOCS}:11100 (drop_pad_mode: only 0, dropless)",
               lambda a: True, lambda a: int(a["drop_pad_mode"]) == 0, lambda a: f"drop_pad_mode {a['drop_pad_mode']}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_tokens_num_type", f"{DOCS}:11101 (expert_tokens_num_type: only 1 "
               "(count) or 2 (key_value))",
               lambda a: True, lambda a: int(a["expert_tokens_num_type"]) in (1, 2),
               lambda a: f"expert_tokens_num_type {a['expert_tokens_num_type']}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_tokens_num_flag", f"{DOCS}:11102 (expert_tokens_num_flag: only True)",
               lambda a: True, lambda a: bool(a["expert_tokens_num_flag"]),
               lambda a: f"expert_tokens_num_flag {a['expert_tokens_num_flag']}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_quant_mode", f"{DOCS}:11103 (quant_mode: only -1 (none) or 1 "
               "(dynamic); int8 x only -1)",
               _present("x"),
               lambda a: int(a["quant_mode"]) == -1 or (int(a["quant_mode"]) == 1 and a["x"].dtype != torch.int8),
               lambda a: f"quant_mode {a['quant_mode']} with x {_dt(a['x'])}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_active_range", f"{DOCS}:11104 (active_expert_range [start, end): "
               "values >= 0, end <= expert_num)",
               lambda a: True, _active_range_ok,
               lambda a: f"active_expert_range {_range(a)} with expert_num {a['expert_num']}"),
    KernelRule(INIT_ROUTING_V2, "init_routing_row_idx_type", f"{DOCS}:11105 (row_idx_type: 0 gather or 1 scatter)",
               lambda a: True, lambda a: int(a["row_idx_type"]) in (0, 1), lambda a: f"row_idx_type {a['row_idx_type']}"),
)


# --------------------------------------------------------------------------- grouped matmul
def _single(values: Any) -> Any:
    return values[0] if values else None


def _gmm_list_ok(a: Mapping[str, Any]) -> bool:
    """x and weight each hold 1 to 128 tensors."""
    return 1 <= len(a["x"]) <= _MAX_GMM_LIST and 1 <= len(a["weight"]) <= _MAX_GMM_LIST


def _gmm_x_dims_ok(a: Mapping[str, Any]) -> bool:
    """x tensors have 2-6 dims with split_item 0, 2 otherwise."""
    low, high = (2, 6) if int(a["split_item"] or 0) == 0 else (2, 2)
    return all(low <= x.dim() <= high for x in a["x"])


def _gmm_group_list_values_ok(a: Mapping[str, Any]) -> bool:
    """Type 0 (cumsum): non-negative, non-decreasing; type 1 (counts): non-negative, not of length 1."""
    groups = a["group_list"]
    if not _holds_values(groups):
        return True
    values = [int(v) for v in groups.reshape(-1).tolist()]
    if any(v < 0 for v in values):
        return False
    if int(a["group_list_type"] or 0) == 0:
        return all(b >= c for c, b in zip(values, values[1:]))
    return len(values) != 1


def _gmm_group_sizes(a: Mapping[str, Any]) -> list[int]:
    values = [int(v) for v in a["group_list"].reshape(-1).tolist()]
    return values if int(a["group_list_type"] or 0) == 1 else [b - c for c, b in zip([0, *values], values)]


def _gmm_groups_within_x_ok(a: Mapping[str, Any]) -> bool:
    """The groups index rows of x: together they cover at most x's m rows."""
    if not _holds_values(a["group_list"]) or len(a["x"]) != 1:
        return True
    return sum(_gmm_group_sizes(a)) <= int(a["x"][0].shape[0])


def _gmm_dtypes_ok(a: Mapping[str, Any]) -> bool:
    """Unquantised: x and weight float16/bfloat16/float32, the same."""
    dtypes = {t.dtype for t in (*a["x"], *a["weight"])}
    return len(dtypes) == 1 and dtypes <= set(NORM)


def _gmm_unquantised(a: Mapping[str, Any]) -> bool:
    """The call has x and weight and no quantisation parameter (scale, offset, antiquant_*, per_token_scale)."""
    return bool(a.get("x")) and bool(a.get("weight")) and all(
        a.get(n) is None for n in ("scale", "offset", "antiquant_scale", "antiquant_offset", "per_token_scale"))


def _gmm_shapes_ok(a: Mapping[str, Any]) -> bool:
    """One x [M, K] against one 3-D weight [G, K, N], group_list one entry per group."""
    x, weight, groups = _single(a["x"]), _single(a["weight"]), a["group_list"]
    return (x.dim() == 2 and weight.dim() == 3 and x.shape[-1] == weight.shape[1]
            and groups.dim() == 1 and int(groups.shape[0]) == int(weight.shape[0]))


def _one_x_one_weight_grouped(a: Mapping[str, Any]) -> bool:
    """One x, one weight and a group_list: the grouped form vLLM Ascend's MoE calls."""
    return (bool(a.get("x")) and bool(a.get("weight")) and len(a["x"]) == 1 and len(a["weight"]) == 1
            and a.get("group_list") is not None)


_GMM_RULES = (
    KernelRule(GROUPED_MATMUL, "gmm_list_length", f"{DOCS}:5821, 5829 (x and weight: lists of at most "
               f"{_MAX_GMM_LIST} tensors)",
               _present("x", "weight"), _gmm_list_ok,
               lambda a: f"{len(a['x'])} x tensors, {len(a['weight'])} weight tensors"),
    KernelRule(GROUPED_MATMUL, "gmm_x_dims", f"{DOCS}:5822 (x: 2-6 dims with split_item 0, otherwise 2-D)",
               _present("x"), _gmm_x_dims_ok,
               lambda a: f"x {[_shape(x) for x in a['x']]} with split_item {a['split_item']}"),
    KernelRule(GROUPED_MATMUL, "gmm_weight_dims", f"{DOCS}:5830 (weight: 2-D or 3-D tensors)",
               _present("weight"), lambda a: all(w.dim() in (2, 3) for w in a["weight"]),
               lambda a: f"weight {[_shape(w) for w in a['weight']]}"),
    KernelRule(GROUPED_MATMUL, "gmm_split_item", f"{DOCS}:5879-5881 (split_item 0/1: one output per weight; 2/3: "
               "one output)",
               lambda a: True, lambda a: int(a["split_item"] or 0) in (0, 1, 2, 3),
               lambda a: f"split_item {a['split_item']}"),
    KernelRule(GROUPED_MATMUL, "gmm_group_type", f"{DOCS}:5882-5885 (with a group_list tensor, A2/A3 group "
               "along -1 (none) or 0 (the m axis) only)",
               _present("group_list"), lambda a: a["group_type"] is not None and int(a["group_type"]) in (-1, 0),
               lambda a: f"group_type {a['group_type']}"),
    KernelRule(GROUPED_MATMUL, "gmm_group_list_type", f"{DOCS}:5890 (group_list_type 0: cumulative sizes, 1: "
               "each group's size)",
               _present("group_list"), lambda a: int(a["group_list_type"] or 0) in (0, 1),
               lambda a: f"group_list_type {a['group_list_type']}"),
    KernelRule(GROUPED_MATMUL, "gmm_group_list_values", f"{DOCS}:5874-5875 (type 0: non-negative, non-decreasing; "
               "type 1: non-negative, length not 1)",
               _present("group_list"), _gmm_group_list_values_ok,
               lambda a: f"group_list {a['group_list'].reshape(-1).tolist()} with group_list_type "
                         f"{a['group_list_type']}"),
    KernelRule(GROUPED_MATMUL, "gmm_groups_within_x", f"{DOCS}:5866 (group_list indexes the rows (dim 0) of x "
               "that each group's matmul takes)",
               _present("group_list", "x"), _gmm_groups_within_x_ok,
               lambda a: f"group_list {a['group_list'].reshape(-1).tolist()} (type {a['group_list_type']}) covers "
                         f"{sum(_gmm_group_sizes(a))} rows, x has {int(a['x'][0].shape[0])}"),
    KernelRule(GROUPED_MATMUL, "gmm_dtypes", f"{DOCS}:5941-5942 (unquantised with a group_list tensor: x and "
               "weight float16, bfloat16 or float32, alike)",
               _gmm_unquantised, _gmm_dtypes_ok,
               lambda a: f"x {[_dt(x) for x in a['x']]}, weight {[_dt(w) for w in a['weight']]}"),
    KernelRule(GROUPED_MATMUL, "gmm_inner_limit", f"{DOCS}:5906 (A2/A3: each x and weight's last dim below "
               f"{_GMM_INNER_LIMIT})",
               _present("x", "weight"),
               lambda a: all(int(t.shape[-1]) < _GMM_INNER_LIMIT for t in (*a["x"], *a["weight"])),
               lambda a: f"last dims x {[int(x.shape[-1]) for x in a['x']]}, weight "
                         f"{[int(w.shape[-1]) for w in a['weight']]}"),
    KernelRule(GROUPED_MATMUL, "gmm_grouped_shapes", f"{DOCS}:5804-5806, 5869-5870 (y_i = x_i x weight_i: one x "
               "[M, K] split along m by group_list against weight [G, K, N], one group_list entry per group)",
               _one_x_one_weight_grouped, _gmm_shapes_ok,
               lambda a: f"x {_shape(a['x'][0])}, weight {_shape(a['weight'][0])}, group_list "
                         f"{_shape(a['group_list'])}"),
)


# --------------------------------------------------------------------------- token un-permute
def _unpermute_top_k(a: Mapping[str, Any]) -> int:
    probs = a.get("probs")
    return int(probs.shape[1]) if probs is not None and probs.dim() == 2 else 1


def _unpermute_indices_in_range(a: Mapping[str, Any]) -> bool:
    """Every index (when they hold values) names a row of permuted_tokens."""
    indices = a["sorted_indices"]
    if not _holds_values(indices) or indices.numel() == 0:
        return True
    return int(indices.min()) >= 0 and int(indices.max()) < int(a["permuted_tokens"].shape[0])


def _unpermute_probs_ok(a: Mapping[str, Any]) -> bool:
    """probs is 2-D bfloat16 (num_tokens, topK) and sorted_indices holds num_tokens * topK entries."""
    probs = a["probs"]
    rows = probs.shape[0] * probs.shape[1] if probs.dim() == 2 else -1
    return probs.dim() == 2 and probs.dtype == torch.bfloat16 and a["sorted_indices"].shape[0] == rows


_UNPERMUTE_RULES = (
    KernelRule(TOKEN_UNPERMUTE, "unpermute_tokens", f"{DOCS}:14342, 14349 (permuted_tokens: 2-D "
               "(num_tokens*topK, hidden_size), bfloat16)",
               _present("permuted_tokens"),
               lambda a: a["permuted_tokens"].dim() == 2 and a["permuted_tokens"].dtype == torch.bfloat16,
               lambda a: f"permuted_tokens {_shape(a['permuted_tokens'])} {_dt(a['permuted_tokens'])}"),
    # the doc names int64 (14343); its own example and vLLM Ascend pass int32 (14373;
    # device_op.py:951-954 hands npu_moe_init_routing_v2's int32 expanded_row_idx on)
    KernelRule(TOKEN_UNPERMUTE, "unpermute_indices", f"{DOCS}:14343, 14373 (sorted_indices: 1-D "
               "(num_tokens*topK), int64; the doc's example passes int32)",
               _present("sorted_indices"),
               lambda a: a["sorted_indices"].dim() == 1 and a["sorted_indices"].dtype in (torch.int32, torch.int64),
               lambda a: f"sorted_indices {_shape(a['sorted_indices'])} {_dt(a['sorted_indices'])}"),
    KernelRule(TOKEN_UNPERMUTE, "unpermute_probs", f"{DOCS}:14344 (probs: (num_tokens, topK), bfloat16; "
               "sorted_indices holds num_tokens*topK entries)",
               _present("probs", "sorted_indices"),
               _unpermute_probs_ok,
               lambda a: f"probs {_shape(a['probs'])} {_dt(a['probs'])}, sorted_indices "
                         f"{_shape(a['sorted_indices'])}"),
    KernelRule(TOKEN_UNPERMUTE, "unpermute_indices_range", f"{DOCS}:14339, 16858 (sorted_indices[i] is the row "
               "of permuted_tokens that holds token i // topK's copy)",
               _present("permuted_tokens", "sorted_indices"), _unpermute_indices_in_range,
               lambda a: f"sorted_indices in [{int(a['sorted_indices'].min())}, {int(a['sorted_indices'].max())}], "
                         f"permuted_tokens has {int(a['permuted_tokens'].shape[0])} rows"),
    KernelRule(TOKEN_UNPERMUTE, "unpermute_padded_mode", f"{DOCS}:14345, 14352 (padded_mode: only False)",
               lambda a: True, lambda a: not bool(a["padded_mode"]), lambda a: f"padded_mode {a['padded_mode']}"),
)

_MOE_RULES = (*_GATING_RULES, *_INIT_ROUTING_RULES, *_GMM_RULES, *_UNPERMUTE_RULES)
