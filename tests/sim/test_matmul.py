"""Half-precision matmuls on the simulator are computed widened to float64 and rounded once
(sim/matmul.py), on both paths the simulator computes: tracked eager ops and graph replays.

What must hold: the widened result is the float64 product rounded to the input dtype, within
one unit in the last place of torch's own bfloat16 kernel; a row's result does not depend on
how many rows the batch has (a padded replay and the unpadded eager reference agree
bit for bit); eager under ``track_eager`` and a replay compute the same; anything that is not
a half-precision matmul of the table (float32, mixed dtypes, other ops) runs as issued.
"""

from __future__ import annotations

import pytest
import torch

import sim
from sim.matmul import WIDENED_MATMULS, widened_call, widened_matmul, widens

aten = torch.ops.aten


def _operands(rows: int, dtype: torch.dtype = torch.bfloat16, inner: int = 512) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(1)
    a = torch.randn(rows, inner, generator=gen).to(dtype)
    w = torch.randn(1536, inner, generator=gen).to(dtype)
    bias = torch.randn(1536, generator=gen).to(dtype)
    return a, w, bias


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_half_matmul_is_the_float64_product_rounded_once(dtype):
    a, w, bias = _operands(8, dtype)
    out = widened_matmul(aten.mm.default, (a, w.t()), {})
    assert out.dtype == dtype and out.shape == (8, 1536)
    assert torch.equal(out, (a.double() @ w.double().t()).to(dtype))
    added = widened_matmul(aten.addmm.default, (bias, a, w.t()), {"beta": 0.5, "alpha": 2.0})
    assert torch.equal(added, torch.addmm(bias.double(), a.double(), w.double().t(), beta=0.5, alpha=2.0).to(dtype))
    native = torch.mm(a, w.t())
    ulp = torch.finfo(dtype).eps * native.float().abs().clamp(min=1.0)
    assert ((out.float() - native.float()).abs() <= ulp).all(), "within one ulp of torch's own kernel"


def test_an_out_overload_writes_into_its_output():
    a, w, _ = _operands(4)
    target = torch.full((4, 1536), float("nan"), dtype=torch.bfloat16)
    returned = widened_matmul(aten.mm.out, (a, w.t()), {"out": target})
    assert returned is target and torch.equal(target, widened_matmul(aten.mm.default, (a, w.t()), {}))
    batched = widened_matmul(aten.bmm.default, (a.unsqueeze(0), w.t().unsqueeze(0)), {})
    assert torch.equal(batched[0], target)


def test_a_row_does_not_depend_on_how_many_rows_the_batch_has():
    # A padded graph batch and the unpadded eager reference must agree bit for bit where they
    # compute the same rows (a float32 BLAS does not: 1-3 rows take another kernel).
    a, w, _ = _operands(64)
    padded = widened_matmul(aten.mm.default, (a, w.t()), {})
    for rows in (1, 2, 3, 5, 8, 17):
        assert torch.equal(widened_matmul(aten.mm.default, (a[:rows], w.t()), {}), padded[:rows]), rows


def test_only_half_precision_matmuls_of_the_table_are_widened():
    a, w, _ = _operands(4)
    assert widens(aten.mm.default, (a, w.t()), {})
    assert not widens(aten.mm.default, (a.float(), w.float().t()), {}), "float32 runs as issued"
    assert not widens(aten.mm.default, (a, w.half().t()), {}), "mixed dtypes run as issued"
    assert not widens(aten.add.Tensor, (a, a), {}), "not a matmul"
    assert widened_call(aten.mm.default, (a.float(), w.float().t()), {}) is None
    assert set(WIDENED_MATMULS.values()) <= set(WIDENED_MATMULS)


def test_tracked_eager_and_a_graph_replay_compute_the_same_widened_product():
    device = sim.SimDevice()
    a, w, _ = _operands(8, inner=2048)  # sizes where torch's bfloat16 kernel rounds a few elements otherwise
    static_a = a.clone()
    graph = device.new_graph()
    with device.graph(graph):
        replayed = torch.nn.functional.linear(static_a, w)
    static_a.copy_(a)
    graph.replay()
    device.synchronize()
    with device.track_eager():
        eager = torch.nn.functional.linear(a[:3], w)
    expected = (a.double() @ w.double().t()).bfloat16()
    assert torch.equal(replayed, expected)
    assert torch.equal(eager, expected[:3])
    untracked = torch.nn.functional.linear(a, w)  # outside the simulator: torch's own kernel
    assert not torch.equal(untracked, expected), "the sizes must tell the two kernels apart"
