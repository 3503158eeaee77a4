"""The ascendgraph ops on an NPU run torch_npu's fused kernels (no fallback for the
dtypes those kernels take) and agree with the simulator's reference kernels on CPU."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

import sim.kernels as ref
from ascendgraph import ops

pytestmark = pytest.mark.npu

BF16 = torch.bfloat16
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), BF16: dict(atol=3e-2, rtol=3e-2)}


def randn(*shape: int, dtype: torch.dtype = BF16, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def to(device: Any, value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device.torch_device)
    return value


def cases(dtype: torch.dtype) -> dict[str, tuple[tuple[Any, ...], Any]]:
    x, r, w = randn(4, 128, dtype=dtype), randn(4, 128, dtype=dtype, seed=1), randn(128, dtype=dtype, seed=2)
    scale = torch.full((128,), 0.02)
    offset = torch.tensor([(i % 5) - 2 for i in range(128)], dtype=torch.int32)
    pos, cache = torch.tensor([0, 3, 5, 9]), randn(16, 128, dtype=torch.float32, seed=3)
    q, k = randn(4, 4 * 128, dtype=dtype, seed=4), randn(4, 2 * 128, dtype=dtype, seed=5)
    return {
        "rms_norm": ((x, w, 1e-6), ref.rms_norm_ref(x, w, 1e-6)),
        "add_rms_norm": ((x, r, w, 1e-6), ref.add_rms_norm_ref(x, r, w, 1e-6)),
        "dynamic_quant": ((x,), ref.dynamic_quant_ref(x)),
        "quantize": ((x, scale, offset), ref.quantize_ref(x, scale, offset)),
        "add_rms_norm_dynamic_quant": ((x, r, w, 1e-6), ref.add_rms_norm_dynamic_quant_ref(x, r, w, 1e-6)),
        "add_rms_norm_quant": ((x, r, w, scale, offset, 1e-6), ref.add_rms_norm_quant_ref(x, r, w, scale, offset, 1e-6)),
        "rotary_embedding": ((pos, q, k, cache, 128, True), ref.rotary_embedding_ref(pos, q, k, cache, 128, True)),
    }


def same(actual: Any, expected: Any, dtype: torch.dtype) -> None:
    if isinstance(expected, tuple):
        for a, e in zip(actual, expected):
            same(a, e, dtype)
        return
    actual = actual.cpu()
    if expected.dtype == torch.int8:
        assert (actual.int() - expected.int()).abs().max() <= 1
    else:
        torch.testing.assert_close(actual, expected.to(actual.dtype), **TOL[dtype])


@pytest.mark.parametrize("op", sorted(cases(BF16)))
def test_bf16_ops_run_torch_npu_kernels_and_match_the_reference(npu_device: Any, op: str) -> None:
    args, expected = cases(BF16)[op]
    result = getattr(ops, op)(*[to(npu_device, a) for a in args])
    same(result, expected, BF16)
    assert op not in npu_device.router.fallbacks, npu_device.router.fallbacks.get(op)


def test_reshape_and_cache_and_fia_paged_attention_match_the_reference(npu_device: Any) -> None:
    heads, kvh, d, nb, bs = 8, 2, 128, 16, 128
    ends, lens = [1, 2, 5], [200, 1, 130]
    tokens = ends[-1]
    kc, vc = randn(nb, bs, kvh, d, seed=1), randn(nb, bs, kvh, d, seed=2)
    key, value = randn(tokens, kvh, d, seed=6), randn(tokens, kvh, d, seed=7)
    slots = torch.tensor([5, 130, 300, -1, 7])
    ref.reshape_and_cache_ref(key, value, kc, vc, slots)
    dkc, dvc = to(npu_device, randn(nb, bs, kvh, d, seed=1)), to(npu_device, randn(nb, bs, kvh, d, seed=2))
    ops.reshape_and_cache(to(npu_device, key), to(npu_device, value), dkc, dvc, to(npu_device, slots))
    torch.testing.assert_close(dkc.cpu(), kc)
    table = torch.arange(12, dtype=torch.int32).view(3, 4)  # one row per request (FIA's block_table rule)
    q = randn(tokens, heads, d, seed=8)
    expected = torch.zeros(tokens, heads, d, dtype=BF16)
    ref.paged_attention_ref(q, kc, vc, table, ends, lens, 1 / math.sqrt(d), expected)
    out = torch.zeros(tokens, heads, d, dtype=BF16, device=npu_device.torch_device)
    ops.paged_attention(to(npu_device, q), dkc, dvc, to(npu_device, table), ends, lens, 1 / math.sqrt(d), out)
    torch.testing.assert_close(out.cpu(), expected, **TOL[BF16])
    assert not {"paged_attention", "reshape_and_cache"} & set(npu_device.router.fallbacks)


def test_float32_attention_inside_a_task_group_is_refused_with_the_fix(npu_device: Any) -> None:
    from ascendgraph.errors import KernelContractError

    q = torch.zeros(1, 2, 16, device=npu_device.torch_device)
    cache = torch.zeros(2, 128, 1, 16, device=npu_device.torch_device)
    table = torch.zeros(1, 2, dtype=torch.int32, device=npu_device.torch_device)
    graph = npu_device.new_graph()
    with pytest.raises(KernelContractError, match="--dtype bfloat16") as info:
        with npu_device.graph(graph):
            stream = npu_device.current_stream()
            npu_device.task_group_begin(stream)
            ops.paged_attention(q, cache, cache, table, [1], [3], 0.25, torch.empty_like(q))
    assert "query_dtype" in info.value.rules


def test_attention_fallback_for_a_missing_kernel_is_refused_inside_a_task_group(
    npu_device: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch_npu without the fused attention (an older wheel) falls back to the reference
    formula eagerly, but a FULL graph could not update it: refused with what to do."""
    import sys

    from ascendgraph.errors import CaptureConstraintError

    monkeypatch.delattr(sys.modules["torch_npu"], "npu_fused_infer_attention_score")
    monkeypatch.setattr(npu_device.router.npu, "_cache", {})  # resolve the torch_npu attributes afresh
    q = torch.zeros(3, 2, 16, dtype=torch.bfloat16, device=npu_device.torch_device)
    cache = torch.zeros(2, 128, 1, 16, dtype=torch.bfloat16, device=npu_device.torch_device)
    table = torch.zeros(1, 2, dtype=torch.int32, device=npu_device.torch_device)
    ops.paged_attention(q, cache, cache, table, [3], [3], 0.25, torch.empty_like(q))
    assert "paged_attention" in npu_device.router.fallbacks
    graph = npu_device.new_graph()
    with pytest.raises(CaptureConstraintError, match="PIECEWISE"):
        with npu_device.graph(graph):
            stream = npu_device.current_stream()
            npu_device.task_group_begin(stream)
            ops.paged_attention(q, cache, cache, table, [3], [3], 0.25, torch.empty_like(q))
    assert not npu_device.is_current_stream_capturing()
