"""hw's fallback kernels against independent oracles (issue 18): plain formulas written
here and torch's own ops (`scaled_dot_product_attention`), never ascendgraph.reference or
the simulator's kernels, which the fallbacks share code with."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from hw.api import TorchNpu
from hw.kernels import KERNEL_ROUTES, KernelRouter


def _router() -> KernelRouter:
    return KernelRouter(TorchNpu(SimpleNamespace()), capturing=lambda: False)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_rms_norm_and_add_rms_norm_follow_the_formula():
    x, r, w = _randn(3, 32), _randn(3, 32, seed=1), _randn(32, seed=2)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(_router().call("rms_norm", x, w, 1e-6), expected, atol=1e-5, rtol=1e-5)
    y, x_sum = _router().call("add_rms_norm", x, r, w, 1e-6)
    s = x + r
    torch.testing.assert_close(x_sum, s)
    torch.testing.assert_close(y, s / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6) * w, atol=1e-5, rtol=1e-5)


def test_muls_add_is_x_times_scale_plus_y():
    x, y = _randn(4, 8), _randn(4, 8, seed=1)
    torch.testing.assert_close(_router().call("muls_add", x, y, 0.5), x * 0.5 + y)


@pytest.mark.parametrize("ends, lens", [([1, 2, 3], [5, 9, 1]), ([4, 5, 6], [4, 12, 7]), ([3, 6], [10, 3])])
def test_paged_attention_matches_torch_scaled_dot_product_attention(ends, lens):
    heads, kv_heads, dim, blocks, block_size = 4, 2, 8, 16, 4
    tokens = ends[-1]
    q = _randn(tokens, heads, dim)
    key_cache, value_cache = _randn(blocks, block_size, kv_heads, dim, seed=1), _randn(blocks, block_size, kv_heads, dim, seed=2)
    table = torch.randperm(blocks, generator=torch.Generator().manual_seed(4))[: len(lens) * 4].view(len(lens), 4).int()
    out = torch.zeros(tokens, heads, dim)
    scale = 1 / math.sqrt(dim)
    # The fallback formula itself, in float32 at a tiny block size: the router's contract pre-check
    # would refuse both (the card's kernel takes fp16/bf16 and 16-aligned blocks), and this test is
    # about the formula, not the contracts (tests/hw/test_hw_kernels.py covers the refusals).
    KERNEL_ROUTES["paged_attention"].fallback(_router(), q, key_cache, value_cache, table, list(ends), list(lens),
                                              scale, out)

    start = 0
    for request, (end, kv_len) in enumerate(zip(ends, lens)):
        q_len = end - start
        slots = [int(table[request, p // block_size]) * block_size + p % block_size for p in range(kv_len)]
        k = key_cache.view(-1, kv_heads, dim)[slots].repeat_interleave(heads // kv_heads, dim=1)  # GQA
        v = value_cache.view(-1, kv_heads, dim)[slots].repeat_interleave(heads // kv_heads, dim=1)
        # query i of the request sees keys 0 .. kv_len - q_len + i (causal, bottom-right aligned)
        visible = torch.arange(kv_len)[None, :] <= (kv_len - q_len + torch.arange(q_len))[:, None]
        expected = F.scaled_dot_product_attention(q[start:end].transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                                  attn_mask=visible, scale=scale).transpose(0, 1)
        torch.testing.assert_close(out[start:end], expected, atol=1e-5, rtol=1e-5)
        start = end
