"""Reference formulas the NPU backend falls back to when torch_npu lacks a fused kernel.

They follow the op contracts of ``ascendgraph/ops.py`` (the simulator's CPU kernels are
the numerical authority and ``tests/hw`` compares against them), with one extra rule that
the simulator does not need: no host synchronisation. A formula that reads a device value
on the host (``.item()``, ``bool(t)``, ``nonzero``) would break an ACL graph capture, so
padding slots, empty rows and request boundaries are handled with device-side selects and
the host lists the ops already carry.

Numerics: norms, rope and attention compute in float32 and return the input dtype.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor

from ascendgraph import reference as _reference

__all__ = [
    "rms_norm",
    "dynamic_quant",
    "quantize",
    "rotary_embedding",
    "muls_add",
    "reshape_and_cache",
    "paged_attention",
]

# The pure formulas are shared with the simulator's kernels (one definition); only the
# KV-cache write and the attention below are hardware-specific (no host synchronisation, so
# they can run inside a capture).
rms_norm = _reference.rms_norm
dynamic_quant = _reference.dynamic_quant
quantize = _reference.quantize
rotary_embedding = _reference.rotary_embedding
muls_add = _reference.muls_add


def reshape_and_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter tokens into the paged caches; slots < 0 (padding) leave the caches untouched.

    Without a host sync the padding rows cannot be dropped, so they are aimed at the slot
    of the first real token and carry that token's own row: duplicate writes of equal
    values. (All-padding batches rewrite slot 0 with its current contents.)
    """
    slots = slot_mapping.reshape(-1).long()
    tokens = slots.shape[0]
    if tokens == 0:
        return
    keep = slots >= 0
    first = torch.argmax(keep.to(torch.int32))  # first real token, 0 when there is none
    any_real = keep.any()
    target = torch.where(any_real, slots[first], torch.zeros_like(slots[first]))
    index = torch.where(keep, slots, target)
    for new, cache in ((key, key_cache), (value, value_cache)):
        flat = cache.view(-1, *cache.shape[2:])
        rows = new.reshape(tokens, *cache.shape[2:]).to(cache.dtype)
        filler = torch.where(any_real, rows[first], flat[target])
        mask = keep.view(-1, *([1] * (rows.dim() - 1)))
        flat.index_copy_(0, index, torch.where(mask, rows, filler.unsqueeze(0)))


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
    """Causal attention over the paged cache, one request at a time (host lists drive the loop).
    ``workspace`` / ``softmax_lse`` (the caller's buffers for the fused kernel) are not used."""
    ends, lens = list(actual_seq_lengths), list(seq_lens)
    if len(ends) != len(lens):
        raise ValueError(
            f"paged_attention: actual_seq_lengths has {len(ends)} entries but seq_lens has {len(lens)}; "
            "both need one entry per request"
        )
    heads, head_dim = query.shape[1], query.shape[2]
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = heads // kv_heads
    last = ends[-1] if ends else 0
    if last < out.shape[0]:
        out[last:].zero_()
    start = 0
    for request, (end, kv_len) in enumerate(zip(ends, lens)):
        q_len = end - start
        if q_len <= 0:
            start = end
            continue
        if kv_len <= 0:
            out[start:end].zero_()
            start = end
            continue
        blocks = block_table[request, : math.ceil(kv_len / block_size)].long()
        k = key_cache.index_select(0, blocks).reshape(-1, kv_heads, head_dim)[:kv_len].float()
        v = value_cache.index_select(0, blocks).reshape(-1, kv_heads, head_dim)[:kv_len].float()
        q = query[start:end].float().reshape(q_len, kv_heads, group, head_dim)
        scores = torch.einsum("qhgd,lhd->hgql", q, k) * scale
        # Query token i sees kv positions 0 .. kv_len - q_len + i.
        visible = torch.arange(kv_len, device=query.device).view(1, -1) <= (
            kv_len - q_len + torch.arange(q_len, device=query.device).view(-1, 1)
        )
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num_(0.0)
        result = torch.einsum("hgql,lhd->qhgd", probs, v).reshape(q_len, heads, head_dim)
        out[start:end].copy_(result.to(out.dtype))
        start = end
