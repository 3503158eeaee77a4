"""NPU (PrivateUse1) kernels for the ``ascendgraph`` ops: torch_npu's fused kernels, as data.

Theory of operation. `KERNEL_ROUTES` holds, per ascendgraph op, the torch_npu kernels that
can implement it (`KernelBinding`: the declared `hw.api.NpuApi`, an adapter from our op
contract to the kernel's, and the kernel's name and rules in the contract table) and a
fallback:

    first binding whose attribute exists and the table takes the call -> that kernel
    otherwise                                                         -> the fallback

What a kernel takes is the contract table's (`ascendgraph.kernel_contracts`), never a
predicate of hw's own: a binding names the table's rules of its kernel that decide
kernel-or-fallback, and `ascendgraph.kernel_calls.refusal` answers for the op call as hw
maps it (with the op's own level, ``ascendgraph::<op>``, always). After the pre-check below
this matters where the pre-check did not map the call onto the binding's kernel: the KV
write's second kernel on a SoC not known.

A fallback is either the reference formula (``hw/reference.py``) or a *composition* of
other ascendgraph ops (``add_rms_norm_quant`` = ``add_rms_norm`` + ``quantize``), which
still reaches torch_npu's kernels for the parts it has. Each fallback is logged once
per (op, reason). A kernel that turns out to be missing only when first called (ATB ops
load NNAL lazily and raise OSError) is dropped for the rest of the process.

Contracts first. Before any binding is tried, the call passes `ascendgraph.kernel_calls`'
pre-check (the kernel-contract table, as the simulator applies it): a violation is a
KernelContractError, never a fallback (docs/decisions.md "Kernel contracts"), so float32 attention is refused,
not run through the reference formula. Fallbacks serve a torch_npu that lacks a kernel.

Graph safety. No fallback is captured: a fallback selected while a graph is captured or
updated is refused (CaptureConstraintError, `FALLBACK_IN_GRAPH`; attention's names the
host lengths its kernels follow), and so is FIA in a FULL graph without the max-workspace
query (`NO_WORKSPACE_IN_FULL_GRAPH`). Only a missing kernel selects a fallback (not
present, or its library fails to load: `_MISSING_KERNEL_ERRORS`); every fallback taken is
in ``router.fallbacks`` and the run report's ``kernel_fallbacks``. Ops without a torch_npu
kernel at all (``muls_add``, ``split_qkv_rmsnorm_rope``) run their formula, not a fallback.

The FULL-graph parameter update re-issues ``paged_attention`` between
``task_update_begin/end``: torch_npu then patches the captured tasks with the arguments of
the re-issued ones, addresses included. So no tensor the attention kernel touches may be
allocated afresh per call. Its output, ``softmax_lse``, workspace and int32 block table
are kept in `GraphBuffers`, created during capture (inside the graph's pool) and found
again by the update through the captured ``out`` tensor. The causal mask is made once per
device outside any capture (`prepare`).

`register_npu_kernels()` registers the router for the ``npu`` device type; the
``NpuDevice`` constructor calls it.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import torch
from torch import Tensor

from ascendgraph import kernel_contracts as kc
from ascendgraph import ops
from ascendgraph.dynamo_gate import defer_kernel_dynamo_guard
from ascendgraph.errors import CaptureConstraintError
from ascendgraph.kernel_calls import ATB_KV_WRITE_SOCS, check_op, refusal
from hw import api, reference, workspace
from hw.api import NpuApi, TorchNpu

__all__ = [
    "KernelBinding",
    "KernelRoute",
    "KERNEL_ROUTES",
    "KernelRouter",
    "GraphBuffers",
    "register_npu_kernels",
    "prepare",
    "FIA_MASK_SIZE",
    "FIA_SPARSE_MODE",
]

log = logging.getLogger("ascendgraph.hw.kernels")  # under the CLI's "ascendgraph" logger (its handler, its -v levels)

FIA_MASK_SIZE = 2048  # sparse_mode 3 takes a compressed 2048 x 2048 causal mask
FIA_SPARSE_MODE = 3  # "rightDownCausal": query token i of a request sees kv 0 .. kv_len - q_len + i
# What "the kernel is missing" looks like when it is found only at its first call: torch_npu's
# ATB ops load NNAL's library lazily and raise OSError when it is not installed (torch-npu
# 2.13.0 op_plugin/atb/_atb_ops.py:62-89). Any other error raised inside an adapter (an
# AttributeError, a NotImplementedError) is a bug or a refusal: it propagates, and never
# selects a fallback.
_MISSING_KERNEL_ERRORS = (ImportError, OSError)
FALLBACK_IN_GRAPH = (
    "ascendgraph::{op} would run its {kind} fallback inside an ACL graph capture on npu: {why}. A fallback is "
    "never captured (it would be frozen into the graph, and nothing reports it afterwards): install a torch_npu "
    "(and NNAL, for ATB kernels) that has the kernel (hw/api.py lists the ones hw/ calls), or run the model "
    "without graphs (cudagraph_mode NONE) to use the fallback eagerly"
)
NO_WORKSPACE_IN_FULL_GRAPH = (
    "npu_fused_infer_attention_score inside a FULL graph needs a workspace made before its task group "
    "(_npu_fused_infer_attention_score_get_max_workspace): without it the kernel takes a temporary workspace "
    "per launch, and each task update points the graph at a temporary that is freed again. Install a torch_npu "
    "with the max-workspace query (2.13 has it) or use a PIECEWISE mode, where attention runs eagerly"
)

Adapter = Callable[..., Any]  # adapter(router, *op_args) -> the op's result


@dataclass(frozen=True)
class KernelBinding:
    """One torch_npu kernel that can implement an ascendgraph op."""

    api: NpuApi
    adapter: Adapter
    kernel: str  # the contract table's name of the kernel the adapter issues
    # The table's rules of ``kernel`` that decide kernel-or-fallback (`kernel_calls.refusal`).
    rules: tuple[str, ...]
    note: str = ""
    # The SoC generations (hw.soc: A2, A3, 310P, A5) this kernel serves the op on, as vLLM
    # Ascend chooses per device; empty: all. On another generation the binding is skipped.
    socs: tuple[str, ...] = ()


@dataclass(frozen=True)
class KernelRoute:
    """How the npu device runs one ascendgraph op: kernels in order, then the fallback."""

    op: str
    bindings: tuple[KernelBinding, ...]
    fallback: Adapter  # fallback(router, *op_args)
    fallback_kind: str  # "reference" | "composition"
    # False when the fallback's kernel sequence depends on host values (attention's
    # lengths): a task update could not refresh it, so issuing it in a task group is refused.
    fallback_in_graphs: bool = True


# --------------------------------------------------------------------------- adapters' helpers


def _channel_vector(values: Optional[Tensor], hidden: int) -> Optional[Tensor]:
    """A per-tensor or per-channel scale / offset as the contiguous [hidden] vector the
    kernels take (an ``expand`` would hand them a stride-0 tensor)."""
    if values is None:
        return None
    vector = values.reshape(-1).expand(hidden) if values.numel() == 1 else values.reshape(hidden)
    return vector.contiguous()


def _as_int8(y: Tensor) -> Tensor:
    return y if y.dtype == torch.int8 else y.view(torch.int8)


# --------------------------------------------------------------------------- norms and quantisation


def _rms_norm(router: "KernelRouter", x: Tensor, weight: Tensor, eps: float) -> Tensor:
    y, _ = router.npu.call(api.NPU_RMS_NORM, x, weight.to(x.dtype), epsilon=eps)
    return y



def _add_rms_norm(router: "KernelRouter", x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    y, _, x_sum = router.npu.call(api.NPU_ADD_RMS_NORM, x, residual, weight.to(x.dtype), epsilon=eps)
    return y, x_sum



def _dynamic_quant(router: "KernelRouter", x: Tensor) -> tuple[Tensor, Tensor]:
    y, scale = router.npu.call(api.NPU_DYNAMIC_QUANT, x)
    return _as_int8(y), scale



def _quantize(router: "KernelRouter", x: Tensor, scale: Tensor, offset: Optional[Tensor]) -> Tensor:
    hidden = x.shape[-1]
    y = router.npu.call(
        api.NPU_QUANTIZE, x, _channel_vector(scale, hidden), _channel_vector(offset, hidden), torch.qint8,
        axis=-1, div_mode=True,
    )
    return _as_int8(y)



def _add_rms_norm_dynamic_quant(
    router: "KernelRouter", x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    # Outputs (y1, y2, x_out, scale1, scale2); without smooth scales the second quantisation
    # path means nothing, so only the first is asked for (output_mask=[True, False], as vLLM
    # Ascend's callers without smooth_scale2 pass it; the op docs forbid only [False, False]).
    y1, _, x_sum, scale1, _ = router.npu.call(
        api.NPU_ADD_RMS_NORM_DYNAMIC_QUANT, x, residual, weight.to(x.dtype), epsilon=eps, output_mask=[True, False]
    )
    return _as_int8(y1), x_sum, scale1



def _add_rms_norm_quant(
    router: "KernelRouter", x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, offset: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor]:
    hidden = x.shape[-1]
    y1, _, x_sum = router.npu.call(
        api.NPU_ADD_RMS_NORM_QUANT, x, residual, weight.to(x.dtype), _channel_vector(scale, hidden),
        _channel_vector(offset, hidden), epsilon=eps,
    )
    return _as_int8(y1), x_sum



# --------------------------------------------------------------------------- rope


def _rotary_embedding(
    router: "KernelRouter", positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor, head_size: int, is_neox: bool
) -> tuple[Tensor, Tensor]:
    # The ATB kernel rotates in place, [T, heads * rot] rows, with the cache in the query dtype.
    tokens, rot = q.shape[0], cos_sin_cache.shape[-1]
    cache = cos_sin_cache if cos_sin_cache.dtype == q.dtype else cos_sin_cache.to(q.dtype)
    q_out = q.reshape(tokens, -1).clone(memory_format=torch.contiguous_format)
    k_out = k.reshape(tokens, -1).clone(memory_format=torch.contiguous_format)
    if rot == head_size:
        router.npu.call(api.NPU_ROTARY_EMBEDDING, positions, q_out, k_out, head_size, cache, is_neox)
    else:  # partial rotary: rotate the leading rot features of every head
        q_heads, k_heads = q_out.view(tokens, -1, head_size), k_out.view(tokens, -1, head_size)
        q_rot = q_heads[..., :rot].reshape(tokens, -1).contiguous()
        k_rot = k_heads[..., :rot].reshape(tokens, -1).contiguous()
        router.npu.call(api.NPU_ROTARY_EMBEDDING, positions, q_rot, k_rot, rot, cache, is_neox)
        q_heads[..., :rot] = q_rot.view(tokens, -1, rot)
        k_heads[..., :rot] = k_rot.view(tokens, -1, rot)
    return q_out.view(q.shape), k_out.view(k.shape)



# --------------------------------------------------------------------------- KV cache


def _reshape_and_cache(
    router: "KernelRouter", key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> None:
    tokens = slot_mapping.numel()
    slots = slot_mapping.reshape(-1)
    slots = slots if slots.dtype == torch.int32 else slots.to(torch.int32)
    router.npu.call(
        api.NPU_RESHAPE_AND_CACHE,
        key.reshape(tokens, *key_cache.shape[2:]),
        value.reshape(tokens, *value_cache.shape[2:]),
        key_cache,
        value_cache,
        slots,
    )



# The KV write's kernel per SoC generation, as vLLM Ascend picks it
# (vllm_ascend/device/device_op.py@182b75ea: BaseDeviceAdaptor.reshape_and_cache calls
# npu_scatter_pa_kv_cache with cache_mode="Norm"; only Ascend310PDeviceAdaptor overrides it
# with the ATB _npu_reshape_and_cache; A5DeviceAdaptor inherits the base).
RESHAPE_AND_CACHE_SOCS = ATB_KV_WRITE_SOCS
SCATTER_SOCS = tuple(soc for soc in ("A2", "A3", "A5") if soc not in RESHAPE_AND_CACHE_SOCS)


def _scatter_pa_kv_cache(
    router: "KernelRouter", key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> None:
    # vLLM Ascend passes contiguous key / value / slot_mapping (``.contiguous()``: no copy when
    # they already are) and the ND cache layout (cache_mode "Norm"; the schema's default is PA_NZ).
    tokens = slot_mapping.numel()
    slots = slot_mapping.reshape(-1)
    slots = slots if slots.dtype in kc.SLOT_DTYPES else slots.to(torch.int32)
    router.npu.call(
        api.NPU_SCATTER_PA_KV_CACHE,
        key.reshape(tokens, *key_cache.shape[2:]).contiguous(),
        value.reshape(tokens, *value_cache.shape[2:]).contiguous(),
        key_cache,
        value_cache,
        slots.contiguous(),
        cache_mode="Norm",
    )



# --------------------------------------------------------------------------- attention


@dataclass
class GraphBuffers:
    """Tensors a captured attention call must find again at its parameter update.

    Keyed by the captured ``out`` tensor (address and shape): the update re-issues the
    kernel with that very tensor. Entries are created only while a graph is being
    captured; eager calls use temporaries. `clear()` once no graph needs them.
    """

    entries: dict[tuple[Any, ...], dict[str, Tensor]] = field(default_factory=dict)
    masks: dict[torch.device, Tensor] = field(default_factory=dict)
    # One FIA workspace per (device, capture size), shared by every layer's call of that size, as
    # vLLM Ascend keeps one (attention_v1.py@182b75ea full_graph_fia: graph_params.workspaces.get(num_tokens));
    # a larger query replaces it for the calls after it.
    workspaces: dict[tuple[Any, ...], Tensor] = field(default_factory=dict)

    @staticmethod
    def key(out: Tensor, *extra: Any) -> tuple[Any, ...]:
        return (out.device, out.data_ptr(), tuple(out.shape), out.dtype, *extra)

    def lookup(self, key: tuple[Any, ...]) -> Optional[dict[str, Tensor]]:
        return self.entries.get(key)

    def create(self, key: tuple[Any, ...]) -> dict[str, Tensor]:
        return self.entries.setdefault(key, {})

    def shared_workspace(self, size_key: tuple[Any, ...], fresh: Tensor) -> Tensor:
        """The workspace every captured call of this size uses: the largest queried so far."""
        shared = self.workspaces.get(size_key)
        if shared is None or fresh.numel() > shared.numel():
            self.workspaces[size_key] = shared = fresh
        return shared

    def clear(self) -> None:
        self.entries.clear()
        self.workspaces.clear()


def causal_mask(device: torch.device) -> Tensor:
    """The compressed causal mask of FIA sparse_mode 3 (True = masked out), built on the host
    and copied to the device once, as vLLM Ascend builds its ``spec_attn_mask``
    (vllm_ascend/worker/model_runner_v1.py@3e1f15f7): no kernels of its own on the device."""
    host = torch.triu(torch.ones(FIA_MASK_SIZE, FIA_MASK_SIZE, dtype=torch.bool), diagonal=1)
    return host.to(device)


def _paged_attention(
    router: "KernelRouter",
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    actual_seq_lengths: list[int],
    seq_lens: list[int],
    scale: float,
    out: Tensor,
    workspace: Optional[Tensor] = None,
    softmax_lse: Optional[Tensor] = None,
) -> None:
    tokens, heads, head_dim = query.shape
    num_blocks, block_size, kv_heads, _ = key_cache.shape
    ends, lens = [int(v) for v in actual_seq_lengths], [int(v) for v in seq_lens]
    last = ends[-1] if ends else 0
    buffers = router.buffers
    key = GraphBuffers.key(out, tuple(query.shape), tuple(key_cache.shape), tuple(block_table.shape))
    slot = buffers.lookup(key)
    if slot is None and router.capturing():
        slot = buffers.create(key)
    if slot is None:
        # Eager: only the real tokens go to the kernel; padding tokens are zeros (op contract).
        if last < tokens:
            out[last:].zero_()
        if last == 0:
            return
        query, out = query[:last], out[:last]
    mask = buffers.masks.get(query.device)
    if mask is None:
        mask = buffers.masks.setdefault(query.device, causal_mask(query.device))
    table = block_table
    refresh_table = False
    if table.dtype != torch.int32:
        if slot is None:
            table = table.to(torch.int32)
        else:  # one static int32 copy, refreshed in place inside the task (below)
            held: Optional[Tensor] = slot.get("block_table")
            if held is None:
                held = slot["block_table"] = torch.empty(block_table.shape, dtype=torch.int32, device=block_table.device)
            table = held
            refresh_table = True
    keys = key_cache.view(num_blocks, block_size, kv_heads * head_dim)
    values = value_cache.view(num_blocks, block_size, kv_heads * head_dim)
    options = dict(
        atten_mask=mask,
        actual_seq_lengths=ends,
        actual_seq_lengths_kv=lens,
        block_table=table,
        num_heads=heads,
        scale=float(scale),
        input_layout="TND",
        num_key_value_heads=kv_heads,
        sparse_mode=FIA_SPARSE_MODE,
        block_size=block_size,
    )
    # Workspace and softmax_lse are allocated *before* the kernel's task group opens (torch_npu's
    # npugraph handler contract: "prepare_capture ... runs before graph_task_group_begin";
    # vLLM Ascend's full_graph_attention does the same): NpuDevice defers the group's begin
    # until `router.enter_task()`, right before the kernel.
    if workspace is not None and workspace.numel() == 0:
        workspace = None  # attention_workspace's fallback: the kernel sizes its own
    if workspace is None and slot is not None:
        workspace = slot.get("workspace")
    if workspace is None and router.npu.has(api.NPU_FIA_MAX_WORKSPACE):
        workspace = router.npu.call(api.NPU_FIA_MAX_WORKSPACE, query, keys, values, **options)
        if slot is not None:  # captured: one per capture size, not one per layer
            workspace = slot["workspace"] = buffers.shared_workspace((query.device, tokens), workspace)
    if workspace is None and slot is not None:  # captured or re-issued in a FULL graph
        raise CaptureConstraintError(NO_WORKSPACE_IN_FULL_GRAPH)
    lse = softmax_lse if softmax_lse is not None else (None if slot is None else slot.get("softmax_lse"))
    if lse is None:
        _, lse = router.npu.call(
            api.NPU_FIA_INFER_OUTPUT, query, values, input_layout="TND", block_table=table, num_heads=heads,
            num_key_value_heads=kv_heads,
        )
        if slot is not None:
            slot["softmax_lse"] = lse
    router.enter_task()
    if refresh_table:
        # Inside the task group, so a task update re-issues the cast from its own block table. Outside
        # it, the captured cast runs at replay after the update (the graph waits on the update's
        # ExternalEvent first) and copies the capture-time table over the update's (docs/hw.md).
        table.copy_(block_table)
    router.npu.call(api.NPU_FIA_OUT, query, keys, values, **options, workspace=workspace, out=[out, lse])



# --------------------------------------------------------------------------- fallbacks


def _reference(function: Callable[..., Any]) -> Adapter:
    return lambda router, *args: function(*args)


def _add_rms_norm_composed(router: "KernelRouter", x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    x_sum = x + residual
    return router.call("rms_norm", x_sum, weight, eps), x_sum


def _add_rms_norm_dynamic_quant_composed(
    router: "KernelRouter", x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    y, x_sum = router.call("add_rms_norm", x, residual, weight, eps)
    y_int8, scale = router.call("dynamic_quant", y)
    return y_int8, x_sum, scale


def _add_rms_norm_quant_composed(
    router: "KernelRouter", x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, offset: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor]:
    y, x_sum = router.call("add_rms_norm", x, residual, weight, eps)
    return router.call("quantize", y, scale, offset), x_sum


def _split_qkv_rmsnorm_rope_composed(
    router: "KernelRouter",
    qkv: Tensor,
    q_weight: Tensor,
    k_weight: Tensor,
    positions: Tensor,
    cos_sin_cache: Tensor,
    q_size: int,
    kv_size: int,
    head_dim: int,
    eps: float,
    is_neox: bool,
) -> tuple[Tensor, Tensor, Tensor]:
    # vLLM Ascend's fused op is its own kernel, not torch_npu's: compose the per-head norm
    # and rope, which do reach torch_npu's kernels.
    tokens = qkv.shape[0]
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = router.call("rms_norm", q.reshape(tokens, -1, head_dim), q_weight, eps).reshape(tokens, q_size)
    k = router.call("rms_norm", k.reshape(tokens, -1, head_dim), k_weight, eps).reshape(tokens, kv_size)
    q, k = router.call("rotary_embedding", positions, q, k, cos_sin_cache, head_dim, is_neox)
    return q, k, v.clone(memory_format=torch.contiguous_format)  # never an alias of qkv (custom-op rule)


# --------------------------------------------------------------------------- the table

# Each binding names the table's rules of its kernel that decide kernel-or-fallback: those the
# kernel's arguments as hw builds them can break (hw casts, reshapes and copies the rest into
# shape). The op's own level (``ascendgraph::<op>``) is always asked too.
KERNEL_ROUTES: dict[str, KernelRoute] = {
    route.op: route
    for route in (
        KernelRoute("rms_norm", (KernelBinding(api.NPU_RMS_NORM, _rms_norm, kc.RMS_NORM, ("input_dtype",)),),
                    _reference(reference.rms_norm), "reference"),
        KernelRoute("add_rms_norm", (KernelBinding(api.NPU_ADD_RMS_NORM, _add_rms_norm, kc.ADD_RMS_NORM, ("x_dtype",)),),
                    _add_rms_norm_composed, "composition"),
        KernelRoute("dynamic_quant",
                    (KernelBinding(api.NPU_DYNAMIC_QUANT, _dynamic_quant, kc.DYNAMIC_QUANT,
                                   ("input_dtype_half", "input_rank")),),
                    _reference(reference.dynamic_quant), "reference"),
        KernelRoute("quantize",
                    (KernelBinding(api.NPU_QUANTIZE, _quantize, kc.QUANTIZE,
                                   ("input_dtype", "scales", "zero_points", "scales_per_channel")),),
                    _reference(reference.quantize), "reference"),
        KernelRoute("add_rms_norm_dynamic_quant",
                    (KernelBinding(api.NPU_ADD_RMS_NORM_DYNAMIC_QUANT, _add_rms_norm_dynamic_quant,
                                   kc.ADD_RMS_NORM_DYNAMIC_QUANT, ("x_dtype_half",)),),
                    _add_rms_norm_dynamic_quant_composed, "composition"),
        KernelRoute("add_rms_norm_quant",
                    (KernelBinding(api.NPU_ADD_RMS_NORM_QUANT, _add_rms_norm_quant, kc.ADD_RMS_NORM_QUANT,
                                   ("x_dtype_half", "scales_like_gamma", "zero_points_like_gamma")),),
                    _add_rms_norm_quant_composed, "composition"),
        KernelRoute("rotary_embedding",
                    (KernelBinding(api.NPU_ROTARY_EMBEDDING, _rotary_embedding, kc.ROTARY_EMBEDDING, ("rope_dtype",),
                                   "ATB kernel: needs the NNAL package"),),
                    _reference(reference.rotary_embedding), "reference"),
        KernelRoute("split_qkv_rmsnorm_rope", (), _split_qkv_rmsnorm_rope_composed, "composition"),
        KernelRoute("muls_add", (), _reference(reference.muls_add), "reference"),
        KernelRoute("reshape_and_cache",
                    (KernelBinding(api.NPU_SCATTER_PA_KV_CACHE, _scatter_pa_kv_cache, kc.SCATTER_PA_KV_CACHE,
                                   ("scatter_dtypes_equal",), "A2/A3/A5: ND cache (cache_mode Norm)",
                                   socs=SCATTER_SOCS),
                     KernelBinding(api.NPU_RESHAPE_AND_CACHE, _reshape_and_cache, kc.RESHAPE_AND_CACHE,
                                   ("cache_dtype", "caches_contiguous"), "310P; ATB kernel: needs the NNAL package",
                                   socs=RESHAPE_AND_CACHE_SOCS)),
                    _reference(reference.reshape_and_cache), "reference"),
        KernelRoute("paged_attention",
                    (KernelBinding(api.NPU_FIA_OUT, _paged_attention, kc.FIA,
                                   ("query_dtype", "query_contiguous", "kv_contiguous", "gqa_ratio"),
                                   "TND layout, paged KV, sparse_mode 3, host actual_seq_lengths"),),
                    _reference(reference.paged_attention), "reference", fallback_in_graphs=False),
        KernelRoute("attention_workspace",
                    (KernelBinding(api.NPU_FIA_MAX_WORKSPACE, workspace.attention_workspace, kc.FIA_MAX_WORKSPACE,
                                   ("query_dtype",), "FIA's max-workspace query, before the task group"),),
                    workspace.no_workspace, "reference"),
    )
}


# --------------------------------------------------------------------------- routing


class KernelRouter:
    """Runs ascendgraph ops through `KERNEL_ROUTES` on one torch_npu namespace.

    ``capturing`` reports whether a graph capture is under way (torch_npu's
    is_current_stream_capturing by default). Fallbacks are logged once per (op, reason).
    """

    def __init__(self, npu: TorchNpu, *, capturing: Optional[Callable[[], bool]] = None) -> None:
        self.npu = npu
        self.buffers = GraphBuffers()
        self._capturing = capturing
        self._broken: dict[NpuApi, str] = {}
        self._logged: set[tuple[str, str]] = set()
        self.fallbacks: dict[str, str] = {}  # op -> the last reason it fell back (for reports and tests)
        self.live_graphs = 0  # captured graphs of every NpuDevice not yet reset (GraphBuffers' lifetime)
        # Kernels issued now land in a task group (captured or being updated): set by NpuDevice.
        self.in_task_group = False
        self.registered_for: Optional[str] = None  # the device type the router is registered on
        # The SoC generation of the NPU (set by NpuDevice; one NPU kind per process): picks the
        # bindings that carry ``socs`` (the KV write). None: every binding, in table order.
        self.soc: Optional[str] = None
        # Opens the task group / task update NpuDevice deferred until the first kernel.
        self._enter: Optional[Callable[[], None]] = None

    def defer_task(self, enter: Optional[Callable[[], None]]) -> None:
        """Set (or clear) what opens the pending task group or update (NpuDevice)."""
        self._enter = enter

    def enter_task(self) -> None:
        """Open the pending task group / update now: what follows is the kernel task."""
        enter, self._enter = self._enter, None
        if enter is not None:
            enter()

    def pre_check(self, op: str, args: tuple[Any, ...], *, in_graph: bool) -> None:
        """The kernel-contract table, before any kernel: a violation is a hard error
        (KernelContractError), never a fallback (docs/decisions.md "Kernel contracts")."""
        _contract_check()(op, args, in_graph=in_graph, soc=self.soc)

    def graph_captured(self) -> None:
        self.live_graphs += 1

    def graph_released(self) -> None:
        """A captured graph was reset or freed; with none left, the update buffers go too."""
        self.live_graphs = max(0, self.live_graphs - 1)
        if self.live_graphs == 0:
            self.buffers.clear()

    def capturing(self) -> bool:
        if self._capturing is not None:
            return bool(self._capturing())
        return self.npu.has(api.IS_CURRENT_STREAM_CAPTURING) and bool(self.npu.call(api.IS_CURRENT_STREAM_CAPTURING))

    def _unusable(self, binding: KernelBinding, op: str, args: tuple[Any, ...], in_graph: bool) -> Optional[str]:
        if binding.socs and self.soc is not None and self.soc not in binding.socs:
            return f"{binding.api.path} is not the kernel for this op on {self.soc} (vLLM Ascend uses it on {'/'.join(binding.socs)})"
        if binding.api in self._broken:
            return self._broken[binding.api]
        if not self.npu.has(binding.api):
            return f"{binding.api.path} is not in this torch_npu"
        return refusal(op, args, kernel=binding.kernel, rules=binding.rules, in_graph=in_graph)

    def call(self, op: str, *args: Any) -> Any:
        route = KERNEL_ROUTES[op]
        # The contract table first: what a card's kernel refuses is refused here, whichever
        # kernel or fallback would run (docs/decisions.md "Kernel contracts": never a silent fallback).
        in_graph = self.in_task_group or self.capturing()
        self.pre_check(op, args, in_graph=in_graph)
        if not route.bindings:  # torch_npu has no kernel for it: the formula is the implementation
            self.enter_task()
            return route.fallback(self, *args)
        reasons = []
        for binding in route.bindings:
            reason = self._unusable(binding, op, args, in_graph)
            if reason is None:
                try:
                    if op != "paged_attention":  # attention prepares its buffers first, then enters
                        self.enter_task()
                    return binding.adapter(self, *args)
                except _MISSING_KERNEL_ERRORS as exc:  # e.g. an ATB op whose NNAL library is missing
                    self._broken[binding.api] = f"{binding.api.path} failed to load ({type(exc).__name__}: {exc})"
                    reason = self._broken[binding.api]
            reasons.append(reason)
        why = "; ".join(reasons) or "torch_npu has no kernel for it"
        self.fallbacks[op] = why
        if not route.fallback_in_graphs and self.in_task_group:
            raise CaptureConstraintError(
                f"ascendgraph::{op} cannot be captured into an ACL graph on npu: {why}. Its reference fallback "
                "issues kernels shaped by the host sequence lengths, which a FULL graph's parameter update cannot "
                "refresh. Install a torch_npu that has the kernel (hw/api.py lists the ones hw/ calls) or use a "
                "PIECEWISE mode, where attention runs eagerly."
            )
        if self.in_task_group or self.capturing():
            raise CaptureConstraintError(FALLBACK_IN_GRAPH.format(op=op, kind=route.fallback_kind, why=why))
        if (op, why) not in self._logged:
            self._logged.add((op, why))
            log.warning("ascendgraph::%s on npu runs the %s fallback: %s", op, route.fallback_kind, why)
        self.enter_task()
        return route.fallback(self, *args)

    def kernel(self, op: str) -> Callable[..., Any]:
        """The function registered for ``op`` on the npu device type."""

        def run(*args: Any) -> Any:
            return self.call(op, *args)

        run.__name__ = f"npu_{op}"
        return run


def _contract_check() -> Callable[..., None]:
    """`ascendgraph.kernel_calls.check_op` as hw's pre-check applies it: on a card CANN sizes the
    workspace, so the simulator's size model (``SIMULATOR_MODEL_RULES``) is not hw's to enforce."""
    return functools.partial(check_op, lenient=kc.SIMULATOR_MODEL_RULES)


_ROUTER: Optional[KernelRouter] = None


def register_npu_kernels(npu: Optional[TorchNpu] = None, device_type: str = "npu") -> KernelRouter:
    """Register the router for every ascendgraph op on ``device_type`` (idempotent).

    Registration is process-wide, as ``torch.library`` itself is; a different torch_npu
    module (the simulator's facade after the real one, or back) gets a router of its own.
    On the simulator's facade (`api.captures_by_dispatch`) the ops are also declared *wrapper
    ops* with the router as implementation, and declared again on every call (the facade takes
    the declarations back when it is uninstalled): so a simulator capture records the
    torch_npu kernels hw/ issues, as a card's graph would.
    """
    global _ROUTER
    npu = npu or api.torch_npu_namespace()
    if _ROUTER is None or _ROUTER.npu.module is not npu.module:
        _ROUTER = KernelRouter(npu)
        _ROUTER.registered_for = None
    router = _ROUTER
    wrappers = api.captures_by_dispatch(npu.module) or device_type != "npu"
    if wrappers or router.registered_for != device_type:
        for name in ops.OP_NAMES:
            getattr(ops, name).register_kernel(device_type)(router.kernel(name))
            defer_kernel_dynamo_guard(getattr(ops, name))
            if wrappers:
                ops.register_wrapper_op(ops.kernel_op(name), router.kernel(name))
        router.registered_for = device_type
    return router


def prepare(device: torch.device) -> None:
    """Create per-device constants (the causal mask) outside any capture: anew for every
    NpuDevice, so a device runtime that was re-created since (the simulator's facade gives each
    test a fresh simulated NPU) never computes with a tensor of the previous one."""
    router = _ROUTER if _ROUTER is not None else register_npu_kernels()
    router.buffers.masks[device] = causal_mask(device)
