"""The kernels models and compile passes use, as ``torch.library`` custom ops (namespace
``ascendgraph``), plus the registry of *wrapper ops*.

Theory of operation. Each op is declared here with its schema and a fake (meta)
implementation, so it traces under torch.compile / make_fx. The real kernels are not
here: a device backend registers them for its dispatch key (the simulator registers CPU
reference kernels in ``sim/kernels.py`` when the ``sim`` package is imported, which
``get_device("sim")`` does). Calling an op on a device type nobody registered raises a
clear error instead of silently computing something.

Host arguments (``int[]`` such as paged_attention's sequence lengths) are plain Python
lists: a captured graph freezes them, exactly like Ascend's FIA kernels.

Wrapper ops. A *wrapper op* is a custom op whose Python implementation issues other
(kernel) ops, e.g. a model's attention op that reads the forward context and calls
`paged_attention`. Graph recorders must not record a wrapper as one opaque node (replay
would re-read the *current* context and hide stale parameters); with
`register_wrapper_op(op, impl)` the recorder re-enters ``impl`` under recording, so the
kernel ops it issues, with their host values frozen, are what gets captured.
The registry is process-wide like torch.library itself (an op is an op in every
device); it holds no device state.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Union

import torch
from torch import Tensor
from torch._ops import OpOverload, OpOverloadPacket

from ascendgraph.dynamo_gate import defer_kernel_dynamo_guard
from ascendgraph.workspace_sizes import paged_attention_op_workspace_bytes

__all__ = [
    "argument_tensors",
    "NAMESPACE",
    "OP_NAMES",
    "rms_norm",
    "add_rms_norm",
    "dynamic_quant",
    "quantize",
    "add_rms_norm_dynamic_quant",
    "add_rms_norm_quant",
    "rotary_embedding",
    "split_qkv_rmsnorm_rope",
    "muls_add",
    "reshape_and_cache",
    "paged_attention",
    "attention_workspace",
    "all_reduce",
    "COLLECTIVE_OP_NAMES",
    "collective_group",
    "register_wrapper_op",
    "unregister_wrapper_op",
    "wrapper_impl",
    "is_wrapper_op",
    "kernel_op",
]

NAMESPACE = "ascendgraph"

OP_NAMES = (
    "rms_norm",
    "add_rms_norm",
    "dynamic_quant",
    "quantize",
    "add_rms_norm_dynamic_quant",
    "add_rms_norm_quant",
    "rotary_embedding",
    "split_qkv_rmsnorm_rope",
    "muls_add",
    "reshape_and_cache",
    "paged_attention",
    "attention_workspace",
)


def argument_tensors(values: Sequence[Any]) -> list[Tensor]:
    """The tensors among an op's arguments or outputs, one list level deep (``Tensor[]``
    arguments). The cost model and static-kernel signatures both use it, so they agree."""
    found: list[Tensor] = []
    for value in values:
        if isinstance(value, Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, Tensor))
    return found


def _no_kernel(name: str, sample: Tensor) -> NotImplementedError:
    return NotImplementedError(
        f"{NAMESPACE}::{name} has no kernel for device type {sample.device.type!r}. "
        "Kernels are registered by a device backend: create the device first "
        "(ascendgraph.device.get_device('sim') registers the CPU kernels; `import sim` does too)."
    )


def _op(name: str, schema: str, mutates: Sequence[str] = ()) -> Callable[[Callable[..., Any]], Any]:
    def define(fn: Callable[..., Any]) -> Any:
        op = torch.library.custom_op(f"{NAMESPACE}::{name}", fn, mutates_args=tuple(mutates), schema=schema)
        defer_kernel_dynamo_guard(op)
        return op

    return define


# --------------------------------------------------------------------------- norms


@_op("rms_norm", "(Tensor x, Tensor weight, float eps) -> Tensor")
def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """y = x / sqrt(mean(x^2, -1) + eps) * weight (computed in float32, returned in x.dtype)."""
    raise _no_kernel("rms_norm", x)


@rms_norm.register_fake
def _(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return torch.empty_like(x)


@_op(
    "add_rms_norm",
    "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor y, Tensor x_sum)",
)
def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """x_sum = x + residual; y = rms_norm(x_sum)."""
    raise _no_kernel("add_rms_norm", x)


@add_rms_norm.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


# --------------------------------------------------------------------------- quantisation


def _scale_like(x: Tensor) -> Tensor:
    return x.new_empty(x.shape[:-1], dtype=torch.float32)


@_op("dynamic_quant", "(Tensor x) -> (Tensor y_int8, Tensor scale)")
def dynamic_quant(x: Tensor) -> tuple[Tensor, Tensor]:
    """Per-token symmetric int8: scale = amax(|x|, -1) / 127 (float32, shape x.shape[:-1])."""
    raise _no_kernel("dynamic_quant", x)


@dynamic_quant.register_fake
def _(x: Tensor) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x, dtype=torch.int8), _scale_like(x)


@_op("quantize", "(Tensor x, Tensor scale, Tensor? offset) -> Tensor")
def quantize(x: Tensor, scale: Tensor, offset: Optional[Tensor]) -> Tensor:
    """Static int8: clamp(round(x / scale + offset), -128, 127)."""
    raise _no_kernel("quantize", x)


@quantize.register_fake
def _(x: Tensor, scale: Tensor, offset: Optional[Tensor]) -> Tensor:
    return torch.empty_like(x, dtype=torch.int8)


@_op(
    "add_rms_norm_dynamic_quant",
    "(Tensor x, Tensor residual, Tensor weight, float eps) -> (Tensor y_int8, Tensor x_sum, Tensor scale)",
)
def add_rms_norm_dynamic_quant(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    """add_rms_norm followed by dynamic_quant of its normalised output."""
    raise _no_kernel("add_rms_norm_dynamic_quant", x)


@add_rms_norm_dynamic_quant.register_fake
def _(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(x, dtype=torch.int8), torch.empty_like(x), _scale_like(x)


@_op(
    "add_rms_norm_quant",
    "(Tensor x, Tensor residual, Tensor weight, Tensor scale, Tensor? offset, float eps)"
    " -> (Tensor y_int8, Tensor x_sum)",
)
def add_rms_norm_quant(
    x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, offset: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor]:
    """add_rms_norm followed by a static quantize of its normalised output."""
    raise _no_kernel("add_rms_norm_quant", x)


@add_rms_norm_quant.register_fake
def _(
    x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, offset: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor]:
    return torch.empty_like(x, dtype=torch.int8), torch.empty_like(x)


# --------------------------------------------------------------------------- rope


@_op(
    "rotary_embedding",
    "(Tensor positions, Tensor q, Tensor k, Tensor cos_sin_cache, int head_size, bool is_neox)"
    " -> (Tensor q_out, Tensor k_out)",
)
def rotary_embedding(
    positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor, head_size: int, is_neox: bool
) -> tuple[Tensor, Tensor]:
    """Rotary position embedding of q and k ([T, heads * head_size]); the cache row of a
    position is cat(cos, sin), each half rotary_dim / 2 wide (rotary_dim <= head_size)."""
    raise _no_kernel("rotary_embedding", q)


@rotary_embedding.register_fake
def _(
    positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor, head_size: int, is_neox: bool
) -> tuple[Tensor, Tensor]:
    return torch.empty_like(q), torch.empty_like(k)


@_op(
    "split_qkv_rmsnorm_rope",
    "(Tensor qkv, Tensor q_weight, Tensor k_weight, Tensor positions, Tensor cos_sin_cache,"
    " int q_size, int kv_size, int head_dim, float eps, bool is_neox) -> (Tensor q, Tensor k, Tensor v)",
)
def split_qkv_rmsnorm_rope(
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
    """Split qkv [T, q_size + 2 * kv_size], per-head rms_norm of q and k, then rope."""
    raise _no_kernel("split_qkv_rmsnorm_rope", qkv)


@split_qkv_rmsnorm_rope.register_fake
def _(
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
    lead = qkv.shape[:-1]
    return (
        qkv.new_empty((*lead, q_size)),
        qkv.new_empty((*lead, kv_size)),
        qkv.new_empty((*lead, kv_size)),
    )


# --------------------------------------------------------------------------- elementwise


@_op("muls_add", "(Tensor x, Tensor y, float scale) -> Tensor")
def muls_add(x: Tensor, y: Tensor, scale: float) -> Tensor:
    """x * scale + y."""
    raise _no_kernel("muls_add", x)


@muls_add.register_fake
def _(x: Tensor, y: Tensor, scale: float) -> Tensor:
    return torch.empty(torch.broadcast_shapes(x.shape, y.shape), dtype=x.dtype, device=x.device)


# --------------------------------------------------------------------------- KV cache, attention


@_op(
    "reshape_and_cache",
    "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping) -> ()",
    mutates=("key_cache", "value_cache"),
)
def reshape_and_cache(
    key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> None:
    """Write key/value [T, kv_heads, head_dim] into the paged caches
    [num_blocks, block_size, kv_heads, head_dim] at slot = block * block_size + offset;
    slots < 0 (padding) are skipped."""
    raise _no_kernel("reshape_and_cache", key)


@reshape_and_cache.register_fake
def _(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor) -> None:
    return None


@_op(
    "paged_attention",
    "(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, int[] actual_seq_lengths,"
    " int[] seq_lens, float scale, Tensor(a!) out, Tensor? workspace=None, Tensor(b!)? softmax_lse=None) -> ()",
    mutates=("out", "softmax_lse"),
)
def paged_attention(
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
    """FIA-like causal attention over a paged KV cache, TND layout, written into ``out``.

    query/out [T, heads, head_dim]; ``actual_seq_lengths`` are the cumulative END offsets of
    each request's query tokens in T and ``seq_lens`` each request's KV length (host
    lists). Query token i of request r (q_len tokens) sees kv positions
    0..seq_lens[r] - q_len + i. heads must be a multiple of kv heads (GQA). Tokens past
    the last end (padding) and requests with seq_len 0 get 0.

    ``workspace`` (from `attention_workspace`) and ``softmax_lse`` are the kernel's scratch
    and second output, allocated by the caller *before* a graph task group, as torch_npu's
    graph handlers (``prepare_capture``) and vLLM Ascend do; None: the kernel makes its own
    (eager calls).
    """
    raise _no_kernel("paged_attention", query)


@paged_attention.register_fake
def _(
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
    return None


@_op(
    "attention_workspace",
    "(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_table, int[] actual_seq_lengths,"
    " int[] seq_lens, float scale) -> Tensor",
)
def attention_workspace(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    actual_seq_lengths: list[int],
    seq_lens: list[int],
    scale: float,
) -> Tensor:
    """The workspace query of `paged_attention` (torch_npu's
    ``_npu_fused_infer_attention_score_get_max_workspace``): a fresh uint8 buffer large
    enough for these arguments. Not a kernel task: call it before ``task_group_begin``
    (a device refuses it inside a task group) and pass the buffer to every launch of the
    call, captured and re-issued."""
    raise _no_kernel("attention_workspace", query)


@attention_workspace.register_fake
def _(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    actual_seq_lengths: list[int],
    seq_lens: list[int],
    scale: float,
) -> Tensor:
    # torch_npu sizes FIA's workspace from its tiling, which nothing off a card knows: the
    # simulator's model (ascendgraph/workspace_sizes.py), the one its kernels check against.
    return query.new_empty((paged_attention_op_workspace_bytes(query, key_cache, block_table),), dtype=torch.uint8)
# --------------------------------------------------------------------------- collectives
# A model with tensor parallelism issues its collectives as ops, so a graph capture records
# them and a device can charge what the captured collective costs (sim/budget.py: streams
# per communication group under the HCCL expansion mode). This process plays one rank of
# the group, so every collective is the identity on its input (a copy, as the output of an
# all-reduce is a fresh tensor); the implementation is device-independent (every backend
# gets it), unlike the kernels above.

COLLECTIVE_OP_NAMES = ("all_reduce", "moe_dispatch", "moe_combine")


@torch.library.custom_op(f"{NAMESPACE}::all_reduce", mutates_args=(), device_types=None,
                         schema="(Tensor x, str group, int world_size) -> Tensor")
def all_reduce(x: Tensor, group: str, world_size: int) -> Tensor:
    """Sum of ``x`` over the ``world_size`` ranks of communication group ``group``; this
    process is one rank whose peers hold the same values' share, so the sum is ``x`` itself."""
    return x.clone()


@all_reduce.register_fake
def _(x: Tensor, group: str, world_size: int) -> Tensor:
    return torch.empty_like(x)


# MoE token dispatch and combine on the expert-parallel group (MC2 on Ascend: vLLM Ascend's
# TokenDispatcherWithMC2, npu_moe_distribute_dispatch / combine). ``global_bs`` is MC2's global
# batch size: 0 when every rank is padded to one count (docs/ranks.md). One rank's view: identity.
@torch.library.custom_op(f"{NAMESPACE}::moe_dispatch", mutates_args=(), device_types=None,
                         schema="(Tensor x, str group, int world_size, int global_bs) -> Tensor")
def moe_dispatch(x: Tensor, group: str, world_size: int, global_bs: int) -> Tensor:
    """Send each token to its experts' ranks of ``group``; this rank's view is its own tokens."""
    return x.clone()


@moe_dispatch.register_fake
def _(x: Tensor, group: str, world_size: int, global_bs: int) -> Tensor:
    return torch.empty_like(x)


@torch.library.custom_op(f"{NAMESPACE}::moe_combine", mutates_args=(), device_types=None,
                         schema="(Tensor x, str group, int world_size, int global_bs) -> Tensor")
def moe_combine(x: Tensor, group: str, world_size: int, global_bs: int) -> Tensor:
    """Gather the experts' outputs back to each token's rank; this rank's view: identity."""
    return x.clone()


@moe_combine.register_fake
def _(x: Tensor, group: str, world_size: int, global_bs: int) -> Tensor:
    return torch.empty_like(x)


for _collective in (all_reduce, moe_dispatch, moe_combine):
    defer_kernel_dynamo_guard(_collective)


def collective_group(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[tuple[str, int]]:
    """(group name, world size) when ``func`` is one of the collective ops, else None."""
    if getattr(func, "namespace", None) != NAMESPACE or func.__name__.split(".")[0] not in COLLECTIVE_OP_NAMES:
        return None
    group = args[1] if len(args) > 1 else kwargs["group"]
    world_size = args[2] if len(args) > 2 else kwargs["world_size"]
    return str(group), int(world_size)


def kernel_op(name: str) -> OpOverload:
    """The OpOverload of one of this module's ops by short name (``"rms_norm"``)."""
    if name not in OP_NAMES:
        raise KeyError(f"unknown ascendgraph op {name!r}: expected one of {', '.join(OP_NAMES)}")
    return getattr(getattr(torch.ops, NAMESPACE), name).default


# --------------------------------------------------------------------------- wrapper ops

OpLike = Union[OpOverload, OpOverloadPacket, Any]  # Any: a CustomOpDef from torch.library.custom_op
_WRAPPER_OPS: dict[OpOverload, Callable[..., Any]] = {}


def _as_overload(op: OpLike) -> OpOverload:
    if isinstance(op, OpOverload):
        return op
    if isinstance(op, OpOverloadPacket):
        return op.default
    overload = getattr(op, "_opoverload", None)  # torch.library.CustomOpDef
    if isinstance(overload, OpOverload):
        return overload
    raise TypeError(
        f"expected an OpOverload, an OpOverloadPacket or a torch.library.custom_op, got {op!r}"
    )


def register_wrapper_op(op: OpLike, impl: Callable[..., Any]) -> OpOverload:
    """Declare ``op`` a wrapper: recorders call ``impl(*args, **kwargs)`` (which must return
    what the op returns) under recording instead of recording ``op`` as one node."""
    overload = _as_overload(op)
    if not callable(impl):
        raise TypeError(f"impl for wrapper op {overload} must be callable, got {impl!r}")
    _WRAPPER_OPS[overload] = impl
    return overload


def unregister_wrapper_op(op: OpLike) -> None:
    """Forget a wrapper op (tests); unknown ops are ignored."""
    _WRAPPER_OPS.pop(_as_overload(op), None)


def wrapper_impl(op: OpLike) -> Optional[Callable[..., Any]]:
    """The Python implementation registered for a wrapper op, or None."""
    try:
        return _WRAPPER_OPS.get(_as_overload(op))
    except TypeError:
        return None


def is_wrapper_op(op: OpLike) -> bool:
    return wrapper_impl(op) is not None
