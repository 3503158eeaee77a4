"""CPU reference kernels for the ``ascendgraph`` custom ops (registered for the CPU key).

Numerics: norms, rope and attention compute in float32 and cast the result back to the
input dtype; a fused kernel is written as the composition of the unfused ones, so a
fusion pass that replaces ``add`` + ``rms_norm`` by ``add_rms_norm`` (and so on) changes
no bit of the result. Attention is vectorised over the requests that share a query
length (one group for a pure decode batch), so a batch costs a handful of torch calls
rather than a Python loop over tokens.

`register_cpu_kernels()` is idempotent; importing the ``sim`` package calls it.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ascendgraph import ops
from ascendgraph import reference as _reference

__all__ = [
    "register_cpu_kernels",
    "rms_norm_ref",
    "add_rms_norm_ref",
    "dynamic_quant_ref",
    "quantize_ref",
    "rotary_embedding_ref",
    "split_qkv_rmsnorm_rope_ref",
    "muls_add_ref",
    "reshape_and_cache_ref",
    "paged_attention_ref",
    "attention_workspace_ref",
]

# The formulas live in ascendgraph.reference (shared with hw/'s fallbacks); the simulator's
# CPU kernels are exactly these.
rms_norm_ref = _reference.rms_norm
add_rms_norm_ref = _reference.add_rms_norm
dynamic_quant_ref = _reference.dynamic_quant
quantize_ref = _reference.quantize
add_rms_norm_dynamic_quant_ref = _reference.add_rms_norm_dynamic_quant
add_rms_norm_quant_ref = _reference.add_rms_norm_quant
rotary_embedding_ref = _reference.rotary_embedding
split_qkv_rmsnorm_rope_ref = _reference.split_qkv_rmsnorm_rope
muls_add_ref = _reference.muls_add


# --------------------------------------------------------------------------- KV cache


def reshape_and_cache_ref(
    key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor
) -> None:
    slots = slot_mapping.reshape(-1).long()
    tokens = slots.shape[0]
    keep = slots >= 0
    flat_k = key_cache.view(-1, *key_cache.shape[2:])
    flat_v = value_cache.view(-1, *value_cache.shape[2:])
    k = key.reshape(tokens, *key_cache.shape[2:])
    v = value.reshape(tokens, *value_cache.shape[2:])
    if bool(keep.all()):
        flat_k.index_copy_(0, slots, k)
        flat_v.index_copy_(0, slots, v)
    else:
        index = keep.nonzero().squeeze(1)
        flat_k.index_copy_(0, slots[index], k[index])
        flat_v.index_copy_(0, slots[index], v[index])


# --------------------------------------------------------------------------- attention


def _check_attention_args(
    query: Tensor, key_cache: Tensor, block_table: Tensor, ends: list[int], seq_lens: list[int]
) -> None:
    if len(ends) != len(seq_lens):
        raise ValueError(
            f"paged_attention: actual_seq_lengths has {len(ends)} entries but seq_lens has "
            f"{len(seq_lens)}; both need one entry per request"
        )
    previous = 0
    for end in ends:
        if end < previous:
            raise ValueError(
                f"paged_attention: actual_seq_lengths must be cumulative (non-decreasing) end "
                f"offsets, got {list(ends)}"
            )
        previous = end
    if previous > query.shape[0]:
        raise ValueError(
            f"paged_attention: actual_seq_lengths ends at {previous} but query has "
            f"{query.shape[0]} tokens"
        )
    if query.shape[1] % key_cache.shape[2]:
        raise ValueError(
            f"paged_attention: {query.shape[1]} query heads are not a multiple of "
            f"{key_cache.shape[2]} kv heads"
        )
    if len(seq_lens) > block_table.shape[0]:
        raise ValueError(
            f"paged_attention: {len(seq_lens)} requests but block_table has "
            f"{block_table.shape[0]} rows"
        )
    if seq_lens:
        capacity = block_table.shape[1] * key_cache.shape[1]
        longest = max(seq_lens)
        if longest > capacity:
            raise ValueError(
                f"paged_attention: a seq_len of {longest} needs more than the {block_table.shape[1]} "
                f"blocks of {key_cache.shape[1]} slots the block table holds"
            )


def _attend_group(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    requests: list[int],
    starts: list[int],
    q_len: int,
    seq_lens: list[int],
    scale: float,
    out: Tensor,
) -> None:
    """Requests sharing one query length, batched with the KV padded to the longest."""
    device = query.device
    group = len(requests)
    heads, head_dim = query.shape[1], query.shape[2]
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    per_kv = heads // kv_heads
    kv_lens = torch.tensor([seq_lens[r] for r in requests], device=device)
    longest = max(seq_lens[r] for r in requests)
    blocks = math.ceil(longest / block_size)

    tokens = (torch.tensor(starts, device=device).unsqueeze(1) + torch.arange(q_len, device=device)).reshape(-1)
    rows = torch.tensor(requests, device=device)
    table = block_table.index_select(0, rows)[:, :blocks].long().clamp_(0, key_cache.shape[0] - 1)
    k = key_cache[table].reshape(group, blocks * block_size, kv_heads, head_dim).float()
    v = value_cache[table].reshape(group, blocks * block_size, kv_heads, head_dim).float()

    q = query.index_select(0, tokens).float().reshape(group, q_len, kv_heads, per_kv, head_dim)
    scores = torch.einsum("rqhgd,rlhd->rhgql", q, k) * scale
    # Query token i of a request sees kv positions 0 .. kv_len - q_len + i.
    last_visible = kv_lens.view(group, 1) - q_len + torch.arange(q_len, device=device).view(1, q_len)
    positions = torch.arange(blocks * block_size, device=device)
    visible = positions.view(1, 1, -1) <= last_visible.unsqueeze(-1)  # [group, q_len, L]
    visible = visible.view(group, 1, 1, q_len, -1)
    scores = scores.masked_fill(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.where(visible.any(dim=-1, keepdim=True), probs, torch.zeros_like(probs))
    result = torch.einsum("rhgql,rlhd->rqhgd", probs, v).reshape(group * q_len, heads, head_dim)
    out.index_copy_(0, tokens, result.to(out.dtype))


def paged_attention_ref(
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
    # workspace / softmax_lse: the caller's buffers (see ops.paged_attention); the CPU
    # reference needs no scratch and does not produce the log-sum-exp.
    ends = list(actual_seq_lengths)
    lens = list(seq_lens)
    _check_attention_args(query, key_cache, block_table, ends, lens)
    end = ends[-1] if ends else 0
    if end < out.shape[0]:
        out[end:].zero_()
    groups: dict[int, tuple[list[int], list[int]]] = {}
    start = 0
    for request, stop in enumerate(ends):
        q_len = stop - start
        if q_len > 0:
            if lens[request] <= 0:
                out[start:stop].zero_()
            else:
                members, starts = groups.setdefault(q_len, ([], []))
                members.append(request)
                starts.append(start)
        start = stop
    for q_len, (members, starts) in groups.items():
        _attend_group(query, key_cache, value_cache, block_table, members, starts, q_len, lens, scale, out)


def attention_workspace_ref(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    actual_seq_lengths: list[int],
    seq_lens: list[int],
    scale: float,
) -> Tensor:
    """A fresh buffer of the size the op's fake implementation declares (no kernel runs)."""
    rows = query.shape[0] * query.shape[1]
    return torch.empty(rows * ops.ATTENTION_WORKSPACE_BYTES_PER_ROW, dtype=torch.uint8, device=query.device)


# --------------------------------------------------------------------------- registration

_KERNELS = {
    "rms_norm": rms_norm_ref,
    "add_rms_norm": add_rms_norm_ref,
    "dynamic_quant": dynamic_quant_ref,
    "quantize": quantize_ref,
    "add_rms_norm_dynamic_quant": add_rms_norm_dynamic_quant_ref,
    "add_rms_norm_quant": add_rms_norm_quant_ref,
    "rotary_embedding": rotary_embedding_ref,
    "split_qkv_rmsnorm_rope": split_qkv_rmsnorm_rope_ref,
    "muls_add": muls_add_ref,
    "reshape_and_cache": reshape_and_cache_ref,
    "paged_attention": paged_attention_ref,
    "attention_workspace": attention_workspace_ref,
}


def register_cpu_kernels() -> None:
    """Register the reference kernels for the CPU dispatch key (idempotent)."""
    for name, kernel in _KERNELS.items():
        getattr(ops, name).register_kernel("cpu")(kernel)
