"""Decoder building blocks, written *unfused* on purpose.

The model code is what the eager reference runs and what Dynamo traces, so it uses the
plain forms the npugraph_ex passes look for: a residual ``add`` followed by ``rms_norm``
(-> add_rms_norm), per-head q/k ``rms_norm`` then ``rotary_embedding`` after a qkv split
(-> split_qkv_rmsnorm_rope), and so on. Kernels are the ``ascendgraph`` custom ops
(`ascendgraph.ops`), which each device backend implements.

Shapes: activations are [num_tokens, ...] (no batch dimension; requests are packed, TND).
Every module is shape-static given num_tokens, so a forward can be captured in a graph
(no data-dependent shapes: the MoE block computes every expert and masks by the routing
weights).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ascendgraph.models.attention import AttentionImpl, attention_op

__all__ = [
    "RMSNorm",
    "RotaryEmbedding",
    "Attention",
    "GatedMLP",
    "DenseMoE",
    "make_linear",
    "QUANTIZATION_METHODS",
    "W8A8Linear",
    "TP_GROUP",
    "tp_all_reduce",
]

# Linear-layer variants `make_linear` can build (vLLM Ascend's W8A8 quant types, simplified):
#   None            a plain projection in the model dtype
#   "w8a8_dynamic"  int8 weights (per output channel scale); activations quantised per token
#                   at run time by ``dynamic_quant`` (W8A8_DYNAMIC)
#   "w8a8"          int8 weights; activations quantised by ``quantize`` with a static scale (W8A8)
# The activation quant right after a norm is what the norm+quant fusions match.
QUANTIZATION_METHODS: tuple[Optional[str], ...] = (None, "w8a8", "w8a8_dynamic")
W8A8_STATIC_INPUT_SCALE = 4.0 / 127  # calibrated for the normed activations of the seeded models (|x| <~ 4)


# The tensor-parallel communication group's name in the collective ops the model issues.
TP_GROUP = "tp"


def tp_all_reduce(x: Tensor, tensor_parallel_size: int) -> Tensor:
    """The all-reduce that ends a row-parallel projection (vLLM's RowParallelLinear with
    reduce_results, VocabParallelEmbedding) when tp > 1; nothing at all on one rank.

    Issued as the ``ascendgraph::all_reduce`` op, so graph captures hold it and a device
    can charge what it costs (identity values: this process is one rank)."""
    if tensor_parallel_size <= 1:
        return x
    return torch.ops.ascendgraph.all_reduce(x, TP_GROUP, tensor_parallel_size)


def make_linear(in_features: int, out_features: int, *, quantization: Optional[str] = None) -> nn.Module:
    """A bias-free projection: ``nn.Linear``, or a `W8A8Linear` for a quantization method."""
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(
            f"quantization {quantization!r} is not available; supported: "
            f"{', '.join(str(q) for q in QUANTIZATION_METHODS)}"
        )
    if quantization is None:
        return nn.Linear(in_features, out_features, bias=False)
    return W8A8Linear(in_features, out_features, dynamic=quantization == "w8a8_dynamic")


class W8A8Linear(nn.Module):
    """A W8A8-like projection: int8 activations times int8 weights, dequantised after the matmul.

    ``weight`` holds integer values in [-127, 127] (in the model dtype: exact for int8
    values) once `quantize_weights_` snapped the initialised float weights to the grid;
    ``weight_scale`` is per output channel. Activations are quantised per token
    (``dynamic_quant``, W8A8_DYNAMIC) or with a static scale of the input's width
    (``quantize``, W8A8 — one value repeated, so dequantisation is one product per output
    channel, ``deq_scale``).
    """

    weight_scale: Tensor  # buffers (register_buffer), declared for the type checker
    input_scale: Tensor
    deq_scale: Tensor

    def __init__(self, in_features: int, out_features: int, *, dynamic: bool) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.dynamic = dynamic
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32))
        if not dynamic:
            self.register_buffer("input_scale", torch.full((in_features,), W8A8_STATIC_INPUT_SCALE))
            self.register_buffer("deq_scale", torch.ones(out_features, dtype=torch.float32))

    @torch.no_grad()
    def quantize_weights_(self) -> None:
        """Snap ``weight`` to int8 values with a per-channel scale (after initialisation)."""
        weight = self.weight.float()
        scale = weight.abs().amax(dim=1).clamp_min(1e-8) / 127.0
        self.weight.copy_(torch.round(weight / scale.unsqueeze(1)).clamp_(-127, 127).to(self.weight.dtype))
        self.weight_scale.copy_(scale)
        if not self.dynamic:
            self.deq_scale.copy_(scale * self.input_scale.float()[0])

    def forward(self, x: Tensor) -> Tensor:
        if self.dynamic:
            x_int8, x_scale = torch.ops.ascendgraph.dynamic_quant(x)
            acc = F.linear(x_int8.to(self.weight.dtype), self.weight)
            out = acc * (x_scale.unsqueeze(-1) * self.weight_scale)
        else:
            x_int8 = torch.ops.ascendgraph.quantize(x, self.input_scale, None)
            acc = F.linear(x_int8.to(self.weight.dtype), self.weight)
            out = acc * self.deq_scale
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        kind = "dynamic" if self.dynamic else "static"
        return f"in_features={self.in_features}, out_features={self.out_features}, activations={kind}"


class RMSNorm(nn.Module):
    """y = x / rms(x) * weight, via the ``rms_norm`` kernel (the unfused form)."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.ascendgraph.rms_norm(x, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with a precomputed cos/sin cache (``rotary_embedding`` kernel)."""

    def __init__(
        self, head_size: int, rotary_dim: int, max_positions: int, base: float, *, is_neox: bool = True
    ) -> None:
        super().__init__()
        self.head_size = head_size
        self.is_neox = is_neox
        if torch.get_default_device().type == "meta":
            # A meta model (a size estimate, `plan`) has shapes only; computing the cache there
            # would run torch._refs' Python kernels, whose first call imports torch._dynamo.
            cache = torch.empty(max_positions, 2 * len(range(0, rotary_dim, 2)), dtype=torch.float32)
        else:
            inv_freq = 1.0 / (base ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
            angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
            cache = torch.cat((angles.cos(), angles.sin()), dim=-1).to(torch.float32)
        self.register_buffer("cos_sin_cache", cache, persistent=False)

    def forward(self, positions: Tensor, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        q, k = torch.ops.ascendgraph.rotary_embedding(
            positions, query, key, self.cos_sin_cache, self.head_size, self.is_neox
        )
        return q, k


class Attention(nn.Module):
    """The attention of one layer: allocates ``out`` and calls the attention op.

    ``impl`` (the backend) and ``scale`` are read by the op from the forward context's
    ``attention_layers``; the KV cache lives outside the module (per engine path), so
    the graph model and its eager reference share weights but not caches.
    """

    def __init__(
        self,
        layer_name: str,
        *,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        scale: float,
        impl: AttentionImpl,
    ) -> None:
        super().__init__()
        self.layer_name = layer_name
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = scale
        self.impl = impl

    def forward(self, query: Tensor, key: Tensor, value: Tensor) -> Tensor:
        out = torch.empty_like(query)
        attention_op(query, key, value, out, self.layer_name)
        return out


class GatedMLP(nn.Module):
    """SwiGLU MLP: down(silu(gate(x)) * up(x)) with a merged gate/up projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, quantization: Optional[str] = None) -> None:
        super().__init__()
        self.intermediate_size = intermediate_size
        self.gate_up_proj = make_linear(hidden_size, 2 * intermediate_size, quantization=quantization)
        self.down_proj = make_linear(intermediate_size, hidden_size, quantization=quantization)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up_proj(x).split([self.intermediate_size, self.intermediate_size], dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DenseMoE(nn.Module):
    """Top-k routed experts computed densely (every expert, masked by the routing weights).

    Dense computation keeps shapes static (capturable); the routing, top-k and the
    renormalised weights are those of a Qwen3-MoE block.
    """

    def __init__(self, hidden_size: int, expert_size: int, num_experts: int, top_k: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        self.top_k = top_k
        self.expert_size = expert_size
        self.router = nn.Linear(hidden_size, num_experts, bias=False)
        scale = 1.0 / math.sqrt(hidden_size)
        self.w13 = nn.Parameter(torch.empty(num_experts, 2 * expert_size, hidden_size).uniform_(-scale, scale))
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden_size, expert_size).uniform_(-scale, scale))

    def forward(self, x: Tensor) -> Tensor:
        probs = torch.softmax(self.router(x).float(), dim=-1)
        top_weights, top_ids = torch.topk(probs, self.top_k, dim=-1)
        top_weights = top_weights / top_weights.sum(dim=-1, keepdim=True)
        weights = torch.zeros_like(probs).scatter(1, top_ids, top_weights).to(x.dtype)  # [T, E]
        hidden = torch.einsum("th,eih->eti", x, self.w13)
        gate, up = hidden.split([self.expert_size, self.expert_size], dim=-1)
        expert_out = torch.einsum("eti,ehi->eth", F.silu(gate) * up, self.w2)
        return torch.einsum("eth,te->th", expert_out, weights)
