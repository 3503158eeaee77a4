"""The facade's norm, quantisation and ATB paged-attention kernels compute the op docs' formulas
for every argument they accept (torch-npu 2.13.0 ``torch_npu/_op_plugin_docs.py``).

Each reference below is the docs' formula in plain float64 torch: RmsNorm over gamma's dims
(:3447-3455), with the bias ``beta`` of the fused norms (:12204, :12305), ``npu_quantize``'s
divide and multiply modes (:11350-11352, axis :11377-11378), ``npu_dynamic_quant``'s smooth scales
per MoE group (:4660-4666, :4676, :4693), and ATB's decode attention (one token per request
over ``context_lens`` positions, vllm_ascend/attention/attention_v1.py@182b75ea:1265-1276).
Hypothesis draws shapes and values; more examples under ``-m slow``.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.facade import kernels as facade_kernels
from tests.sim.attention_reference import paged_attention_decode

facade_kernels.register()
F = torch.ops.npu_facade
pytestmark = pytest.mark.usefixtures("kernels_run_as_on_the_device")  # tests/sim/conftest.py
FAST = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _rms(x: torch.Tensor, gamma: torch.Tensor, eps: float, beta: Optional[torch.Tensor] = None) -> torch.Tensor:
    dims = tuple(range(-gamma.dim(), 0))
    xd = x.double()
    y = xd / torch.sqrt(xd.pow(2).mean(dim=dims, keepdim=True) + eps) * gamma.double()
    return y + beta.double() if beta is not None else y


def _int8(y: torch.Tensor) -> torch.Tensor:
    return torch.round(y).clamp(-128, 127)


@st.composite
def norm_case(draw: st.DrawFn) -> dict[str, Any]:
    dtype = draw(st.sampled_from((torch.bfloat16, torch.float16)))
    rows = draw(st.integers(1, 4))
    hidden = draw(st.sampled_from((8, 16, 32)))
    gamma_dims = draw(st.sampled_from((1, 2)))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x1 = torch.randn(rows, 3, hidden, generator=gen).to(dtype)
    gamma_shape = (hidden,) if gamma_dims == 1 else (3, hidden)
    return dict(
        x1=x1, x2=torch.randn(x1.shape, generator=gen).to(dtype),
        gamma=(torch.rand(gamma_shape, generator=gen) + 0.5).to(dtype),
        beta=(torch.randn(gamma_shape, generator=gen) / 4).to(dtype) if draw(st.booleans()) else None,
        scales=(torch.rand(gamma_shape, generator=gen) / 20 + 0.01),
        zero_points=torch.randint(-3, 4, gamma_shape, generator=gen, dtype=torch.int32) if draw(st.booleans()) else None,
        div_mode=draw(st.booleans()),
        epsilon=draw(st.sampled_from((1e-6, 1e-2))),
    )


def check_norms(case: dict[str, Any]) -> None:
    x1, x2, gamma, eps = case["x1"], case["x2"], case["gamma"], case["epsilon"]
    tolerance = dict(atol=3e-2, rtol=3e-2)
    y, rstd = F.npu_rms_norm(x1, gamma, epsilon=eps)
    torch.testing.assert_close(y.double(), _rms(x1, gamma, eps), **tolerance)
    assert rstd.shape == (*x1.shape[:-gamma.dim()], *([1] * gamma.dim()))
    y, _, x_sum = F.npu_add_rms_norm(x1, x2, gamma, epsilon=eps)
    torch.testing.assert_close(y.double(), _rms(x1 + x2, gamma, eps), **tolerance)
    assert torch.equal(x_sum, x1 + x2)
    if gamma.dim() == 1:  # the quantised norms normalise x's last dim (their gamma rules)
        scales, offsets, beta = case["scales"], case["zero_points"], case["beta"]
        y1, _, x_out = F.npu_add_rms_norm_quant(x1, x2, gamma, scales, offsets, beta, epsilon=eps,
                                                div_mode=case["div_mode"])
        normed = _rms(x1 + x2, gamma, eps, beta).to(x1.dtype).double()  # the norm's output in x's dtype
        scaled = normed / scales.double() if case["div_mode"] else normed * scales.double()
        expected = _int8(scaled + (offsets.double() if offsets is not None else 0))
        assert (y1.double() - expected).abs().max() <= 1  # one rounding step of the bf16 norm output
        assert torch.equal(x_out, x1 + x2)
        y1, _, _, scale1, _ = F.npu_add_rms_norm_dynamic_quant(x1, x2, gamma, beta=beta, epsilon=eps,
                                                                output_mask=[True, False])
        row_max = normed.abs().amax(dim=-1)
        torch.testing.assert_close(scale1.double(), row_max / 127, atol=1e-6, rtol=1e-5)


@st.composite
def dynamic_quant_case(draw: st.DrawFn) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    rows, hidden = draw(st.integers(1, 6)), draw(st.sampled_from((8, 16)))
    x = torch.randn(rows, hidden, generator=gen).to(torch.bfloat16)
    kind = draw(st.sampled_from(("none", "smooth", "grouped")))
    case: dict[str, Any] = dict(x=x, smooth=None, group_index=None)
    if kind == "smooth":
        case["smooth"] = (torch.rand(hidden, generator=gen) + 0.5).to(torch.bfloat16)
    elif kind == "grouped":
        groups = draw(st.integers(1, 3))
        cuts = sorted(draw(st.lists(st.integers(0, rows), min_size=groups - 1, max_size=groups - 1)))
        case["smooth"] = (torch.rand(groups, hidden, generator=gen) + 0.5).to(torch.bfloat16)
        case["group_index"] = torch.tensor([*cuts, rows], dtype=torch.int32)
    return case


def check_dynamic_quant(case: dict[str, Any]) -> None:
    x, smooth, group_index = case["x"], case["smooth"], case["group_index"]
    y, scale = F.npu_dynamic_quant(x, smooth_scales=smooth, group_index=group_index)
    xs = x.double()
    if smooth is not None:
        if group_index is None:
            xs = xs * smooth.double()
        else:
            start = 0
            for group, end in enumerate(group_index.tolist()):
                xs[start:end] = xs[start:end] * smooth[group].double()
                start = end
    expected_scale = xs.abs().amax(dim=-1) / 127
    torch.testing.assert_close(scale.double(), expected_scale, atol=1e-6, rtol=1e-5)
    expected = _int8(xs / expected_scale.clamp_min(1e-30).unsqueeze(-1))
    assert (y.double() - expected).abs().max() <= 1


@st.composite
def quantize_case(draw: st.DrawFn) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(draw(st.integers(1, 4)), 3, 8, generator=gen) * 4
    div_mode = draw(st.booleans())
    axis = draw(st.sampled_from((-1, -2))) if not div_mode else -1
    width = x.shape[axis]
    return dict(x=x, scales=torch.rand(width, generator=gen) + 0.2, div_mode=div_mode, axis=axis,
                zero_points=torch.randint(-4, 5, (width,), generator=gen, dtype=torch.int32) if div_mode else None)


def check_quantize(case: dict[str, Any]) -> None:
    x, scales, axis = case["x"], case["scales"], case["axis"]
    y = F.npu_quantize(x, scales, case["zero_points"], torch.qint8, axis=axis, div_mode=case["div_mode"])
    shape = [1] * x.dim()
    shape[axis] = scales.numel()
    s = scales.double().reshape(shape)
    scaled = x.double() / s if case["div_mode"] else x.double() * s
    if case["zero_points"] is not None:
        scaled = scaled + case["zero_points"].double().reshape(shape)
    assert torch.equal(y.double(), _int8(scaled))


@st.composite
def decode_case(draw: st.DrawFn) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    tokens, kv_heads = draw(st.integers(1, 4)), draw(st.sampled_from((1, 2)))
    heads, block_size = kv_heads * draw(st.sampled_from((1, 2))), 16
    blocks = 2 * tokens + 1
    return dict(
        query=torch.randn(tokens, heads, 16, generator=gen).to(torch.bfloat16),
        key_cache=torch.randn(blocks, block_size, kv_heads, 16, generator=gen).to(torch.bfloat16),
        value_cache=torch.randn(blocks, block_size, kv_heads, 16, generator=gen).to(torch.bfloat16),
        block_table=torch.randperm(blocks, generator=gen)[: 2 * tokens].view(tokens, 2).to(torch.int32),
        context_lens=draw(st.lists(st.integers(0, 2 * block_size), min_size=tokens, max_size=tokens)),
        num_kv_heads=kv_heads, num_heads=heads, scale=draw(st.sampled_from((1.0, 0.25))),
    )


def check_decode(case: dict[str, Any]) -> None:
    query = case["query"]
    out = torch.full_like(query, float("nan"))
    lens = torch.tensor(case["context_lens"], dtype=torch.int32)
    F._npu_paged_attention(query, case["key_cache"], case["value_cache"], case["num_kv_heads"], case["num_heads"],
                           case["scale"], case["block_table"], lens, out)
    expected = paged_attention_decode(query, case["key_cache"], case["value_cache"], case["block_table"],
                                      case["context_lens"], case["scale"])
    torch.testing.assert_close(out.float(), expected, atol=2e-2, rtol=2e-2)


CHECKS = [(norm_case, check_norms), (dynamic_quant_case, check_dynamic_quant), (quantize_case, check_quantize),
          (decode_case, check_decode)]


@pytest.mark.parametrize("strategy,check", CHECKS, ids=[check.__name__ for _, check in CHECKS])
def test_kernel_matches_its_op_docs_formula(strategy: Any, check: Any) -> None:
    FAST(given(strategy())(check))()


@pytest.mark.slow
@pytest.mark.parametrize("strategy,check", CHECKS, ids=[check.__name__ for _, check in CHECKS])
def test_kernel_matches_its_op_docs_formula_many_examples(strategy: Any, check: Any) -> None:
    SLOW(given(strategy())(check))()


def test_outputs_the_simulator_does_not_model_are_refused_not_approximated() -> None:
    x = torch.randn(2, 16).to(torch.bfloat16)
    with pytest.raises(NotImplementedError, match="int8 output only"):
        F.npu_dynamic_quant(x, dst_type=torch.quint4x2)
    with pytest.raises(NotImplementedError, match="quant_mode"):
        F.npu_dynamic_quant(x, quant_mode="pertensor")
    with pytest.raises(NotImplementedError, match="int8 output only"):
        F.npu_quantize(x.float(), torch.ones(16), None, torch.quint8, axis=-1)
    assert math.isfinite(float(F.npu_dynamic_quant(x)[1].sum()))
