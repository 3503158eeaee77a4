"""How each ascendgraph op call becomes torch_npu kernel calls (hw/'s mapping, as data for checks).

Theory of operation. `kernel_calls(op, args, in_graph=...)` returns the `KernelCall`s an
op call becomes on an NPU: first the op's own implied-rule level
(``ascendgraph::paged_attention``, keyed by the op's argument names), then the torch_npu
kernel with its arguments keyed by torch_npu's keyword names, exactly as hw/kernels.py's
adapters build them. Eagerly hw gives attention only the real query tokens
(``query[:actual_seq_lengths[-1]]``, nothing at all for a batch without query tokens); in a
graph (capture or task update) it gives the whole captured query. `check_op` checks every
call against `ascendgraph.kernel_contracts` and raises KernelContractError; it remembers the
calls that passed by their arguments' metadata (`call_metadata`: each tensor's type, shape,
dtype and contiguity, each host value with its type), all the rules read, so a call like one
checked before is not checked again (the simulator checks thousands per run, most alike). `refusal` asks
the table about one kernel: hw/'s kernel-or-fallback decision, per binding (hw/kernels.py),
is that query with the rule names the binding relies on.

The mapping issues no tensor op: where hw's adapter casts, copies or reshapes an argument,
the call carries a `TensorSpec` (shape, dtype, contiguity) of what hw would pass, since on
a card a cast is a kernel and inside a task group an allocation, and the contract rules read
metadata only. Its arguments match what hw sends (e.g. ``output_mask=[True, False]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from ascendgraph.errors import KernelContractError
from ascendgraph.kernel_contracts import (
    ADD_RMS_NORM,
    ADD_RMS_NORM_DYNAMIC_QUANT,
    ADD_RMS_NORM_QUANT,
    DYNAMIC_QUANT,
    FIA,
    FIA_MASK_SIZE,
    FIA_MAX_WORKSPACE,
    FIA_SPARSE_MODE,
    PAGED_ATTENTION_OP,
    QUANTIZE,
    RESHAPE_AND_CACHE,
    RMS_NORM,
    ROTARY_EMBEDDING,
    SCATTER_PA_KV_CACHE,
    SLOT_DTYPES,
    VALUE_READING_KERNELS,
    KernelRule,
    message,
    violations,
)

__all__ = ["KernelCall", "TensorSpec", "kernel_calls", "op_violations", "check_op", "call_metadata", "refusal", "CHECKED_OPS"]

# The ops whose calls map onto torch_npu kernels with contracts (the simulator's kernels check
# these; `kernel_calls` also maps hw's workspace query, ``attention_workspace``).
CHECKED_OPS = (
    "rms_norm",
    "add_rms_norm",
    "dynamic_quant",
    "quantize",
    "add_rms_norm_dynamic_quant",
    "add_rms_norm_quant",
    "rotary_embedding",
    "reshape_and_cache",
    "paged_attention",
)


@dataclass(frozen=True)
class TensorSpec:
    """The metadata of a tensor hw would make from an argument (a cast, a contiguous copy, a
    reshape), standing in for it in a pre-check so that no tensor op is issued."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    contiguous: bool = True

    def dim(self) -> int:
        return len(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def is_contiguous(self) -> bool:
        return self.contiguous


def _spec(tensor: Any, *, shape: Optional[Sequence[int]] = None, dtype: Optional[torch.dtype] = None,
          contiguous: Optional[bool] = None) -> TensorSpec:
    return TensorSpec(tuple(int(v) for v in (tensor.shape if shape is None else shape)),
                      tensor.dtype if dtype is None else dtype,
                      bool(tensor.is_contiguous()) if contiguous is None else contiguous)


def _reshaped(tensor: Any, shape: Sequence[int]) -> Any:
    """hw's ``tensor.reshape(shape)`` (contiguous); the tensor itself when the sizes disagree
    (the contract's shape rule then names it instead of reshape's own error)."""
    if int(tensor.numel()) != math.prod(int(v) for v in shape):
        return tensor
    return _spec(tensor, shape=shape, contiguous=True)


@dataclass(frozen=True)
class KernelCall:
    """One torch_npu kernel an ascendgraph op call becomes, with its keyword arguments."""

    kernel: str
    arguments: Mapping[str, Any]


def _paged_attention_calls(args: Sequence[Any], in_graph: bool) -> list[KernelCall]:
    query, key_cache, value_cache, block_table, ends, seq_lens, scale, out = args[:8]  # workspace, softmax_lse follow
    workspace = args[8] if len(args) > 8 else None
    op_args = dict(query=query, key_cache=key_cache, value_cache=value_cache, block_table=block_table,
                   actual_seq_lengths=list(ends), seq_lens=list(seq_lens), scale=scale, out=out)
    calls = [KernelCall(PAGED_ATTENTION_OP, op_args)]
    last = int(ends[-1]) if len(ends) else 0
    if not in_graph:
        if last == 0:  # hw issues no kernel for a batch without query tokens
            return calls
        if query.dim() >= 1 and last < int(query.shape[0]):  # hw's query[:last] (a view)
            query = _spec(query, shape=(last, *query.shape[1:]))
    fia = _fia_arguments(query, key_cache, value_cache, block_table, ends, seq_lens, scale)
    if fia is None:
        return calls  # the layout rule above already refuses it; no FIA view exists
    if workspace is not None and int(workspace.numel()) > 0:  # hw runs .out in it (an empty one: hw queries its own)
        fia["workspace"] = workspace
    calls.append(KernelCall(FIA, fia))
    return calls


def _fia_arguments(query: Any, key_cache: Any, value_cache: Any, block_table: Any, ends: Sequence[Any],
                   seq_lens: Sequence[Any], scale: float) -> Optional[dict[str, Any]]:
    """The fused attention's keyword arguments as hw builds them (TND, paged, sparse_mode 3,
    the caches viewed as (blocknum, blocksize, H)); None when no such view exists."""
    if key_cache.dim() != 4 or query.dim() != 3:
        return None
    num_blocks, block_size, kv_heads, head_dim = (int(s) for s in key_cache.shape)
    kv_shape = (num_blocks, block_size, kv_heads * head_dim)
    return dict(
        query=query,
        key=_spec(key_cache, shape=kv_shape) if key_cache.is_contiguous() else key_cache,
        value=_spec(value_cache, shape=kv_shape) if value_cache.is_contiguous() else value_cache,
        atten_mask=_MASK,
        actual_seq_lengths=[int(v) for v in ends],
        actual_seq_lengths_kv=[int(v) for v in seq_lens],
        block_table=block_table if block_table.dtype == torch.int32 else _spec(block_table, dtype=torch.int32),
        num_heads=int(query.shape[1]),
        scale=float(scale),
        input_layout="TND",
        num_key_value_heads=kv_heads,
        sparse_mode=FIA_SPARSE_MODE,
        block_size=block_size,
    )


def _workspace_calls(args: Sequence[Any]) -> list[KernelCall]:
    """hw's workspace query (hw/workspace.py): FIA's arguments, the whole query, before the task group."""
    fia = _fia_arguments(*args[:7])
    return [] if fia is None else [KernelCall(FIA_MAX_WORKSPACE, fia)]


class _MaskSpec:
    """Stands for hw's causal mask (made once per device): rules read only its metadata."""

    shape = (FIA_MASK_SIZE, FIA_MASK_SIZE)
    dtype = torch.bool

    @staticmethod
    def is_contiguous() -> bool:
        return True


_MASK = _MaskSpec()


def _vector(values: Any, hidden: int) -> Any:
    """hw's per-channel vector (a per-tensor value expanded, made contiguous)."""
    if values is None:
        return None
    count = int(values.numel())
    return _spec(values, shape=(hidden if count in (1, hidden) else count,), contiguous=True)


def _norm_calls(op: str, args: Sequence[Any]) -> list[KernelCall]:
    if op == "rms_norm":
        x, weight, eps = args
        return [KernelCall(RMS_NORM, dict(input=x, gamma=_spec(weight, dtype=x.dtype), epsilon=eps))]
    if op == "add_rms_norm":
        x, residual, weight, eps = args
        return [KernelCall(ADD_RMS_NORM, dict(x1=x, x2=residual, gamma=_spec(weight, dtype=x.dtype), epsilon=eps))]
    if op == "dynamic_quant":
        (x,) = args
        return [KernelCall(DYNAMIC_QUANT, dict(input=x))]
    if op == "quantize":
        x, scale, offset = args
        hidden = int(x.shape[-1])
        return [KernelCall(QUANTIZE, dict(input=x, scales=_vector(scale, hidden),
                                          zero_points=_vector(offset, hidden),
                                          dtype=torch.qint8, axis=-1, div_mode=True))]
    if op == "add_rms_norm_dynamic_quant":
        x, residual, weight, eps = args
        return [KernelCall(ADD_RMS_NORM_DYNAMIC_QUANT, dict(x1=x, x2=residual, gamma=_spec(weight, dtype=x.dtype), epsilon=eps,
                                                            output_mask=[True, False]))]  # as hw/kernels.py
    if op == "add_rms_norm_quant":
        x, residual, weight, scale, offset, eps = args
        hidden = int(x.shape[-1])
        return [KernelCall(ADD_RMS_NORM_QUANT, dict(
            x1=x, x2=residual, gamma=_spec(weight, dtype=x.dtype), scales1=_vector(scale, hidden),
            zero_points1=_vector(offset, hidden), axis=-1, epsilon=eps))]
    return []


def _rope_calls(args: Sequence[Any]) -> list[KernelCall]:
    positions, q, k, cos_sin_cache, head_size, is_neox = args
    tokens, rot = int(q.shape[0]), int(cos_sin_cache.shape[-1])
    cache = cos_sin_cache if cos_sin_cache.dtype == q.dtype else _spec(cos_sin_cache, dtype=q.dtype)
    # hw hands the kernel contiguous [T, heads * rot] copies (the leading rot features of every head).
    q2, k2 = (_rotated(t, tokens, int(head_size), rot) for t in (q, k))
    return [KernelCall(ROTARY_EMBEDDING, dict(positions=positions, query=q2, key=k2, head_size=rot,
                                              cos_sin_cache=cache, is_neox=bool(is_neox)))]


def _rotated(t: Any, tokens: int, head_size: int, rot: int) -> Any:
    per_token = int(t.numel()) // tokens if tokens else 0
    if tokens == 0 or head_size <= 0 or per_token * tokens != int(t.numel()) or per_token % head_size:
        return t  # not [T, heads * head_size]: the layout rule names it
    return _spec(t, shape=(tokens, per_token // head_size * rot), contiguous=True)


# The SoC generations whose KV write is the ATB _npu_reshape_and_cache (vLLM Ascend's
# Ascend310PDeviceAdaptor); every other one, and an unknown SoC, writes with
# npu_scatter_pa_kv_cache (BaseDeviceAdaptor, vllm_ascend/device/device_op.py@182b75ea).
ATB_KV_WRITE_SOCS = ("310P",)


def kv_write_kernel(soc: Optional[str]) -> str:
    """The torch_npu kernel of the KV write on ``soc`` (None: not known), as vLLM Ascend picks it."""
    return RESHAPE_AND_CACHE if soc in ATB_KV_WRITE_SOCS else SCATTER_PA_KV_CACHE


def _reshape_and_cache_calls(args: Sequence[Any], kernel: str) -> list[KernelCall]:
    key, value, key_cache, value_cache, slot_mapping = args
    tokens = int(slot_mapping.numel())
    if kernel == RESHAPE_AND_CACHE:
        slots = _spec(slot_mapping, shape=(tokens,), dtype=torch.int32, contiguous=True)  # hw: reshape(-1), int32
        return [KernelCall(RESHAPE_AND_CACHE, dict(
            key=_reshaped(key, (tokens, *key_cache.shape[2:])), value=_reshaped(value, (tokens, *value_cache.shape[2:])),
            key_cache=key_cache, value_cache=value_cache, slot_indices=slots))]
    # hw: reshape(-1), int32/int64 kept (others cast to int32), .contiguous() on key, value, slots
    slot_dtype = slot_mapping.dtype if slot_mapping.dtype in SLOT_DTYPES else torch.int32
    slots = _spec(slot_mapping, shape=(tokens,), dtype=slot_dtype, contiguous=True)
    return [KernelCall(SCATTER_PA_KV_CACHE, dict(
        key=_reshaped(key, (tokens, *key_cache.shape[2:])), value=_reshaped(value, (tokens, *value_cache.shape[2:])),
        key_cache=key_cache, value_cache=value_cache, slot_mapping=slots, cache_mode="Norm"))]


def kernel_calls(
    op: str, args: Sequence[Any], *, in_graph: bool, soc: Optional[str] = None, kernel: Optional[str] = None
) -> list[KernelCall]:
    """The torch_npu calls (and our op's implied-rule level) of one ascendgraph op call.

    Mirrors hw/kernels.py's adapters; ops hw composes from others (split_qkv_rmsnorm_rope)
    or runs by formula (muls_add) have none of their own. ``soc`` (A2, A3, 310P, A5; None:
    not known) picks the KV write's kernel as vLLM Ascend does; ``kernel`` names it instead
    (a backend asking about one of several kernels).
    """
    if op == "paged_attention":
        return _paged_attention_calls(args, in_graph)
    if op == "attention_workspace":
        return _workspace_calls(args)
    if op == "reshape_and_cache":
        return _reshape_and_cache_calls(args, kernel or kv_write_kernel(soc))
    if op == "rotary_embedding":
        return _rope_calls(args)
    return _norm_calls(op, args)


def op_violations(
    op: str, args: Sequence[Any], *, in_graph: bool, lenient: frozenset[str] = frozenset(), soc: Optional[str] = None
) -> list[tuple[KernelCall, KernelRule]]:
    """Every (call, rule) an op call breaks; rules named in ``lenient`` are skipped."""
    return _broken(kernel_calls(op, args, in_graph=in_graph, soc=soc), lenient)


def _broken(calls: Sequence[KernelCall], lenient: frozenset[str]) -> list[tuple[KernelCall, KernelRule]]:
    return [(call, rule) for call in calls for rule in violations(call.kernel, call.arguments) if rule.name not in lenient]


_HOST_SCALARS = frozenset({int, float, bool, str, type(None), torch.dtype})

# The checked calls that broke no rule, by `call_metadata` (see the module docstring); emptied
# when it reaches `PASSED_LIMIT` entries. A pure function's results: what it keeps is the same
# for every caller (the rules are data that never changes while a process runs).
PASSED_LIMIT = 8192
_PASSED: set[tuple[Any, ...]] = set()


def call_metadata(args: Sequence[Any]) -> Optional[tuple[Any, ...]]:
    """Everything the contract rules can read of an op call's arguments, hashable: a tensor's
    type, shape, dtype and contiguity (never its values: kernel_contracts' rules read no
    more), a host scalar with its type (``1``, ``1.0`` and ``True`` are told apart), a list or
    tuple of ints item by item. None when an argument is anything else or a size is symbolic
    (no memo for that call)."""
    key: list[tuple[Any, ...]] = []
    for value in args:
        cls = type(value)
        if cls in _HOST_SCALARS:
            key.append((cls, value))
        elif isinstance(value, torch.Tensor):
            key.append((cls, tuple(value.shape), value.dtype, value.is_contiguous()))
        elif (cls is list or cls is tuple) and all(type(v) is int for v in value):
            key.append((cls, tuple(value)))
        else:
            return None
    metadata = tuple(key)
    try:
        hash(metadata)
    except TypeError:  # a symbolic size
        return None
    return metadata


def check_op(
    op: str, args: Sequence[Any], *, in_graph: bool, lenient: frozenset[str] = frozenset(), soc: Optional[str] = None
) -> None:
    """Raise KernelContractError if an ascendgraph op call breaks a contract of the kernels it
    becomes (a call whose `call_metadata` passed before passes at once)."""
    metadata = call_metadata(args)
    key = None if metadata is None else (op, in_graph, lenient, soc, metadata)
    if key is not None and key in _PASSED:
        return
    calls = kernel_calls(op, args, in_graph=in_graph, soc=soc)
    found = _broken(calls, lenient)
    if found:
        lines = [message(call.kernel, rule, call.arguments) for call, rule in found]
        raise KernelContractError(
            f"ascendgraph::{op} " + ("(in a graph) " if in_graph else "") + "breaks a kernel contract:\n" + "\n".join(lines),
            kernel=found[0][0].kernel,
            rules=tuple(rule.name for _, rule in found),
        )
    if key is not None and not any(call.kernel in VALUE_READING_KERNELS for call in calls):
        # (a kernel whose rules read values passes or fails by more than the metadata)
        if len(_PASSED) >= PASSED_LIMIT:
            _PASSED.clear()
        _PASSED.add(key)


def refusal(op: str, args: Sequence[Any], *, kernel: str, rules: Sequence[str], in_graph: bool) -> Optional[str]:
    """Why the table refuses an op call issued on ``kernel`` (None: it takes the call).

    The first broken rule among the op's own level (``ascendgraph::<op>``: what hw's mapping
    needs) and the rules of ``kernel`` named in ``rules`` (the ones the asking backend relies
    on), as `kernel_contracts.message` words it: the rule's name, the values and the source.
    """
    for call in kernel_calls(op, args, in_graph=in_graph, kernel=kernel):
        own_level = call.kernel.startswith("ascendgraph::")
        if not own_level and call.kernel != kernel:
            continue
        for rule in violations(call.kernel, call.arguments):
            if own_level or rule.name in rules:
                return message(call.kernel, rule, call.arguments)
    return None
