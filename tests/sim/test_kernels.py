"""The CPU reference kernels agree with plain-torch formulas (fp32 and bf16), trace, and
fused kernels are bit-identical to their unfused composition."""

from __future__ import annotations

import math

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import sim  # noqa: F401  (registers the CPU kernels)
from ascendgraph import ops
from sim import kernels as sim_kernels

A = torch.ops.ascendgraph
DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=gen(seed)).to(dtype)




@pytest.fixture(autouse=True)
def _formulas_only():
    """These tests check the reference formulas on any shape and dtype; the kernel
    contracts have their own tests (tests/unit/test_kernel_contracts.py, test_sim_contracts.py)."""
    with sim_kernels.unchecked():
        yield


# --------------------------------------------------------------------------- formulas


def rms_norm_formula(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.double()
    return (xf / torch.sqrt((xf * xf).mean(-1, keepdim=True) + eps) * w.double()).to(x.dtype)


def rope_formula(pos, x, cache, head_size, neox):
    t = x.shape[0]
    xh = x.double().reshape(t, -1, head_size)
    rot = cache.shape[1]
    cos, sin = cache.double()[pos.long()].chunk(2, dim=-1)
    out = xh.clone()
    for i in range(rot // 2):
        if neox:
            a, b = i, i + rot // 2
        else:
            a, b = 2 * i, 2 * i + 1
        c, s = cos[:, i : i + 1], sin[:, i : i + 1]
        out[:, :, a] = xh[:, :, a] * c - xh[:, :, b] * s
        out[:, :, b] = xh[:, :, b] * c + xh[:, :, a] * s
    return out.reshape(x.shape).to(x.dtype)


def attention_formula(q, kc, vc, table, ends, lens, scale):
    """One token at a time, straight from the definition."""
    t, h, d = q.shape
    bs, kvh = kc.shape[1], kc.shape[2]
    out = torch.zeros(t, h, d, dtype=torch.float64)
    start = 0
    for r, end in enumerate(ends):
        q_len = end - start
        for i in range(q_len):
            last = lens[r] - q_len + i
            for head in range(h):
                kv_head = head // (h // kvh)
                keys, values = [], []
                for pos in range(0, last + 1):
                    block = int(table[r, pos // bs])
                    keys.append(kc[block, pos % bs, kv_head].double())
                    values.append(vc[block, pos % bs, kv_head].double())
                if not keys:
                    continue
                scores = torch.stack(keys) @ q[start + i, head].double() * scale
                out[start + i, head] = torch.softmax(scores, 0) @ torch.stack(values)
        start = end
    return out


# --------------------------------------------------------------------------- tests


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_the_formula(dtype):
    x, w = randn(5, 64, dtype=dtype), randn(64, dtype=dtype, seed=1)
    torch.testing.assert_close(A.rms_norm(x, w, 1e-6), rms_norm_formula(x, w, 1e-6), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_returns_the_normalised_sum_and_the_sum(dtype):
    x, r, w = randn(3, 32, dtype=dtype), randn(3, 32, dtype=dtype, seed=1), randn(32, dtype=dtype, seed=2)
    y, s = A.add_rms_norm(x, r, w, 1e-5)
    torch.testing.assert_close(s, x + r)
    torch.testing.assert_close(y, rms_norm_formula(x + r, w, 1e-5), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
def test_dynamic_quant_is_per_token_symmetric_int8(dtype):
    x = randn(4, 16, dtype=dtype) * 3
    y, scale = A.dynamic_quant(x)
    assert y.dtype == torch.int8 and scale.dtype == torch.float32 and scale.shape == (4,)
    torch.testing.assert_close(scale, x.float().abs().amax(-1) / 127)
    torch.testing.assert_close(y.float() * scale[:, None], x.float(), atol=scale.max().item(), rtol=0)
    assert y.abs().max() == 127


def test_dynamic_quant_of_a_zero_row_is_zero():
    y, scale = A.dynamic_quant(torch.zeros(2, 8))
    assert not y.any() and not scale.any()


def test_quantize_rounds_offsets_and_clamps():
    x = torch.tensor([[0.26, -1.0, 100.0, -100.0]])
    y = A.quantize(x, torch.tensor([0.5]), torch.tensor([1.0]))
    assert y.tolist() == [[2, -1, 127, -128]]
    assert A.quantize(x, torch.tensor([0.5]), None).tolist() == [[1, -2, 127, -128]]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fused_norm_quant_ops_equal_their_composition_bit_for_bit(dtype):
    x, r, w = randn(3, 32, dtype=dtype), randn(3, 32, dtype=dtype, seed=1), randn(32, dtype=dtype, seed=2)
    y, s = A.add_rms_norm(x, r, w, 1e-6)
    q8, scale = A.dynamic_quant(y)
    fq8, fs, fscale = A.add_rms_norm_dynamic_quant(x, r, w, 1e-6)
    assert torch.equal(fq8, q8) and torch.equal(fs, s) and torch.equal(fscale, scale)
    static_scale, offset = torch.full((32,), 0.02), torch.zeros(32)
    sq8, ss = A.add_rms_norm_quant(x, r, w, static_scale, offset, 1e-6)
    assert torch.equal(sq8, A.quantize(y, static_scale, offset)) and torch.equal(ss, s)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rot", [16, 8])
def test_rotary_embedding_matches_the_formula(dtype, neox, rot):
    heads, kv_heads, hs, t = 4, 2, 16, 5
    pos = torch.tensor([0, 3, 7, 1, 9])
    cache = randn(12, rot, seed=3)
    q, k = randn(t, heads * hs, dtype=dtype), randn(t, kv_heads * hs, dtype=dtype, seed=1)
    qo, ko = A.rotary_embedding(pos, q, k, cache, hs, neox)
    torch.testing.assert_close(qo, rope_formula(pos, q, cache, hs, neox), **TOL[dtype])
    torch.testing.assert_close(ko, rope_formula(pos, k, cache, hs, neox), **TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens", [1, 4])
def test_split_qkv_rmsnorm_rope_equals_split_norm_rope(dtype, tokens):
    hd, heads, kvh = 16, 4, 2
    qs, kvs = heads * hd, kvh * hd
    qkv = randn(tokens, qs + 2 * kvs, dtype=dtype)
    qw, kw = randn(hd, dtype=dtype, seed=1), randn(hd, dtype=dtype, seed=2)
    pos, cache = torch.arange(tokens), randn(8, hd, seed=3)
    q, k, v = A.split_qkv_rmsnorm_rope(qkv, qw, kw, pos, cache, qs, kvs, hd, 1e-6, True)
    uq, uk, uv = qkv.split([qs, kvs, kvs], dim=-1)
    uq = A.rms_norm(uq.reshape(tokens, heads, hd), qw, 1e-6).reshape(tokens, qs)
    uk = A.rms_norm(uk.reshape(tokens, kvh, hd), kw, 1e-6).reshape(tokens, kvs)
    eq, ek = A.rotary_embedding(pos, uq, uk, cache, hd, True)
    assert torch.equal(q, eq) and torch.equal(k, ek) and torch.equal(v, uv)
    assert v.untyped_storage().data_ptr() != qkv.untyped_storage().data_ptr()


@pytest.mark.parametrize("dtype", DTYPES)
def test_muls_add_equals_mul_then_add(dtype):
    x, y = randn(3, 8, dtype=dtype), randn(3, 8, dtype=dtype, seed=1)
    assert torch.equal(A.muls_add(x, y, 0.3), x * 0.3 + y)


def test_reshape_and_cache_writes_slots_and_skips_padding():
    kc, vc = torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8)
    key, value = randn(3, 2, 8), randn(3, 2, 8, seed=1)
    A.reshape_and_cache(key, value, kc, vc, torch.tensor([5, -1, 11]))
    assert torch.equal(kc[1, 1], key[0]) and torch.equal(vc[2, 3], value[2])
    assert int((kc.abs().sum((-1, -2)) > 0).sum()) == 2


CASES = [
    # ends, seq_lens: decode batch; mixed prefill + decode; spec decode; padding; empty request
    ([1, 2, 3], [5, 9, 1]),
    ([4, 5, 6], [4, 12, 7]),
    ([3, 6], [10, 3]),
    ([1, 3], [2, 6]),
    ([2, 2, 3], [7, 0, 4]),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("ends,lens", CASES)
def test_paged_attention_matches_token_by_token_definition(dtype, ends, lens):
    heads, kvh, d, nb, bs = 4, 2, 8, 16, 4
    tokens = ends[-1] + 2  # two padding tokens
    q = randn(tokens, heads, d, dtype=dtype)
    kc, vc = randn(nb, bs, kvh, d, dtype=dtype, seed=1), randn(nb, bs, kvh, d, dtype=dtype, seed=2)
    table = torch.randperm(nb, generator=gen(4))[: len(lens) * 4].view(len(lens), 4).int()
    out = torch.full((tokens, heads, d), 7.0, dtype=dtype)
    scale = 1 / math.sqrt(d)
    A.paged_attention(q, kc, vc, table, ends, lens, scale, out)
    expected = attention_formula(q, kc, vc, table, ends, lens, scale)
    torch.testing.assert_close(out, expected.to(dtype), **TOL[dtype])
    assert not out[ends[-1] :].any()


def test_paged_attention_rejects_lengths_that_disagree():
    q, kc = torch.zeros(2, 2, 4), torch.zeros(2, 4, 1, 4)
    with pytest.raises(ValueError, match="one entry per request"):
        A.paged_attention(q, kc, kc, torch.zeros(2, 2, dtype=torch.int32), [1, 2], [1], 1.0, torch.empty(2, 2, 4))


def test_ops_trace_under_make_fx_with_host_lists_as_constants():
    def f(q, kc, vc, table, out):
        A.paged_attention(q, kc, vc, table, [1, 2], [3, 4], 0.5, out)
        return A.rms_norm(out, torch.ones(4), 1e-6)

    args = (torch.randn(2, 2, 4), torch.randn(4, 2, 1, 4), torch.randn(4, 2, 1, 4),
            torch.arange(4).view(2, 2).int(), torch.empty(2, 2, 4))
    gm = make_fx(f, tracing_mode="fake")(*args)
    assert "[1, 2], [3, 4]" in gm.code and "ascendgraph.rms_norm" in gm.code


def test_every_declared_op_has_a_kernel_and_a_fake():
    for name in ops.OP_NAMES:
        overload = ops.kernel_op(name)
        assert overload._schema.name == f"ascendgraph::{name}"
