"""Warm-ups on the simulator compute half-precision matmuls in float32 (sim/warmup.py).

What must hold: inside ``device.warmup_scope()`` every op still runs with the shapes and
dtypes it was issued with (the results are the operand dtype, close to the native ones),
the custom kernels still check their contracts and initialise lazily (a capture after a
scoped warm-up is accepted, one without is refused), and a dispatch mode below the scope
(the virtual clock's `EagerTracker`) sees the ops exactly as issued.
"""

from __future__ import annotations

import pytest
import torch

import sim
from ascendgraph.config import GraphConfig
from ascendgraph.errors import CaptureConstraintError
from ascendgraph.runtime.engine import Engine, EngineOptions
from sim.warmup import WarmupMode


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 64, generator=gen).to(dtype)
    w = torch.randn(32, 64, generator=gen).to(dtype)
    bias = torch.randn(32, generator=gen).to(dtype)
    return a, w, bias


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_products_are_computed_from_float32_copies(dtype):
    a, w, bias = _operands(dtype)
    device = sim.SimDevice()
    with device.warmup_scope() as mode:
        mm = torch.mm(a, w.t())
        addmm = torch.addmm(bias, a, w.t(), beta=0.5, alpha=2.0)
        bmm = torch.bmm(a.unsqueeze(0), w.t().unsqueeze(0))
    assert mode.upcast == 3
    assert (mm.dtype, addmm.dtype, bmm.dtype) == (dtype, dtype, dtype)
    assert torch.equal(mm, torch.mm(a.float(), w.float().t()).to(dtype))
    assert torch.equal(addmm, torch.addmm(bias.float(), a.float(), w.float().t(), beta=0.5, alpha=2.0).to(dtype))
    assert torch.equal(bmm, torch.bmm(a.float().unsqueeze(0), w.float().t().unsqueeze(0)).to(dtype))
    torch.testing.assert_close(mm, torch.mm(a, w.t()), rtol=2e-2, atol=2e-2)


def test_float32_meta_and_out_products_are_left_alone():
    a, w, _ = _operands(torch.float32)
    half, half_w, _ = _operands(torch.bfloat16)
    device = sim.SimDevice()
    out = torch.empty(16, 32, dtype=torch.bfloat16)
    with device.warmup_scope() as mode:
        torch.mm(a, w.t())
        torch.mm(half.to("meta"), half_w.to("meta").t())
        torch.mm(half, half_w.t(), out=out)
    assert mode.upcast == 0
    assert torch.equal(out, torch.mm(half, half_w.t()))


def test_a_mode_below_the_scope_sees_the_ops_as_issued():
    a, w, _ = _operands(torch.bfloat16)
    device = sim.SimDevice(record_kernels=True)
    with device.track_eager(), device.warmup_scope() as mode:
        result = torch.mm(a, w.t())
    assert mode.upcast == 0
    assert torch.equal(result, torch.mm(a, w.t()))
    (record,) = [r for r in device.kernel_records if "mm" in r.name]
    assert record.input_dtypes[0] == "bfloat16"


def _engine(device: sim.SimDevice, warmups: int) -> Engine:
    config = GraphConfig.from_vllm_args(
        num_layers=1, max_num_seqs=4, max_num_batched_tokens=16,
        compilation_config={"cudagraph_mode": "FULL", "cudagraph_capture_sizes": [2, 4],
                            "cudagraph_num_of_warmups": warmups})
    return Engine(config, EngineOptions(device=device, requests=1, progress=False, check_eager=False, dtype="bfloat16"))


def test_scoped_warm_ups_still_initialise_the_kernels_captures_need(monkeypatch):
    scopes: list[WarmupMode] = []
    device = sim.SimDevice()

    def counting_scope():
        mode = WarmupMode()
        scopes.append(mode)
        return mode

    monkeypatch.setattr(device, "warmup_scope", counting_scope)
    engine = _engine(device, warmups=1)
    try:
        engine.capture()
        assert engine.capture_state.graphs_captured == 2
    finally:
        engine.close()
    # compile's first forward at the largest size, then one warm-up per size
    assert len(scopes) == 1 + 2 and all(mode.upcast > 0 for mode in scopes)


def test_without_warm_ups_the_capture_is_still_refused():
    device = sim.SimDevice()
    engine = _engine(device, warmups=0)
    try:
        with pytest.raises(CaptureConstraintError):
            engine.capture()
    finally:
        engine.close()
