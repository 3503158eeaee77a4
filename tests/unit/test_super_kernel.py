"""Super kernel: runs of static kernels of a captured graph merged into one launch."""

from __future__ import annotations

import logging

import pytest
import torch

import sim  # noqa: F401
from ascendgraph.compile.static_kernel import CACHE_DIR_ENV
from ascendgraph.compile.super_kernel import SUPER_KERNEL_LOG, SUPER_KERNEL_OPTIONS
from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions
from ascendgraph.errors import CaptureConstraintError
from ascendgraph.runtime.workload import WorkloadSpec
from sim.cost import task_signature
from sim.device import SimDevice

ag = torch.ops.ascendgraph


def _block(x, w, r):
    y = ag.rms_norm(x + r, w, 1e-6)  # add, rms_norm
    z = torch.mm(y, w.unsqueeze(1).expand(-1, 8).contiguous())  # expand is a view; contiguous copies, mm
    return torch.relu(z) * 2.0  # relu, mul


def _capture(device: SimDevice, fn, *args):
    _block(*args)  # a warm-up of the kernels: a first launch of a shape may not happen inside a capture
    graph = device.new_graph()
    with device.graph(graph):
        out = fn(*args)
    return graph, out


def _tasks(graph) -> list:
    return [t for seg in graph.program.segments for t in seg.tasks]


def _kernels(graph) -> list:
    return [k for seg in graph.program.segments for k in seg.kernels]


@pytest.fixture()
def static_device():
    """A sim device with static kernels installed for every launch of `_block` at 4 tokens."""
    device = SimDevice()
    args = (torch.randn(4, 16), torch.ones(16), torch.randn(4, 16))
    probe, _ = _capture(device, _block, *args)
    device.install_static_kernels({task_signature(t): f"k{i}" for i, t in enumerate(_tasks(probe))})
    return device, args


def test_super_kernel_merges_a_run_of_static_kernels_into_one_launch_with_the_same_results(static_device):
    device, args = static_device
    graph, out = _capture(device, _block, *args)
    tasks = _tasks(graph)
    assert all(t.op_type.endswith("_static_kernel") for t in tasks)
    before_time, before_kernels = graph.device_time_us(), graph.program.num_kernels
    assert device.super_kernel_optimize(graph, optimize_options=dict(SUPER_KERNEL_OPTIONS)) == 1
    (merged,) = _kernels(graph)
    assert merged.op_type == "SuperKernel" and merged.parts == tuple(t.name for t in tasks)
    assert merged.block_dim == max(t.block_dim for t in tasks)
    assert graph.program.num_kernels == 1 < before_kernels and graph.device_time_us() < before_time
    device.set_record_kernels(True)
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, _block(*args), rtol=0, atol=0)
    assert [r.name for r in device.kernel_records] == [merged.name], "one kernel record per replay"


def test_kernels_without_a_static_build_are_not_merged():
    device = SimDevice()
    graph, _ = _capture(device, _block, torch.randn(4, 16), torch.ones(16), torch.randn(4, 16))
    kernels = graph.program.num_kernels
    assert device.super_kernel_optimize(graph) == 0
    assert graph.program.num_kernels == kernels


def test_an_event_wait_ends_a_super_kernel_run(static_device):
    device, (x, w, r) = static_device

    def with_wait(x, w, r):
        y = ag.rms_norm(x + r, w, 1e-6)
        event.wait()
        event.reset()
        return torch.relu(torch.mm(y, w.unsqueeze(1).expand(-1, 8).contiguous())) * 2.0

    event = device.new_external_event()
    graph, _ = _capture(device, with_wait, x, w, r)
    assert device.super_kernel_optimize(graph) == 2, "one run before the wait, one after"


def test_super_kernel_optimize_checks_its_options_and_the_graph_state(static_device):
    device, args = static_device
    graph, _ = _capture(device, _block, *args)
    with pytest.raises(ValueError, match=r"^Invalid optimize_options param key: 'no_such_option'\.$"):
        device.super_kernel_optimize(graph, optimize_options={"no_such_option": 1})
    with pytest.raises(TypeError, match=r"^optimize_options param must be dict or None\.$"):
        device.super_kernel_optimize(graph, optimize_options=[1])
    with pytest.raises(CaptureConstraintError, match="needs a captured graph"):
        device.super_kernel_optimize(device.new_graph())


# --------------------------------------------------------------------------- through the engine


def _engine(super_kernel: bool, mode: str = "FULL_DECODE_ONLY", profile: str = "A3") -> Engine:
    acc = {"enable_static_kernel": True, "enable_super_kernel": super_kernel} if mode != "PIECEWISE" else {}
    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": mode, "cudagraph_capture_sizes": [1, 2, 4]},
        additional_config={"ascend_compilation_config": acc} if acc else None,
        num_layers=2, max_num_seqs=4, max_num_batched_tokens=16,
    )
    workload = WorkloadSpec(num_requests=2, seed=0, prompt_words=(3, 5), output_tokens=(2, 3))
    # A3: CANN's super-kernel API exists on Atlas A3 only (the default A2 profile turns it off, below)
    return Engine(config, EngineOptions(device="sim", sim_profile=profile, workload_spec=workload, num_threads=1))


def test_the_default_a2_profile_turns_super_kernel_off_as_a_card_does(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="ascendgraph"):
        with _engine(super_kernel=True, profile="A2") as engine:
            assert engine.resolution.static_kernel and not engine.resolution.super_kernel
            assert engine.super_kernel is None
    assert "Super kernel is not supported on Atlas A2 (CANN's super-kernel API is Atlas A3 only). Disabling it." \
        in caplog.text


def test_the_engine_optimises_every_full_graph_and_logs_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    caplog.set_level(logging.INFO, logger="ascendgraph.compile.super_kernel")
    with _engine(super_kernel=True) as engine, pytest.warns(UserWarning):
        engine.capture()
        stage = engine.super_kernel
        assert stage is not None and stage.graphs_optimized == engine.capture_state.graphs_captured == 3
        assert stage.super_kernels > 0
        lines = [r.getMessage() for r in caplog.records if r.name == "ascendgraph.compile.super_kernel"]
        assert lines == [SUPER_KERNEL_LOG]
        assert SUPER_KERNEL_LOG == "Super kernel optimization is enabled for ACL graph capture."
        # every FULL capture ran inside super_kernel_scope("full_model"), as vLLM Ascend's wrapper opens it
        scopes = [entry.graph.info()["super_kernel_scopes"] for entry in engine.capture_state.entries()]
        assert scopes == [["full_model"]] * 3
        engine.serve()
        assert engine.report().ok


def test_super_kernel_follows_the_static_kernel_flag_and_can_be_turned_off(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    default = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"},
        additional_config={"ascend_compilation_config": {"enable_static_kernel": True}},
    )
    assert default.ascend_compilation_config.super_kernel is True
    with _engine(super_kernel=False) as engine:
        assert engine.super_kernel is None and not engine.capture_state.after_capture
        assert not engine.capture_state.capture_scopes


def test_piecewise_modes_never_optimise():
    with _engine(super_kernel=False, mode="PIECEWISE") as engine:
        assert engine.super_kernel is None and engine.static_kernels is None
