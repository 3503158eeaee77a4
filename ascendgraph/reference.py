"""Reference formulas of the ascendgraph ops (plain torch, no device specifics).

The simulator's CPU kernels are these formulas, and the torch_npu backend falls back to
them where a fused NPU kernel is missing: one definition, so the two can never disagree.
Fused ops are literally the composition of the unfused ones. The KV-cache write and the
paged attention are not here: each backend implements them for its own constraints (the
simulator drives them from the host lists; on hardware they must not synchronise with the
host inside a capture).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

__all__ = [
    "INT8_MIN",
    "INT8_MAX",
    "rms_norm",
    "add_rms_norm",
    "dynamic_quant",
    "quantize",
    "add_rms_norm_dynamic_quant",
    "add_rms_norm_quant",
    "rope",
    "rotary_embedding",
    "split_qkv_rmsnorm_rope",
    "muls_add",
]

INT8_MIN, INT8_MAX = -128, 127


# --------------------------------------------------------------------------- norms


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    xf = x.float()
    variance = xf.pow(2).mean(dim=-1, keepdim=True)
    return (xf * torch.rsqrt(variance + eps) * weight.float()).to(x.dtype)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    x_sum = x + residual
    return rms_norm(x_sum, weight, eps), x_sum


# --------------------------------------------------------------------------- quantisation


def dynamic_quant(x: Tensor) -> tuple[Tensor, Tensor]:
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / INT8_MAX
    safe = torch.where(scale == 0, torch.ones_like(scale), scale)
    y = torch.round(xf / safe.unsqueeze(-1)).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)
    return y, scale


def quantize(x: Tensor, scale: Tensor, offset: Optional[Tensor]) -> Tensor:
    y = x.float() / scale.float()
    if offset is not None:
        y = y + offset.float()
    return torch.round(y).clamp_(INT8_MIN, INT8_MAX).to(torch.int8)


def add_rms_norm_dynamic_quant(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float
) -> tuple[Tensor, Tensor, Tensor]:
    y, x_sum = add_rms_norm(x, residual, weight, eps)
    y_int8, scale = dynamic_quant(y)
    return y_int8, x_sum, scale


def add_rms_norm_quant(
    x: Tensor, residual: Tensor, weight: Tensor, scale: Tensor, offset: Optional[Tensor], eps: float
) -> tuple[Tensor, Tensor]:
    y, x_sum = add_rms_norm(x, residual, weight, eps)
    return quantize(y, scale, offset), x_sum


# --------------------------------------------------------------------------- rope


def rope(x: Tensor, cos: Tensor, sin: Tensor, head_size: int, is_neox: bool) -> Tensor:
    """x [T, heads * head_size] (or [T, heads, head_size]); cos/sin [T, rot / 2] float32."""
    shape = x.shape
    heads = x.reshape(shape[0], -1, head_size)
    rot = cos.shape[-1] * 2
    xf = heads[..., :rot].float()
    c, s = cos.unsqueeze(1), sin.unsqueeze(1)
    if is_neox:
        x1, x2 = xf[..., : rot // 2], xf[..., rot // 2 :]
        rotated = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    else:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        rotated = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1).flatten(-2)
    if rot < head_size:
        rotated = torch.cat((rotated.to(x.dtype), heads[..., rot:]), dim=-1)
    return rotated.to(x.dtype).reshape(shape)


def rotary_embedding(
    positions: Tensor, q: Tensor, k: Tensor, cos_sin_cache: Tensor, head_size: int, is_neox: bool
) -> tuple[Tensor, Tensor]:
    cos_sin = cos_sin_cache.index_select(0, positions.reshape(-1).long()).float()
    cos, sin = cos_sin.chunk(2, dim=-1)
    return rope(q, cos, sin, head_size, is_neox), rope(k, cos, sin, head_size, is_neox)


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
    tokens = qkv.shape[0]
    q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
    q = rms_norm(q.reshape(tokens, -1, head_dim), q_weight, eps).reshape(tokens, q_size)
    k = rms_norm(k.reshape(tokens, -1, head_dim), k_weight, eps).reshape(tokens, kv_size)
    q, k = rotary_embedding(positions, q, k, cos_sin_cache, head_dim, is_neox)
    return q, k, v.clone(memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------- elementwise


def muls_add(x: Tensor, y: Tensor, scale: float) -> Tensor:
    return x * scale + y
