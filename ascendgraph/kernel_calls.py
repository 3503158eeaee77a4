"""How each ascendgraph op call becomes torch_npu kernel calls (hw/'s mapping, as data for checks).

Theory of operation. `kernel_calls(op, args, in_graph=...)` returns the `KernelCall`s an
op call becomes on an NPU: first the op's own implied-rule level
(``ascendgraph::paged_attention``, keyed by the op's argument names), then the torch_npu
kernel with its arguments keyed by torch_npu's keyword names, exactly as hw/kernels.py's
adapters build them. Eagerly hw gives attention only the real query tokens
(``query[:actual_seq_lengths[-1]]``, nothing at all for a batch without query tokens); in a
graph (capture or task update) it gives the whole captured query. `check_op` checks every
call against `ascendgraph.kernel_contracts` and raises KernelContractError.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import torch

from ascendgraph.errors import KernelContractError
from ascendgraph.kernel_contracts import (
    ADD_RMS_NORM,
    ADD_RMS_NORM_DYNAMIC_QUANT,
    ADD_RMS_NORM_QUANT,
    DYNAMIC_QUANT,
    FIA,
    FIA_MASK_SIZE,
    FIA_SPARSE_MODE,
    PAGED_ATTENTION_OP,
    QUANTIZE,
    RESHAPE_AND_CACHE,
    RMS_NORM,
    ROTARY_EMBEDDING,
    KernelRule,
    message,
    violations,
)

__all__ = ["KernelCall", "kernel_calls", "op_violations", "check_op", "CHECKED_OPS"]

# The ops whose calls map onto torch_npu kernels with contracts.
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
class KernelCall:
    """One torch_npu kernel an ascendgraph op call becomes, with its keyword arguments."""

    kernel: str
    arguments: Mapping[str, Any]


def _paged_attention_calls(args: Sequence[Any], in_graph: bool) -> list[KernelCall]:
    query, key_cache, value_cache, block_table, ends, seq_lens, scale, out = args[:8]  # then workspace, lse[:8]  # workspace, softmax_lse follow
    op_args = dict(query=query, key_cache=key_cache, value_cache=value_cache, block_table=block_table,
                   actual_seq_lengths=list(ends), seq_lens=list(seq_lens), scale=scale, out=out)
    calls = [KernelCall(PAGED_ATTENTION_OP, op_args)]
    last = int(ends[-1]) if len(ends) else 0
    if not in_graph:
        if last == 0:  # hw issues no kernel for a batch without query tokens
            return calls
        query = query[:last]
    if key_cache.dim() != 4 or query.dim() != 3:
        return calls  # the layout rule above already refuses it; no FIA view exists
    num_blocks, block_size, kv_heads, head_dim = (int(s) for s in key_cache.shape)
    fia = dict(
        query=query,
        key=key_cache.view(num_blocks, block_size, kv_heads * head_dim) if key_cache.is_contiguous() else key_cache,
        value=value_cache.view(num_blocks, block_size, kv_heads * head_dim) if value_cache.is_contiguous() else value_cache,
        atten_mask=_MASK,
        actual_seq_lengths=[int(v) for v in ends],
        actual_seq_lengths_kv=[int(v) for v in seq_lens],
        block_table=_cast(block_table, torch.int32),
        num_heads=int(query.shape[1]),
        scale=float(scale),
        input_layout="TND",
        num_key_value_heads=kv_heads,
        sparse_mode=FIA_SPARSE_MODE,
        block_size=block_size,
    )
    calls.append(KernelCall(FIA, fia))
    return calls


class _MaskSpec:
    """Stands for hw's causal mask (made once per device): rules read only its metadata."""

    shape = (FIA_MASK_SIZE, FIA_MASK_SIZE)
    dtype = torch.bool

    @staticmethod
    def is_contiguous() -> bool:
        return True


_MASK = _MaskSpec()
_META = torch.device("meta")


def _twin(value: Any, dtype: Any = None) -> Any:
    """A meta tensor with ``value``'s sizes, strides and dtype (or ``dtype``): what hw's adapter
    would hand the kernel after a ``.to(dtype)`` / ``.contiguous()``, without copying the data.

    The contract rules read only metadata (sizes, dtype, contiguity), and these arguments exist
    only to be checked; copying the real tensors was the largest single cost of recording a
    graph (a float32 -> bfloat16 copy of the whole cos/sin cache per rotary call)."""
    if value is None or not isinstance(value, torch.Tensor):
        return value
    if value.is_meta and (dtype is None or value.dtype == dtype):
        return value
    return torch.empty_strided(value.size(), value.stride(), dtype=dtype or value.dtype, device=_META)


def _cast(value: Any, dtype: Any) -> Any:
    """``value.to(dtype)`` as the kernel would see it: the tensor itself when already that dtype,
    else a meta twin (rules read metadata only)."""
    if value is None or value.dtype == dtype:
        return value
    return _twin(value, dtype)


def _vector(values: Any, hidden: int) -> Any:
    if values is None:
        return None
    values = _twin(values)
    return values.reshape(-1).expand(hidden) if values.numel() == 1 else values.reshape(hidden)


def _norm_calls(op: str, args: Sequence[Any]) -> list[KernelCall]:
    if op == "rms_norm":
        x, weight, eps = args
        return [KernelCall(RMS_NORM, dict(input=x, gamma=_cast(weight, x.dtype), epsilon=eps))]
    if op == "add_rms_norm":
        x, residual, weight, eps = args
        return [KernelCall(ADD_RMS_NORM, dict(x1=x, x2=residual, gamma=_cast(weight, x.dtype), epsilon=eps))]
    if op == "dynamic_quant":
        (x,) = args
        return [KernelCall(DYNAMIC_QUANT, dict(input=x))]
    if op == "quantize":
        x, scale, offset = args
        hidden = int(x.shape[-1])
        return [KernelCall(QUANTIZE, dict(input=x, scales=_vector(scale, hidden).contiguous(),
                                          zero_points=None if offset is None else _vector(offset, hidden).contiguous(),
                                          dtype=torch.qint8, axis=-1, div_mode=True))]
    if op == "add_rms_norm_dynamic_quant":
        x, residual, weight, eps = args
        return [KernelCall(ADD_RMS_NORM_DYNAMIC_QUANT, dict(x1=x, x2=residual, gamma=_cast(weight, x.dtype), epsilon=eps,
                                                            output_mask=[True, True]))]
    if op == "add_rms_norm_quant":
        x, residual, weight, scale, offset, eps = args
        hidden = int(x.shape[-1])
        return [KernelCall(ADD_RMS_NORM_QUANT, dict(
            x1=x, x2=residual, gamma=_cast(weight, x.dtype), scales1=_vector(scale, hidden).contiguous(),
            zero_points1=None if offset is None else _vector(offset, hidden).contiguous(), axis=-1, epsilon=eps))]
    return []


def _rope_calls(args: Sequence[Any]) -> list[KernelCall]:
    positions, q, k, cos_sin_cache, head_size, is_neox = args
    tokens, rot = int(q.shape[0]), int(cos_sin_cache.shape[-1])
    cache = _cast(cos_sin_cache, q.dtype)
    # hw hands the kernel contiguous [T, heads * rot] copies (the leading rot features of every
    # head); their metadata is all the rules read, so the copies are made on the meta device.
    q2 = _twin(q).reshape(tokens, -1, int(head_size))[..., :rot].reshape(tokens, -1).contiguous()
    k2 = _twin(k).reshape(tokens, -1, int(head_size))[..., :rot].reshape(tokens, -1).contiguous()
    return [KernelCall(ROTARY_EMBEDDING, dict(positions=positions, query=q2, key=k2, head_size=rot,
                                              cos_sin_cache=cache, is_neox=bool(is_neox)))]


def _reshape_and_cache_calls(args: Sequence[Any]) -> list[KernelCall]:
    key, value, key_cache, value_cache, slot_mapping = args
    tokens = int(slot_mapping.numel())
    slots = slot_mapping.reshape(-1)
    return [KernelCall(RESHAPE_AND_CACHE, dict(
        key=key.reshape(tokens, *key_cache.shape[2:]), value=value.reshape(tokens, *value_cache.shape[2:]),
        key_cache=key_cache, value_cache=value_cache,
        slot_indices=_cast(slots, torch.int32)))]


def kernel_calls(op: str, args: Sequence[Any], *, in_graph: bool) -> list[KernelCall]:
    """The torch_npu calls (and our op's implied-rule level) of one ascendgraph op call.

    Mirrors hw/kernels.py's adapters; ops hw composes from others (split_qkv_rmsnorm_rope)
    or runs by formula (muls_add) have none of their own.
    """
    if op == "paged_attention":
        return _paged_attention_calls(args, in_graph)
    if op == "reshape_and_cache":
        return _reshape_and_cache_calls(args)
    if op == "rotary_embedding":
        return _rope_calls(args)
    return _norm_calls(op, args)


def op_violations(
    op: str, args: Sequence[Any], *, in_graph: bool, lenient: frozenset[str] = frozenset()
) -> list[tuple[KernelCall, KernelRule]]:
    """Every (call, rule) an op call breaks; rules named in ``lenient`` are skipped."""
    found = []
    for call in kernel_calls(op, args, in_graph=in_graph):
        for rule in violations(call.kernel, call.arguments):
            if rule.name not in lenient:
                found.append((call, rule))
    return found


def check_op(op: str, args: Sequence[Any], *, in_graph: bool, lenient: frozenset[str] = frozenset()) -> None:
    """Raise KernelContractError if an ascendgraph op call breaks a contract of the kernels it becomes."""
    found = op_violations(op, args, in_graph=in_graph, lenient=lenient)
    if found:
        lines = [message(call.kernel, rule, call.arguments) for call, rule in found]
        raise KernelContractError(
            f"ascendgraph::{op} " + ("(in a graph) " if in_graph else "") + "breaks a kernel contract:\n" + "\n".join(lines),
            kernel=found[0][0].kernel,
            rules=tuple(rule.name for _, rule in found),
        )
