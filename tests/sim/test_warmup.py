"""Warm-ups on the simulator mark kernels at their shapes instead of computing (sim/warmup.py).

What must hold: inside ``device.warmup_scope()`` every kernel is launched through the same
dispatch with outputs of the sizes, strides and dtypes an eager launch gives, but nothing
computes; the custom kernels still check their contracts and initialise lazily exactly for
the shapes launched (a capture after a warm-up is accepted, a capture of a shape never warmed
up is refused); writes into tensors from before the warm-up (input buffers, KV caches) and
factories run for real; a dispatch mode below the scope (the virtual clock's `EagerTracker`)
sees the ops exactly as issued; and an engine run's report is the same with shape-only
warm-ups as with computed ones.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import sim
from ascendgraph import ops as A
from ascendgraph.config import GraphConfig
from ascendgraph.errors import CaptureConstraintError, KernelContractError
from ascendgraph.runtime.engine import Engine, EngineOptions
from sim.warmup import WarmupMode

_CALLS = {"count": 0}


@torch.library.custom_op("ascendgraph_warmup_test::counted", mutates_args=())
def counted(x: torch.Tensor) -> torch.Tensor:
    _CALLS["count"] += 1
    return x * 2


@counted.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _operands(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(16, 64, generator=gen).to(dtype)
    w = torch.randn(32, 64, generator=gen).to(dtype)
    bias = torch.randn(32, generator=gen).to(dtype)
    return a, w, bias


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_kernels_get_eager_shaped_outputs_without_computing(dtype):
    a, w, bias = _operands(dtype)
    device = sim.SimDevice()
    before = _CALLS["count"]
    with device.warmup_scope() as mode:
        mm = torch.mm(a, w.t())
        addmm = torch.addmm(bias, a, w.t(), beta=0.5, alpha=2.0)
        bmm = torch.bmm(a.unsqueeze(0), w.t().unsqueeze(0))
        doubled = counted(a)
    assert _CALLS["count"] == before  # the kernel never ran
    eager = (torch.mm(a, w.t()), torch.addmm(bias, a, w.t()), torch.bmm(a.unsqueeze(0), w.t().unsqueeze(0)), counted(a))
    for shaped, computed in zip((mm, addmm, bmm, doubled), eager):
        assert (shaped.shape, shaped.stride(), shaped.dtype) == (computed.shape, computed.stride(), computed.dtype)
    assert mode.shape_only == 4 and mode.executed == 0


def test_in_place_kernels_on_warm_up_tensors_are_skipped_writes_into_older_tensors_run():
    a, w, _ = _operands(torch.float32)
    buffer = torch.zeros(4, dtype=torch.long)
    older = torch.ones(16, 32)
    with sim.SimDevice().warmup_scope() as mode:
        buffer[:3].copy_(torch.tensor([5, 6, 7]))  # an input buffer written during the warm-up
        product = torch.mm(a, w.t())
        product.add_(1.0)  # into a warm-up tensor: skipped
        older.add_(1.0)  # into a tensor from before: runs
        ones = torch.ones(3)  # a factory: runs
    assert buffer.tolist() == [5, 6, 7, 0]
    assert torch.equal(older, torch.full((16, 32), 2.0))
    assert torch.equal(ones, torch.ones(3))
    assert (mode.shape_only, mode.skipped, mode.executed) == (1, 1, 3)


def test_a_mode_below_the_scope_sees_the_ops_as_issued():
    a, w, _ = _operands(torch.bfloat16)
    device = sim.SimDevice(record_kernels=True)
    with device.track_eager(), device.warmup_scope() as mode:
        result = torch.mm(a, w.t())
    assert mode.shape_only == 0
    assert torch.equal(result, torch.mm(a, w.t()))
    (record,) = [r for r in device.kernel_records if "mm" in r.name]
    assert record.input_dtypes[0] == "bfloat16"


def test_checked_kernels_are_contract_checked_and_marked_for_exactly_the_shapes_launched():
    device = sim.SimDevice()
    weight = torch.ones(64, dtype=torch.bfloat16)
    x, flat = torch.randn(2, 64).to(torch.bfloat16), torch.randn(64).to(torch.bfloat16)
    with device.warmup_scope() as mode:
        A.rms_norm(x, weight, 1e-6)
        with pytest.raises(KernelContractError, match="npu_rms_norm"):
            A.rms_norm(flat, weight, 1e-6)  # 1 dim: the kernel takes 2-8
    assert mode.marked == 1 and mode.executed == 0  # the refused launch marks nothing
    assert ("rms_norm", (2, 64), torch.bfloat16) in device.contracts.initialised

    def capture(tokens: int) -> None:
        x = torch.randn(tokens, 64).to(torch.bfloat16)
        graph = device.new_graph()
        stream = device.new_stream()
        with device.stream(stream), device.graph(graph):
            A.rms_norm(x, weight, 1e-6)

    capture(2)  # warmed up at this shape
    with pytest.raises(CaptureConstraintError, match="lazy initialisation during capture"):
        capture(4)  # never warmed up at this shape


def test_a_kernel_call_repeated_at_the_same_signature_is_checked_once_per_warm_up(monkeypatch):
    """The layers of a forward issue the same kernels at the same shapes: the contract check and
    the marking run once per call signature (sizes, strides, dtypes, host values) and warm-up;
    a call that differs in any of them is checked again, and every launch is still counted."""
    from sim import kernels

    checked: list[tuple] = []
    real = kernels.on_eager_launch

    def counting(func, args, kwargs):
        checked.append(tuple(args[0].shape))
        return real(func, args, kwargs)

    monkeypatch.setattr(kernels, "on_eager_launch", counting)
    device = sim.SimDevice()
    weight = torch.ones(64, dtype=torch.bfloat16)
    x, y = torch.randn(2, 64).to(torch.bfloat16), torch.randn(4, 64).to(torch.bfloat16)
    with device.warmup_scope() as mode:
        for _ in range(4):  # four layers
            A.rms_norm(x, weight, 1e-6)
        A.rms_norm(x, weight, 1e-5)  # another host value
        A.rms_norm(y, weight, 1e-6)  # another shape
        with pytest.raises(KernelContractError, match="npu_rms_norm"):
            A.rms_norm(torch.randn(64).to(torch.bfloat16), weight, 1e-6)
    assert checked[:3] == [(2, 64), (2, 64), (4, 64)] and set(checked[3:]) == {(64,)}  # a refusal is never remembered
    assert mode.marked == 6
    assert {("rms_norm", (2, 64), torch.bfloat16), ("rms_norm", (4, 64), torch.bfloat16)} <= device.contracts.initialised
    before = len(checked)
    with device.warmup_scope():  # a new warm-up checks again
        A.rms_norm(x, weight, 1e-6)
    assert checked[before:] == [(2, 64)]


def _engine(device: sim.SimDevice, warmups: int, mode: str = "FULL", layers: int = 1) -> Engine:
    config = GraphConfig.from_vllm_args(
        num_layers=layers, max_num_seqs=4, max_num_batched_tokens=16,
        compilation_config={"cudagraph_mode": mode, "cudagraph_capture_sizes": [2, 4],
                            "cudagraph_num_of_warmups": warmups})
    return Engine(config, EngineOptions(device=device, requests=1, progress=False, check_eager=False, dtype="bfloat16"))


def test_shape_only_warm_ups_still_initialise_the_kernels_captures_need(monkeypatch):
    scopes: list[WarmupMode] = []
    device = sim.SimDevice()

    def counting_scope():
        mode = WarmupMode(device)
        scopes.append(mode)
        return mode

    monkeypatch.setattr(device, "warmup_scope", counting_scope)
    engine = _engine(device, warmups=1)
    try:
        engine.capture()
        assert engine.capture_state.graphs_captured == 2
    finally:
        engine.close()
    # compile's first forward at the largest size, then one warm-up per size; each marks
    # kernels and computes none of the model's matrix products
    assert len(scopes) == 1 + 2
    assert all(mode.marked > 0 and mode.shape_only > 0 for mode in scopes)


def test_without_warm_ups_the_capture_is_still_refused():
    device = sim.SimDevice()
    engine = _engine(device, warmups=0)
    try:
        with pytest.raises(CaptureConstraintError, match="lazy initialisation during capture"):
            engine.capture()
    finally:
        engine.close()


def _report(warmups_compute: bool, tmp_path, monkeypatch) -> dict:
    from ascendgraph.runtime.engine import run

    device = sim.SimDevice()
    if warmups_compute:
        monkeypatch.setattr(device, "warmup_scope", contextlib.nullcontext)
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path / ("computed" if warmups_compute else "shaped")))
    config = GraphConfig.from_vllm_args(
        num_layers=2, max_num_seqs=4, max_num_batched_tokens=32,
        compilation_config={"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8]})
    document = run(config, device=device, requests=3, seed=0, progress=False, dtype="bfloat16").to_json()
    for timing in ("capture_seconds", "compile_seconds"):
        document.pop(timing)
    return document


def test_a_run_reports_the_same_with_shape_only_warm_ups_as_with_computed_ones(tmp_path, monkeypatch):
    shaped = _report(False, tmp_path, monkeypatch)
    computed = _report(True, tmp_path, monkeypatch)
    assert shaped["graphs_captured"] > 0 and shaped["steps"] > 0
    assert shaped == computed
