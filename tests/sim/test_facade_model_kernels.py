"""The facade's model-layer kernels (sim.facade.model_kernels): npu_swiglu and npu_mrope in rope
mode against formulas written here from the op docs, and their contract refusals."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ascendgraph.errors import KernelContractError

BF16 = torch.bfloat16


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def test_swiglu_is_silu_of_the_first_half_times_the_second(torch_npu: Any) -> None:
    # _op_plugin_docs.py:4398: swiglu(x, dim) = A * sigmoid(A) * B, A and B the halves along dim.
    x = randn(3, 5, 8, seed=1)
    out = torch_npu.npu_swiglu(x)
    a, b = x.float()[..., :4], x.float()[..., 4:]
    assert out.dtype == BF16 and out.shape == (3, 5, 4)
    assert torch.equal(out, (a * torch.sigmoid(a) * b).to(BF16))
    out0 = torch_npu.npu_swiglu(randn(4, 3, seed=2), dim=0)
    assert out0.shape == (2, 3)


def rotate_neox(x: torch.Tensor, positions: torch.Tensor, cache: torch.Tensor, head_size: int) -> torch.Tensor:
    """GPT-NeoX rotate-half on the first rotary_dim of each head (what 'half' mode means)."""
    tokens = x.shape[0]
    heads = x.float().reshape(tokens, -1, head_size)
    rot = cache.shape[-1]
    cos, sin = cache.float()[positions].chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1)[:, None, :], torch.cat((sin, sin), -1)[:, None, :]
    part = heads[..., :rot]
    halves = torch.cat((-part[..., rot // 2:], part[..., :rot // 2]), dim=-1)
    rotated = part * cos + halves * sin
    return torch.cat((rotated.to(x.dtype), heads[..., rot:].to(x.dtype)), dim=-1).reshape(x.shape)


@pytest.mark.parametrize("rotary_dim", [128, 64])
def test_mrope_in_rope_mode_rotates_each_heads_first_rotary_dims(torch_npu: Any, rotary_dim: int) -> None:
    positions = torch.tensor([0, 7, 3, 15])
    query, key = randn(4, 8 * 128, seed=3), randn(4, 2 * 128, seed=4)
    cache = randn(16, rotary_dim, seed=5)
    q_out, k_out = torch_npu.npu_mrope(positions, query, key, cache, 128, mrope_section=[0, 0, 0],
                                       rotary_mode="half", cache_mode="default")
    assert q_out.data_ptr() != query.data_ptr()  # new tensors, the inputs untouched
    torch.testing.assert_close(q_out, rotate_neox(query, positions, cache, 128), atol=1e-2, rtol=0)
    torch.testing.assert_close(k_out, rotate_neox(key, positions, cache, 128), atol=1e-2, rtol=0)


def test_mrope_refuses_what_its_op_doc_refuses_and_says_mrope_mode_is_not_modelled(torch_npu: Any) -> None:
    query, key = randn(3, 4 * 64), randn(3, 2 * 64)
    with pytest.raises(KernelContractError, match="mrope_rotary_dim_multiple"):
        torch_npu.npu_mrope(torch.arange(3), query, key, randn(16, 48), 64)
    with pytest.raises(KernelContractError, match="mrope_2d"):
        torch_npu.npu_mrope(torch.arange(3), query.reshape(3, 4, 64), key, randn(16, 64), 64)
    with pytest.raises(NotImplementedError, match="rope mode only"):
        torch_npu.npu_mrope(torch.arange(3).repeat(3, 1), query, key, randn(16, 64), 64, mrope_section=[8, 12, 12])


def test_swiglu_refuses_an_odd_split(torch_npu: Any) -> None:
    with pytest.raises(KernelContractError, match="swiglu_even_split"):
        torch_npu.npu_swiglu(randn(3, 7))


def test_a_kernel_traced_with_a_dynamic_token_count_keeps_it_dynamic(torch_npu: Any) -> None:
    # vLLM marks the token dimension dynamic when it compiles a model; the contract check of a
    # facade kernel inside the trace must not turn it into a constant (int() on a SymInt), or
    # Dynamo refuses the marked dimension (ConstraintViolationError).
    def norm(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
        return torch_npu.npu_rms_norm(x, gamma)[0] + torch_npu.npu_swiglu(torch.cat((x, x), -1))

    compiled = torch.compile(norm, backend="eager", fullgraph=True)
    gamma = randn(16, seed=7)
    for tokens in (5, 3):
        x = randn(tokens, 16, seed=tokens)
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.equal(compiled(x, gamma), norm(x, gamma))


def test_the_model_kernels_refuse_host_tensors_and_run_on_npu_tensors() -> None:
    # torch_npu registers its kernels for the npu device only (as sim.facade.kernels).
    from sim import facade

    facade.install(quiet=True)
    facade.configure()
    try:
        import torch_npu

        with pytest.raises(NotImplementedError, match=r"Could not run 'npu::npu_swiglu' with arguments from the "
                                                      r"'CPU' backend"):
            torch_npu.npu_swiglu(randn(2, 8))
        x = randn(2, 8, seed=3)
        out = torch_npu.npu_swiglu(x.to("npu"))
        a, b = x.float()[:, :4], x.float()[:, 4:]
        assert out.device.type == "npu" and torch.equal(out.cpu(), (a * torch.sigmoid(a) * b).to(BF16))
    finally:
        facade.uninstall()
