"""``torch_npu.npu`` (and ``torch.npu``, the same module) on the simulator.

Every name here follows torch-npu 2.13.0's Python (``torch_npu/npu/graphs.py``,
``streams.py``, ``utils.py``, ``memory.py``): the same signatures, the same call order in
``torch.npu.graph`` and the same rough edges, with the work done by the facade's
`sim.device.SimDevice` (`sim.facade.runtime`). Functions look each other up through
this module's globals at call time, so ``patch("torch.npu.empty_cache", ...)`` (vLLM
Ascend does that around captures) is seen by ``torch.npu.graph``.
"""

from __future__ import annotations

import gc
from typing import Any, Optional

import torch

from ascendgraph.errors import CAPTURE_END_OTHER_STREAM, UNKNOWN_CAPTURE_ERROR_MODE, CaptureConstraintError
from sim.capture import TaskGroup
from sim.device import SimPoolHandle
from sim.facade.error_codes import ErrCode, pta_error
from sim.facade.runtime import runtime
from sim.facade.super_kernel_options import check_super_kernel_options
from sim.streams import SimEvent, SimExternalEvent, SimStream

__all__ = [
    "is_available", "device_count", "set_device", "current_device", "get_device_name", "synchronize",
    "mem_get_info", "memory_allocated", "memory_reserved", "empty_cache", "host_empty_cache",
    "Stream", "Event", "ExternalEvent", "current_stream", "default_stream", "stream", "set_stream",
    "StreamContext", "NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing",
    "graph_task_group_begin", "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end",
    "super_kernel_scope_begin", "super_kernel_scope_end", "make_graphed_callables", "device", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
    "is_initialized",
]

CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")
_UPDATE_NEEDS_AUTO_DISPATCH = (
    "The current graph configuration does not support update,Try to capture by setting "
    "auto_dispatch_capture=True during capture"
)

def _device():
    return runtime().device


def _check_device(device: Any) -> int:
    if device is None:
        return runtime().current_index
    if isinstance(device, torch.device):
        index = device.index or 0
    elif isinstance(device, str):
        index = int(device.split(":")[1]) if ":" in device else 0
    else:
        index = int(device)
    if not 0 <= index < runtime().device_count:
        raise AssertionError("Invalid device id" + pta_error(ErrCode.VALUE))  # torch_npu/npu/__init__.py:538
    return index


# --------------------------------------------------------------------------- device
def is_available() -> bool:
    return True


def device_count() -> int:
    return runtime().device_count


def set_device(device: Any) -> None:
    from sim import npu_device

    index = _check_device(device)
    runtime().current_index = index
    npu_device.extension().set_device(index)  # the device guard's current device (npu tensors' default index)


def is_initialized() -> bool:
    return True


def _is_in_bad_fork() -> bool:
    """torch.manual_seed seeds the npu device's generators through ``manual_seed_all`` when this
    exists (torch/random.py ``_seed_custom_device``), as with torch_npu."""
    return False


def current_device() -> int:
    return runtime().current_index


class device:
    """``torch.npu.device(d)``: makes ``d`` the current device for the block; ``None`` or a
    negative index is a no-op (torch_npu/npu/utils.py:104-127)."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None or (isinstance(device, int) and device < 0) else _check_device(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx < 0:
            return
        rt = runtime()
        self.prev_idx = rt.current_index
        rt.current_index = self.idx

    def __exit__(self, *exc: Any) -> None:
        if self.idx >= 0:
            runtime().current_index = max(self.prev_idx, 0)


def get_device_name(device_name: Any = None) -> str:
    _check_device(device_name)
    return runtime().device_name


def synchronize(device: Any = None) -> None:
    _check_device(device)
    _device().synchronize()


# --------------------------------------------------------------------------- memory
# The simulated NPU's caching allocator (`sim.memory.DeviceMemory`): npu tensors and graph pools.
def mem_get_info(device: Any = None) -> tuple[int, int]:
    """(free, total): what the allocator does not hold, and the device's memory (aclrtGetMemInfo)."""
    _check_device(device)
    dev = _device()
    total = int(dev.profile.memory_bytes)
    return total - runtime().reserved_bytes(), total


def memory_allocated(device: Any = None) -> int:
    _check_device(device)
    return runtime().allocated_bytes()


def memory_reserved(device: Any = None) -> int:
    """Memory the caching allocator holds (torch_npu/npu/memory.py:491): at least what is
    allocated; freed blocks stay reserved until empty_cache."""
    _check_device(device)
    return runtime().reserved_bytes()


def empty_cache() -> None:
    _device().empty_cache()


def host_empty_cache() -> None:
    """Pinned host memory is returned when its tensor dies (the npu device's pinned allocator
    caches nothing): nothing to free."""


# --------------------------------------------------------------------------- random numbers
# torch_npu/npu/random.py: the npu device's default generators (`sim.npu_device.default_generator`).
def _generator(device: Any = None) -> Any:
    from sim import npu_device

    return npu_device.default_generator(_check_device(device if device != "npu" else None))


def manual_seed(seed: int) -> None:
    _generator().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for index in range(device_count()):
        _generator(index).manual_seed(int(seed))


def seed() -> None:
    _generator().seed()


def seed_all() -> None:
    for index in range(device_count()):
        _generator(index).seed()


def initial_seed() -> int:
    return int(_generator().initial_seed())


def get_rng_state(device: Any = "npu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "npu") -> None:
    _generator(device).set_state(new_state)


class _DefaultGenerators:
    """``torch.npu.default_generators``: one generator per device (a tuple in torch_npu)."""

    def __getitem__(self, index: int) -> Any:
        return _generator(index)

    def __len__(self) -> int:
        return device_count()

    def __iter__(self) -> Any:
        return iter([_generator(index) for index in range(device_count())])


default_generators = _DefaultGenerators()


# --------------------------------------------------------------------------- streams and events
class Stream:
    """torch_npu's Stream: a new object per ``current_stream()`` call, equal by id.

    ``Stream(stream_id=..., device_index=..., device_type=...)`` rebuilds the object of an
    existing stream, as torch_npu's ``current_stream`` / ``default_stream`` do
    (torch_npu/npu/utils.py:275, 290, from ``_npu_getCurrentStream``'s triple)."""

    def __init__(self, device: Any = None, priority: int = 0, *, _sim: Optional[SimStream] = None,
                 stream_id: Optional[int] = None, device_index: Optional[int] = None,
                 device_type: Optional[int] = None, **kwargs: Any) -> None:
        if kwargs:
            name = next(iter(kwargs))
            if name == "stream_ptr":
                raise NotImplementedError("sim.facade does not model external streams (torch.npu.ExternalStream)")
            raise TypeError(f"Stream() got an unexpected keyword argument '{name}'")
        _check_device(device_index if device_index is not None else device)
        if _sim is None and stream_id is not None:
            _sim = _existing_stream(int(stream_id), device_type)
        self._sim = _sim if _sim is not None else _device().new_stream()
        from sim import npu_device

        npu_device.driver().note_stream(self._sim)  # torch.Stream(stream_id=...) on the npu device finds it
        self.priority = priority

    @property
    def stream_id(self) -> int:
        return self._sim.stream_id

    @property
    def device_index(self) -> int:
        return runtime().current_index

    @property
    def device_type(self) -> int:
        return PRIVATEUSE1  # c10::DeviceType::PrivateUse1, as torch_npu reports it

    @property
    def device(self) -> torch.device:
        """The stream's device: PrivateUse1 (``npu`` once the facade spells it so,
        ``privateuseone`` otherwise) at the current index."""
        return torch.device(torch._C._get_privateuse1_backend_name(), self.device_index)

    @property
    def npu_stream(self) -> int:
        return self._sim.stream_id

    def wait_event(self, event: "Event") -> None:
        event.wait(self)

    def wait_stream(self, stream: "Stream") -> None:
        self._sim.wait_stream(_sim_stream(stream))

    def record_event(self, event: Optional["Event"] = None) -> "Event":
        event = event or Event()
        event.record(self)
        return event

    def query(self) -> bool:
        return self._sim.query()

    def synchronize(self) -> None:
        self._sim.synchronize()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other._sim is self._sim

    def __hash__(self) -> int:
        return hash((self._sim.stream_id, id(self._sim.device)))

    def __repr__(self) -> str:
        return f"<torch_npu.npu.Stream device=npu:{self.device_index} npu_stream={self.stream_id} (facade: {self._sim.name})>"


PRIVATEUSE1 = 20  # c10::DeviceType::PrivateUse1


def _wrap(stream: SimStream) -> Stream:
    return Stream(_sim=stream)


def _existing_stream(stream_id: int, device_type: Optional[int]) -> SimStream:
    if device_type is not None and int(device_type) != PRIVATEUSE1:
        raise RuntimeError(f"sim.facade: device_type {device_type} is not the NPU's ({PRIVATEUSE1}, PrivateUse1)")
    for stream in _device()._streams:
        if stream.stream_id == stream_id:
            return stream
    raise RuntimeError(f"sim.facade: no stream with stream_id={stream_id} on the simulated NPU (a stream of a "
                       "replaced device, sim.facade.configure, or an id no stream had)")


def _sim_stream(stream: Any) -> SimStream:
    if stream is None:
        return _device().current_stream()
    if isinstance(stream, Stream):
        if stream._sim.device is not _device():
            raise RuntimeError(f"{stream!r} belongs to a facade device that was replaced (sim.facade.configure)")
        return stream._sim
    raise TypeError(f"expected a torch.npu.Stream, got {stream!r}")


class Event:
    """torch_npu's Event (record / wait / query / synchronize / elapsed_time). Timing events
    read the simulator's virtual clock (`sim.cost`): ``elapsed_time`` is the virtual time
    between the two records, in milliseconds, not a card's."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self._sim: SimEvent = _device().new_event()
        self.enable_timing = bool(enable_timing)
        self._recorded_us: Optional[float] = None

    def record(self, stream: Optional[Stream] = None) -> None:
        self._sim.record(_sim_stream(stream))
        self._recorded_us = max(self._sim._device.clock())  # all work issued so far is done by then

    def wait(self, stream: Optional[Stream] = None) -> None:
        self._sim.wait(_sim_stream(stream))

    def query(self) -> bool:
        return self._sim.query()

    def synchronize(self) -> None:
        self._sim.synchronize()

    def elapsed_time(self, end_event: "Event") -> float:
        if self._recorded_us is None or end_event._recorded_us is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")  # libtorch_npu.so
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("sim.facade: elapsed_time needs two events made with enable_timing=True (a card "
                               "fails in aclrtEventElapsedTime)")
        return (end_event._recorded_us - self._recorded_us) / 1000.0


class ExternalEvent:
    """wait() may come before record(); reset() before reuse. Captured as graph nodes."""

    def __init__(self) -> None:
        self._sim: SimExternalEvent = _device().new_external_event()

    def record(self, stream: Optional[Stream] = None) -> None:
        self._sim.record(_sim_stream(stream))

    def wait(self, stream: Optional[Stream] = None) -> None:
        self._sim.wait(_sim_stream(stream))

    def reset(self, stream: Optional[Stream] = None) -> None:
        self._sim.reset(_sim_stream(stream))

    def __repr__(self) -> str:
        return f"<torch_npu.npu.ExternalEvent (facade: {self._sim})>"


def current_stream(device: Any = None) -> Stream:
    _check_device(device)
    return _wrap(_device().current_stream())


def default_stream(device: Any = None) -> Stream:
    _check_device(device)
    return _wrap(_device().default_stream())


def set_stream(stream: Optional[Stream]) -> None:
    if stream is None:
        return
    runtime().set_current(_sim_stream(stream))


class StreamContext:
    """``torch.npu.stream(s)``: makes ``s`` current; ``__exit__`` restores the previous one."""

    def __init__(self, stream_ctx: Optional[Stream]) -> None:
        self.stream = stream_ctx
        self.previous: Optional[Stream] = None

    def __enter__(self) -> Optional[Stream]:
        if self.stream is None:
            return None
        self.previous = current_stream()
        set_stream(self.stream)
        return self.stream

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if self.stream is None or self.previous is None:
            return
        if exc_type is not None and self.stream._sim.device is _device():
            runtime().leave_stream_by_exception(self.stream._sim)  # work left open on it is closed
        set_stream(self.previous)


def stream(stream: Optional[Stream]) -> StreamContext:
    return StreamContext(stream)


# --------------------------------------------------------------------------- graphs
def graph_pool_handle() -> SimPoolHandle:
    return _device().graph_pool_handle()


def is_current_stream_capturing() -> bool:
    return _device().is_current_stream_capturing()


def graph_task_group_begin(stream: Stream) -> None:
    rt = runtime()
    rt.device.task_group_begin(_sim_stream(stream))
    rt.push_guard("group", "graph_task_group_begin and graph_task_group_end")


def graph_task_group_end(stream: Stream) -> TaskGroup:
    rt = runtime()
    rt.pop_guard("group")
    return rt.device.task_group_end(_sim_stream(stream))


def graph_task_update_begin(stream: Stream, handle: TaskGroup) -> None:
    rt = runtime()
    rt.device.task_update_begin(_sim_stream(stream), handle)
    rt.push_guard("update", "graph_task_update_begin and graph_task_update_end")


def graph_task_update_end(stream: Stream) -> None:
    rt = runtime()
    rt.pop_guard("update")
    rt.device.task_update_end(_sim_stream(stream))


def _check_scope_name(scope_name: Optional[str]) -> None:
    # torch_npu/npu/graphs.py:102-117 (a non-string fails in its .strip(), as there)
    if scope_name is not None and not scope_name.strip():
        raise RuntimeError("scope_name should be None or a non-empty string.", pta_error(ErrCode.PARAM))


def super_kernel_scope_begin(scope_name: Optional[str] = None) -> None:
    _check_scope_name(scope_name)
    rt = runtime()
    rt.check_super_kernel("super_kernel_scope_begin")
    rt.open_super_kernel_scopes.append(scope_name)
    capture = rt.device.capture_in_progress  # noted on the capture under way, as SimDevice.super_kernel_scope does
    if capture is not None:
        capture.super_kernel_scopes.append(scope_name or "")


def super_kernel_scope_end(scope_name: Optional[str] = None) -> None:
    _check_scope_name(scope_name)
    scopes = runtime().open_super_kernel_scopes
    if scopes:
        scopes.pop()


class NPUGraph:
    """torch_npu's NPUGraph over a simulator graph (capture_begin/end, replay, reset, pool).

    As c10_npu::NPUGraph in torch-npu 2.13.0's lib/libtorch_npu.so: the constructor
    remembers the current stream (``getCurrentNPUStream`` in ``NPUGraph::NPUGraph``),
    capture_begin replaces it with the capture stream, and ``NPUGraph::capture_end`` checks
    "same stream" *first* (its ``TORCH_CHECK`` comes right after ``getCurrentNPUStream``,
    before the state check that says "called before capture_begin"). So capture_end on
    another stream than the one current at construction reads "Capture must end on the same
    stream it began on." even when no capture was begun."""

    def __init__(self) -> None:
        self._sim = _device().new_graph()
        self._capture_stream = _device().current_stream()
        self.auto_dispatch_capture = False

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise CaptureConstraintError(UNKNOWN_CAPTURE_ERROR_MODE.format(mode=capture_error_mode))
        stream = _device().current_stream()
        self._sim.capture_begin(pool=pool, capture_error_mode=capture_error_mode)
        self._capture_stream = stream

    def capture_end(self) -> None:
        rt = runtime()
        if rt.device.current_stream() is not self._capture_stream:
            raise CaptureConstraintError(CAPTURE_END_OTHER_STREAM)
        rt.pop_guard("group")  # a task group left open: the simulator refuses and discards the capture
        self._sim.capture_end()

    def replay(self) -> None:
        self._sim.replay()

    def reset(self) -> None:
        self._sim.reset()

    def pool(self) -> SimPoolHandle:
        return self._sim.pool()

    def update(self, cpu_update_input: Any) -> None:
        if not self.auto_dispatch_capture:
            raise RuntimeError(_UPDATE_NEEDS_AUTO_DISPATCH, pta_error(ErrCode.PARAM))  # graphs.py:655-663
        raise NotImplementedError("sim.facade does not model auto_dispatch_capture graphs")

    def debug_dump(self, debug_path: str) -> None:
        if not self._sim.is_captured:
            raise RuntimeError("Called NPUGraph::debug_dump without a preceding successful capture.")

    def super_kernel_optimize(self, optimize_options: Optional[dict] = None, debug_options: Optional[dict] = None) -> None:
        check_super_kernel_options(optimize_options, "optimize_options")
        check_super_kernel_options(debug_options, "debug_options")
        if not self._sim.is_captured:
            raise RuntimeError("Called NPUGraph::super_kernel_optimize without a preceding successful capture.")
        runtime().check_super_kernel("NPUGraph.super_kernel_optimize")  # aclskOptimize fails off A3
        _device().super_kernel_optimize(self._sim, optimize_options)

    @property
    def sim_graph(self) -> Any:
        """The simulator graph behind this NPUGraph (tests: recorded ops, replays)."""
        return self._sim

    def __repr__(self) -> str:
        return f"<torch_npu.npu.NPUGraph (facade: {self._sim!r})>"


class graph:
    """``torch.npu.graph(npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
    capture_error_mode="global")``, with torch_npu 2.13's enter/exit sequence.

    Enter: synchronize, (gc.collect only under force_npugraph_gc: never here), empty_cache,
    host_empty_cache, switch to the capture stream, capture_begin(*pool). Exit: capture_end
    always (even when the block raised), then restore the stream. When capture_end raises,
    the stream is *not* restored (torch_npu skips ``stream_ctx.__exit__``); when
    capture_begin raises, the capture stream stays current too.
    """

    def __init__(
        self,
        npu_graph: NPUGraph,
        pool: Any = None,
        stream: Optional[Stream] = None,
        auto_dispatch_capture: bool = False,
        capture_error_mode: str = "global",
    ) -> None:
        rt = runtime()
        if rt.default_capture_stream is None:
            rt.default_capture_stream = rt.device.new_stream()
        if auto_dispatch_capture:
            raise NotImplementedError("sim.facade does not model auto_dispatch_capture (torch_npu's own update path)")
        self.pool: tuple[Any, ...] = () if pool is None else (pool,)
        self.capture_stream = stream if stream is not None else _wrap(rt.default_capture_stream)
        self.stream_ctx = StreamContext(self.capture_stream)
        self.npu_graph = npu_graph
        self.capture_error_mode = capture_error_mode
        npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self) -> None:
        module = _this_module()
        module.synchronize()
        if False:  # torch_npu._compiler._config.force_npugraph_gc is off by default
            gc.collect()
        module.empty_cache()
        module.host_empty_cache()
        self.stream_ctx.__enter__()
        self.npu_graph.capture_begin(self.pool[0] if self.pool else None, capture_error_mode=self.capture_error_mode)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if exc_type is not None:
            # The block's exception left a task group open: close it, so the capture ends and the
            # block's own error is what the caller sees (docs/facade.md, deviations table).
            rt = runtime()
            rt.pop_guard("group")
            rt.device.abandon_task_group()
        self.npu_graph.capture_end()
        self.stream_ctx.__exit__(exc_type, exc_value, traceback)


def make_graphed_callables(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("sim.facade does not provide make_graphed_callables")


def _this_module() -> Any:
    import sys

    return sys.modules[__name__]
