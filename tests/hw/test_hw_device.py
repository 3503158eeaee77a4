"""NpuDevice's own logic on CPU, against a stand-in for torch_npu.

The stand-in follows what the torch-npu 2.13 wheel's Python does (read in
tests/hw/torch_npu_wheel.py's wheel): ``torch.npu.graph.__enter__`` synchronizes, calls
``torch.npu.empty_cache()``, switches to the capture stream and calls ``capture_begin``;
``__exit__`` always calls ``capture_end``, even when the block raised; NPUGraph refuses a
second capture, replay before capture, capture on the default stream — with torch_npu's
texts. It replaces torch_npu (outside the project), never the device layer: what is
tested is NpuDevice's wiring and bookkeeping. Real behaviour is for ``pytest -m npu``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch

from ascendgraph.errors import (
    DEFAULT_STREAM_CAPTURE,
    GRAPH_ALREADY_CAPTURED,
    REPLAY_BEFORE_CAPTURE,
    CaptureConstraintError,
    ConfigError,
    DeviceUnavailable,
)
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget
from hw.api import TorchNpu
from hw.device import NpuDevice
from hw.kernels import KernelRouter

SEGMENT = 2 << 20  # what the stand-in's allocator reserves for a graph's private pool


class Stream:
    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id

    def synchronize(self) -> None:
        pass


class StandInTorchNpu:
    """The slice of torch_npu NpuDevice uses, with the wheel's control flow and texts."""

    def __init__(self, *, name: str = "Ascend910B3", devices: int = 2, weak_ref: bool = True, graph_update: bool = True) -> None:
        state = self.state = SimpleNamespace(current=None, default=Stream(0), flushes=0, reserved=0, streams=0,
                                             capturing=None, graph_calls=[], set_stream_calls=0)
        state.current = state.default
        outer = self

        class NPUGraph:
            def __init__(self) -> None:
                self.captured = False
                self.stream: Optional[Stream] = None

            def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
                if self.captured:
                    raise RuntimeError(GRAPH_ALREADY_CAPTURED)
                if state.current is state.default:
                    raise RuntimeError(DEFAULT_STREAM_CAPTURE)
                self.stream, state.capturing = state.current, self
                state.reserved += SEGMENT

            def capture_end(self) -> None:
                state.capturing, self.captured = None, True

            def replay(self) -> None:
                if not self.captured:
                    raise RuntimeError(REPLAY_BEFORE_CAPTURE)

            def reset(self) -> None:
                if self.captured:
                    state.reserved -= SEGMENT
                self.captured = False

            def pool(self) -> tuple[int, int]:
                return (1, id(self))

        if graph_update:
            NPUGraph.update = lambda self, cpu_update_input: None  # type: ignore[attr-defined]

        class graph:
            def __init__(self, npu_graph: Any, pool: Any = None, stream: Any = None, auto_dispatch_capture: bool = False,
                         capture_error_mode: str = "global") -> None:
                state.graph_calls.append(dict(pool=pool, stream=stream, auto_dispatch_capture=auto_dispatch_capture,
                                              capture_error_mode=capture_error_mode))
                self.npu_graph, self.pool = npu_graph, () if pool is None else (pool,)
                self.capture_stream = stream or Stream(99)
                self.mode = capture_error_mode

            def __enter__(self) -> None:
                outer.npu.synchronize()
                outer.npu.empty_cache()  # looked up at call time, as torch.npu.empty_cache() is
                self.previous, state.current = state.current, self.capture_stream
                self.npu_graph.capture_begin(*self.pool, capture_error_mode=self.mode)

            def __exit__(self, *exc: Any) -> None:
                self.npu_graph.capture_end()
                state.current = self.previous

        def flush() -> None:
            state.flushes += 1

        def new_stream(device: Any = None) -> Stream:
            state.streams += 1
            return Stream(state.streams)

        def set_stream(stream: Any) -> None:
            state.set_stream_calls += 1
            state.current = stream

        @contextlib.contextmanager
        def stream(s: Any) -> Any:
            previous, state.current = state.current, s
            try:
                yield
            finally:
                state.current = previous

        def task_group_begin(stream: Any) -> None:
            if state.capturing is None:
                raise RuntimeError("aclmdlRICaptureTaskGrpBegin: stream is not capturing")

        self.npu = SimpleNamespace(
            is_available=lambda: True, device_count=lambda: devices, current_device=lambda: 0,
            set_device=lambda index: None, get_device_name=lambda: name, mem_get_info=lambda device=None: (1, 64 << 30),
            current_stream=lambda device=None: state.current, default_stream=lambda device=None: state.default,
            Stream=new_stream, stream=stream, set_stream=set_stream, synchronize=lambda device=None: None,
            Event=object, ExternalEvent=object, empty_cache=flush,
            memory_allocated=lambda device=None: 0, memory_reserved=lambda device=None: state.reserved,
            NPUGraph=NPUGraph, graph=graph, graph_pool_handle=lambda: (1, 0),
            is_current_stream_capturing=lambda: state.capturing is not None,
            graph_task_group_begin=task_group_begin, graph_task_group_end=lambda stream: "handle",
            graph_task_update_begin=lambda stream, handle: None, graph_task_update_end=lambda stream: None,
        )
        self.utils = SimpleNamespace(get_cann_version=lambda module="CANN": {"CANN": "8.5.0", "DRIVER": "25.5.1"}[module])
        self.version = SimpleNamespace(__version__="2.13.0")
        self._C = SimpleNamespace(_weak_ref_tensor=lambda t: t.detach()) if weak_ref else SimpleNamespace()


def make(**options: Any) -> tuple[NpuDevice, SimpleNamespace]:
    stand_in = StandInTorchNpu(**options)
    npu = TorchNpu(stand_in)
    return NpuDevice(npu=npu, router=KernelRouter(npu, capturing=lambda: False)), stand_in.state


def test_the_profile_comes_from_the_device_name_and_the_stack_versions() -> None:
    device, _ = make(name="Ascend910_9391")
    assert (device.profile.name, device.profile.soc) == ("A3", "Ascend910_9391")
    assert (device.profile.cann_version, device.profile.hdk_version) == ("8.5.0", "25.5.1")
    assert device.profile.memory_bytes == 64 << 30


def test_features_are_detected_by_attribute() -> None:
    device, _ = make(graph_update=False)
    assert device.features["graph_update"] is False and device.features["task_update"] is True


def test_graph_passes_keywords_only_so_auto_dispatch_capture_stays_off() -> None:
    device, state = make()
    graph = device.new_graph()
    with device.graph(graph, pool=(1, 0), capture_error_mode="relaxed"):
        pass
    assert state.graph_calls == [dict(pool=(1, 0), stream=None, auto_dispatch_capture=False, capture_error_mode="relaxed")]


def test_a_capture_counts_one_graph_one_stream_and_its_pool_growth_until_reset() -> None:
    device, _ = make()
    before = device.stats()
    graph = device.new_graph()
    with device.graph(graph):
        pass
    during = device.stats()
    assert (during.graphs_alive, during.streams_in_use, during.pool_bytes, during.graphs_captured_total) == (1, 1, SEGMENT, 1)
    assert during.extra["streams_in_use_is_estimate"] is True
    graph.reset()
    after = device.stats()
    assert (after.graphs_alive, after.streams_in_use, after.pool_bytes) == (before.graphs_alive, before.streams_in_use, 0)


def test_a_failed_capture_is_reset_so_nothing_stays_behind_and_the_graph_captures_again() -> None:
    device, state = make()
    graph = device.new_graph()
    with pytest.raises(ValueError, match="boom"):
        with device.graph(graph):
            raise ValueError("boom")
    assert not graph.graph.captured and graph.state == "new" and state.capturing is None
    stats = device.stats()
    assert (stats.graphs_alive, stats.streams_in_use, stats.pool_bytes) == (0, 0, 0)
    with pytest.raises(RuntimeError, match="replay without a preceding successful capture"):
        graph.replay()
    with device.graph(graph):
        pass
    graph.replay()


def test_a_refused_capture_begin_restores_the_stream_and_keeps_a_captured_graph() -> None:
    device, state = make()
    graph = device.new_graph()
    with device.graph(graph):
        pass
    current = state.current
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        with device.graph(graph):
            pass
    assert state.current is current and state.set_stream_calls == 1
    assert graph.graph.captured and device.stats().graphs_alive == 1


def test_capture_on_the_default_stream_gives_torch_npus_error() -> None:
    device, _ = make()
    with pytest.raises(RuntimeError, match="non-default stream"):
        with device.graph(device.new_graph(), stream=device.default_stream()):
            pass
    assert device.stats().graphs_alive == 0


def test_an_unknown_capture_error_mode_is_refused_before_torch_npu_switches_streams() -> None:
    device, state = make()
    with pytest.raises(CaptureConstraintError, match="Unknown capture error mode.*got loose"):
        with device.graph(device.new_graph(), capture_error_mode="loose"):
            pass
    assert state.graph_calls == []


def test_graph_kind_and_foreign_graphs_are_checked() -> None:
    device, _ = make()
    other, _ = make()
    with pytest.raises(ConfigError, match="graph_kind"):
        with device.graph(device.new_graph(), graph_kind="both"):
            pass
    with pytest.raises(ConfigError, match="not a graph of this device"):
        with device.graph(other.new_graph()):
            pass


def test_torch_npu_graph_flushes_the_cache_through_the_device_so_a_stub_silences_it() -> None:
    device, state = make()
    original = device._npu.get(device_api("EMPTY_CACHE"))
    for _ in range(2):
        graph = device.new_graph()
        with device.graph(graph):
            pass
    assert state.flushes == 2
    device.empty_cache = lambda: None  # what the core does between the pieces of one size
    with device.graph(device.new_graph()):
        pass
    assert state.flushes == 2
    assert device._npu.get(device_api("NPU_MODULE")).empty_cache is original


def device_api(name: str) -> Any:
    from hw import api

    return getattr(api, name)


def test_the_stream_estimate_follows_the_plan_by_graph_kind() -> None:
    device, _ = make()
    plan = plan_stream_budget(num_hidden_layers=2, capture_sizes=[1, 2, 4], mode=GraphMode.FULL_AND_PIECEWISE,
                              tensor_parallel_size=2, max_streams=900)
    device.set_stream_plan(plan)
    base = plan.reserved_streams + plan.full_graph_reserve
    assert device.stats().streams_in_use == base and device.stats().stream_limit == 900
    graphs = []
    for kind in ("full", "piecewise"):
        graphs.append(device.new_graph())
        with device.graph(graphs[-1], graph_kind=kind):
            pass
    assert device.stats().streams_in_use == base + plan.streams_per_full_graph + plan.streams_per_piecewise_graph
    with pytest.raises(ConfigError, match="StreamPlan"):
        device.set_stream_plan(object())


def test_a_dropped_graph_leaves_the_statistics() -> None:
    device, _ = make()
    graph = device.new_graph()
    with device.graph(graph):
        pass
    assert device.stats().graphs_alive == 1
    del graph
    gc.collect()
    assert device.stats().graphs_alive == 0


def test_weak_ref_uses_the_helper_and_falls_back_to_the_tensor_with_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    device, _ = make()
    x = torch.ones(3)
    assert device.weak_ref(x) is not x and device.weak_ref(x).data_ptr() == x.data_ptr()
    bare, _ = make(weak_ref=False)
    with caplog.at_level(logging.WARNING, logger="ascendgraph.hw.device"):
        assert bare.weak_ref(x) is x and bare.weak_ref(x) is x
    assert len(caplog.records) == 1


def test_task_groups_tell_the_kernel_router_where_kernels_land() -> None:
    device, _ = make()
    stream = device.new_stream()
    with pytest.raises(RuntimeError):
        device.task_group_begin(stream)  # outside a capture: torch_npu refuses
    with device.graph(device.new_graph()):
        device.task_group_begin(stream)
        assert device.router.in_task_group
        assert device.task_group_end(stream) == "handle"
        assert not device.router.in_task_group
    device.task_update_begin(stream, "handle")
    assert device.router.in_task_group
    device.task_update_end(stream)
    assert not device.router.in_task_group


def test_device_index_and_availability_are_checked() -> None:
    npu = TorchNpu(StandInTorchNpu(devices=2))
    with pytest.raises(ConfigError, match=r"device_index must be 0..1 \(2 NPUs visible\), got 5"):
        NpuDevice(5, npu=npu, router=KernelRouter(npu))
    stand_in = StandInTorchNpu()
    stand_in.npu.is_available = lambda: False
    with pytest.raises(DeviceUnavailable, match="no NPU is visible"):
        NpuDevice(npu=TorchNpu(stand_in), router=KernelRouter(TorchNpu(stand_in)))


def test_the_npu_device_declares_exactly_the_optional_capabilities_it_provides():
    from ascendgraph.device import capability_mismatches

    device, _ = make()
    assert capability_mismatches(device) == {}
