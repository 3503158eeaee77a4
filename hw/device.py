"""`NpuDevice`: the ascendgraph Device protocol over torch_npu.

Theory of operation. Almost every method is one declared torch_npu call (``hw/api.py``):
streams, events, ``ExternalEvent``, ``NPUGraph`` / ``torch.npu.graph`` (always with
keyword arguments: its fourth positional parameter is ``auto_dispatch_capture``, not
CUDA's ``capture_error_mode``), task groups, memory, the weak-reference helper. What the
hardware does not tell us is bookkept here, the way the simulator reports it:

* graphs: `new_graph` returns an `NpuGraph` handle around ``torch.npu.NPUGraph``, whose
  state (``new -> captured -> reset``) gives ``graphs_alive`` and the kind of each graph;
* streams: the stack enforces its own budget and exposes no count, so
  ``stats().streams_in_use`` is the *estimate* of the StreamPlan handed to
  `set_stream_plan` (one stream per graph without a plan). The calibration test measures
  the real budget;
* pool bytes: the growth of reserved memory while each live graph was captured.

``torch.npu.graph`` calls ``torch.npu.empty_cache()`` on entry. During `graph` that call
is routed through ``self.empty_cache``, so the core's "no empty_cache between the pieces
of one size" (docs/semantics.md §6: it replaces ``device.empty_cache``) holds on hardware too.

Capture errors are raised as torch_npu raises them; the core's GraphWrapper classifies
and rewrites them (docs/semantics.md §8), exactly as it does for the simulator.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any, Iterator, Optional

import torch

from ascendgraph.device import (
    CAPTURE_ERROR_MODES,
    DeviceProfile,
    DeviceStats,
    KernelFallbacks,
    KernelPrecheck,
    SuperKernels,
)
from ascendgraph.errors import UNKNOWN_CAPTURE_ERROR_MODE, CaptureConstraintError, ConfigError, DeviceUnavailable
from ascendgraph import kernel_contracts
from hw import api, kernels, profiler
from hw.soc import npu_profile
from hw.api import TorchNpu

__all__ = ["NpuDevice", "NpuGraph", "create_npu_device", "GRAPH_KINDS", "FEATURES"]

log = logging.getLogger("ascendgraph.hw.device")  # under the CLI's "ascendgraph" logger (its handler, its -v levels)

GRAPH_KINDS = ("full", "piecewise")
# Capabilities detected by attribute, never by version string.
FEATURES = {
    "task_update": api.TASK_UPDATE_BEGIN,
    "external_event": api.EXTERNAL_EVENT,
    "weak_ref_tensor": api.WEAK_REF_TENSOR,
    "graph_update": api.NPU_GRAPH_UPDATE,
    "super_kernel_optimize": api.NPU_GRAPH_SUPER_KERNEL_OPTIMIZE,
    "super_kernel_scope": api.SUPER_KERNEL_SCOPE_BEGIN,
    "fia_workspace": api.NPU_FIA_MAX_WORKSPACE,
}
NEW, CAPTURING, CAPTURED, RESET = "new", "capturing", "captured", "reset"


class _PendingTask:
    """A task group or task update asked for and not necessarily opened yet."""

    __slots__ = ("kind", "stream", "handle", "opened")

    def __init__(self, kind: str, stream: Any, handle: Any) -> None:
        self.kind, self.stream, self.handle, self.opened = kind, stream, handle, False


class NpuGraph:
    """A ``torch.npu.NPUGraph`` plus the state the device reports (the Graph protocol).

    Direct ``capture_begin``/``capture_end`` work like torch_npu's; `NpuDevice.graph` is
    the usual way to capture.
    """

    def __init__(self, device: "NpuDevice", graph: Any, name: str) -> None:
        self.device = device
        self.graph = graph  # the torch.npu.NPUGraph
        self.name = name
        self.state = NEW
        self.kind = "full"
        self.pool_bytes = 0

    def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
        _check_capture_error_mode(capture_error_mode)
        if pool is None:  # as torch.npu.graph does: no pool argument at all for a private pool
            self.graph.capture_begin(capture_error_mode=capture_error_mode)
        else:
            self.graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode)
        self.state = CAPTURING

    def capture_end(self) -> None:
        self.graph.capture_end()
        self.device.note_captured(self)

    def replay(self) -> None:
        self.graph.replay()

    def reset(self) -> None:
        self.graph.reset()
        if self.state == CAPTURED:
            self.device.note_released(self)
        else:
            self.state = NEW

    def pool(self) -> Any:
        return self.graph.pool()

    def __del__(self) -> None:  # torch_npu frees a dropped graph; keep the bookkeeping in step
        if getattr(self, "state", NEW) == CAPTURED:
            with contextlib.suppress(Exception):
                self.device.note_released(self)

    def __repr__(self) -> str:
        return f"<NpuGraph {self.name} {self.kind} {self.state}>"


def _check_capture_error_mode(mode: str) -> None:
    # torch_npu's own text, raised before torch.npu.graph has switched streams.
    if mode not in CAPTURE_ERROR_MODES:
        raise CaptureConstraintError(UNKNOWN_CAPTURE_ERROR_MODE.format(mode=mode))


class NpuDevice:
    """The Device protocol on one Ascend NPU through torch_npu.

    ``soc`` overrides the generation read from the device name (A2, A3, 310P, A5);
    ``stream_limit`` is the planning budget reported in stats (the stack enforces its own).
    ``npu`` and ``router`` replace torch_npu and the registered kernels (tests on CPU).
    """

    name = "npu"
    # The optional capabilities of ascendgraph.device it provides (the conformance suite checks them).
    capabilities = (SuperKernels, KernelPrecheck, KernelFallbacks)

    def __init__(
        self,
        device_index: Optional[int] = None,
        *,
        soc: Optional[str] = None,
        stream_limit: Optional[int] = None,
        npu: Optional[TorchNpu] = None,
        router: Optional[kernels.KernelRouter] = None,
    ) -> None:
        self._npu = npu if npu is not None else api.torch_npu_namespace()
        reason = api.unavailable_reason(self._npu)
        if reason:
            raise DeviceUnavailable(f"device 'npu' is not usable here: {reason}")
        if stream_limit is not None and (isinstance(stream_limit, bool) or not isinstance(stream_limit, int) or stream_limit < 1):
            raise ConfigError(f"stream_limit must be a positive integer, got {stream_limit!r}", key="stream_limit")
        count = int(self._npu.call(api.DEVICE_COUNT))
        index = int(self._npu.call(api.CURRENT_DEVICE)) if device_index is None else device_index
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
            raise ConfigError(f"device_index must be 0..{count - 1} ({count} NPUs visible), got {device_index!r}",
                              key="device_index")
        self._npu.call(api.SET_DEVICE, index)  # get_device_name() reports the current device
        self.index = index
        self.features = {name: self._npu.has(feature) for name, feature in FEATURES.items()}
        self.device_name = str(self._npu.call(api.GET_DEVICE_NAME))
        _, total = self._npu.call(api.MEM_GET_INFO, device=index)
        self.profile: DeviceProfile = npu_profile(
            self.device_name,
            soc=soc,
            stream_limit=stream_limit,
            cann_version=self._version("CANN"),
            hdk_version=self._version("DRIVER"),
            memory_bytes=int(total),
            supports_task_update=self.features["task_update"],
            supports_super_kernel_api=self.features["super_kernel_optimize"],
        )
        if router is None:  # the process-wide kernels of the torch_npu in use
            router = kernels.register_npu_kernels(self._npu)
            kernels.prepare(self.torch_device)
        router.soc = self.profile.name  # the KV write's kernel follows the SoC (hw.kernels.SCATTER_SOCS)
        self.router = router
        self._plan: Any = None
        # Captured graphs not yet reset; weak, so a graph the caller drops frees its streams.
        self._graphs: "weakref.WeakValueDictionary[int, NpuGraph]" = weakref.WeakValueDictionary()
        self._graph_count = 0
        self._captured_total = 0
        self._weak_ref_warned = False
        self._reserved_mark = 0
        self._task: Optional[_PendingTask] = None

    def _version(self, module: str) -> str:
        if not self._npu.has(api.GET_CANN_VERSION):
            return "unknown"
        try:
            return str(self._npu.call(api.GET_CANN_VERSION, module=module)) or "unknown"
        except Exception:  # an old runtime without the query
            return "unknown"

    @property
    def torch_device(self) -> torch.device:
        # Built on use: the "npu" device type exists once torch_npu (or the simulator's facade)
        # has registered it.
        return torch.device("npu", self.index)

    # ------------------------------------------------------------------ streams and events
    def current_stream(self) -> Any:
        return self._npu.call(api.CURRENT_STREAM, device=self.index)

    def default_stream(self) -> Any:
        return self._npu.call(api.DEFAULT_STREAM, device=self.index)

    def new_stream(self) -> Any:
        return self._npu.call(api.STREAM, device=self.index)

    def stream(self, stream: Any) -> Any:
        return self._npu.call(api.STREAM_CONTEXT, stream)

    def new_event(self) -> Any:
        return self._npu.call(api.EVENT)

    def new_external_event(self) -> Any:
        return self._npu.call(api.EXTERNAL_EVENT)

    # ------------------------------------------------------------------ graphs
    def new_graph(self, name: Optional[str] = None) -> NpuGraph:
        self._graph_count += 1
        return NpuGraph(self, self._npu.call(api.NPU_GRAPH), name or f"graph#{self._graph_count}")

    def graph_pool_handle(self) -> Any:
        return self._npu.call(api.GRAPH_POOL_HANDLE)

    def is_current_stream_capturing(self) -> bool:
        return bool(self._npu.call(api.IS_CURRENT_STREAM_CAPTURING))

    @contextlib.contextmanager
    def graph(
        self,
        graph: NpuGraph,
        *,
        pool: Any = None,
        stream: Any = None,
        capture_error_mode: str = "global",
        graph_kind: str = "full",
    ) -> Iterator[None]:
        """Capture the block into ``graph`` with ``torch.npu.graph`` (keywords only).

        A failed capture leaves nothing behind, as on the simulator: torch_npu ends the
        capture even when the block raised, so the half-captured graph is reset and the
        same object can capture again. ``graph_kind`` ("full" | "piecewise") only feeds
        the stream estimate.
        """
        if not isinstance(graph, NpuGraph) or graph.device is not self:
            raise ConfigError(f"{graph!r} is not a graph of this device; use device.new_graph()", key="graph")
        _check_capture_error_mode(capture_error_mode)
        if graph_kind not in GRAPH_KINDS:
            raise ConfigError(f"graph_kind must be one of {', '.join(GRAPH_KINDS)}, got {graph_kind!r}", key="graph_kind")
        context = self._npu.call(api.GRAPH, graph.graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode)
        previous_stream = self.current_stream()
        self._reserved_mark = self._reserved_bytes()
        try:
            with self._cache_flush_through_device():
                context.__enter__()  # synchronize, empty_cache (marks reserved bytes), capture_begin
        except BaseException:
            # torch_npu switches to the capture stream before capture_begin can refuse.
            self._npu.call(api.SET_STREAM, previous_stream)
            raise
        reserved_before = self._reserved_mark
        self._close_task()  # nothing pending from an earlier failure reaches this capture
        graph.kind = graph_kind
        graph.state = CAPTURING
        try:
            try:
                yield
            except BaseException as exc:
                self._abandon_group()  # else capture_end fails on the open group, hiding exc
                context.__exit__(type(exc), exc, exc.__traceback__)
                raise
            context.__exit__(None, None, None)  # capture_end
        except BaseException:
            # torch_npu skips restoring the stream when capture_end raises (graphs.py __exit__).
            with contextlib.suppress(Exception):
                if self.current_stream() != previous_stream:
                    self._npu.call(api.SET_STREAM, previous_stream)
            with contextlib.suppress(Exception):
                graph.graph.reset()
            graph.state = NEW
            raise
        finally:
            self._close_task()
        graph.pool_bytes = max(0, self._reserved_bytes() - reserved_before)
        self.note_captured(graph)

    @contextlib.contextmanager
    def _cache_flush_through_device(self) -> Iterator[None]:
        flush = self._npu.get(api.EMPTY_CACHE)  # the original, cached before patching
        module = self._npu.get(api.NPU_MODULE)

        def routed() -> None:
            self.empty_cache()  # a no-op when the core stubbed it (docs/semantics.md §6)
            self._reserved_mark = self._reserved_bytes()

        module.empty_cache = routed
        try:
            yield
        finally:
            module.empty_cache = flush

    def note_captured(self, graph: NpuGraph) -> None:
        """``graph`` finished its capture: count it and let the router know."""
        graph.state = CAPTURED
        self._graphs[id(graph)] = graph
        self._captured_total += 1
        self.router.graph_captured()

    def note_released(self, graph: NpuGraph) -> None:
        """``graph`` was reset or freed after a capture."""
        graph.state = RESET
        self._graphs.pop(id(graph), None)
        self.router.graph_released()

    def super_kernel_optimize(self, graph: NpuGraph, optimize_options: Optional[dict[str, Any]] = None) -> None:
        """Merge the eligible kernels of a captured graph (torch_npu's super kernel)."""
        if not self.features["super_kernel_optimize"]:
            raise RuntimeError(
                "this torch_npu has no NPUGraph.super_kernel_optimize; super kernel needs torch_npu 2.13 or newer "
                "(disable enable_super_kernel)"
            )
        self._refuse_super_kernel_off_a3("super_kernel_optimize")
        self._npu.call(api.NPU_GRAPH_SUPER_KERNEL_OPTIMIZE, graph.graph, optimize_options=optimize_options)

    def _refuse_super_kernel_off_a3(self, what: str) -> None:
        """Before torch_npu is reached: CANN's aclsk API is Atlas A3 only (hw.soc)."""
        if not self.profile.supports_super_kernel:
            raise RuntimeError(
                f"{what}: super kernel is not supported on {self.device_name} ({self.profile.name}): torch_npu's "
                "super kernel calls CANN's aclskScopeBegin / aclskOptimize, which are for Atlas A3 products only; "
                "disable enable_super_kernel on this device"
            )

    @contextlib.contextmanager
    def super_kernel_scope(self, scope_name: Optional[str] = None) -> Iterator[None]:
        """torch_npu's ``super_kernel_scope_begin/end`` around the block (the core opens it
        around FULL captures when super kernel is on); nothing on a torch_npu without it."""
        if not self.features["super_kernel_scope"]:
            yield
            return
        self._refuse_super_kernel_off_a3("super_kernel_scope")
        self._npu.call(api.SUPER_KERNEL_SCOPE_BEGIN, scope_name)
        try:
            yield
        finally:
            self._npu.call(api.SUPER_KERNEL_SCOPE_END, scope_name)

    # ------------------------------------------------------------------ FULL-graph parameter update
    # A task group (or task update) holds kernel tasks only: the workspace, softmax_lse and
    # static buffers of the kernel must exist before it opens. So the torch_npu call that
    # opens it is deferred until the router is about to issue the kernel (`KernelRouter.
    # enter_task`); an empty group is opened at its end. The router is also told that
    # kernels land in a task group: a fallback whose kernels follow host values must not be
    # captured there (hw.kernels, "Graph safety").
    def task_group_begin(self, stream: Any) -> None:
        if not self.is_current_stream_capturing():
            self._npu.call(api.TASK_GROUP_BEGIN, stream)  # outside a capture: torch_npu's own refusal
            return
        self._open_task("group", stream, None)

    def task_group_end(self, stream: Any) -> Any:
        task = self._task
        self._close_task()
        if task is not None and task.kind == "group" and not task.opened:
            self._npu.call(api.TASK_GROUP_BEGIN, task.stream)
        return self._npu.call(api.TASK_GROUP_END, stream)

    def task_update_begin(self, stream: Any, handle: Any) -> None:
        self._open_task("update", stream, handle)

    def task_update_end(self, stream: Any) -> None:
        task = self._task
        self._close_task()
        if task is not None and task.kind == "update" and not task.opened:
            return  # nothing was re-issued (the kernel failed its pre-check): no update to end
        self._npu.call(api.TASK_UPDATE_END, stream)

    def _open_task(self, kind: str, stream: Any, handle: Any) -> None:
        if self._task is not None:  # nested: let torch_npu refuse it with its own error
            self._enter_task()
        task = self._task = _PendingTask(kind, stream, handle)
        self.router.in_task_group = True
        self.router.defer_task(self._enter_task)
        del task

    def _enter_task(self) -> None:
        task = self._task
        if task is None or task.opened:
            return
        if task.kind == "group":
            self._npu.call(api.TASK_GROUP_BEGIN, task.stream)
        else:
            self._npu.call(api.TASK_UPDATE_BEGIN, task.stream, task.handle)
        task.opened = True

    def _close_task(self) -> None:
        self._task = None
        self.router.in_task_group = False
        self.router.defer_task(None)

    def _abandon_group(self) -> None:
        """A capture failed with a task group open: close it, so capture_end sees none."""
        task = self._task
        self._close_task()
        if task is not None and task.kind == "group" and task.opened:
            with contextlib.suppress(Exception):
                self._npu.call(api.TASK_GROUP_END, task.stream)

    # ------------------------------------------------------------------ memory, sync, profiling
    def check_kernel_call(self, kernel: str, arguments: Any) -> None:
        """Pre-check one torch_npu kernel call against the contract table, as hw's router
        does before any kernel is reached (KernelContractError; docs/decisions.md "Kernel contracts"). No card is
        touched, so a refusal never depends on CANN's own message."""
        kernel_contracts.check(kernel, arguments)

    def empty_cache(self) -> None:
        self._npu.call(api.EMPTY_CACHE)

    def memory_allocated(self) -> int:
        return int(self._npu.call(api.MEMORY_ALLOCATED, device=self.index))

    def _reserved_bytes(self) -> int:
        return int(self._npu.call(api.MEMORY_RESERVED, device=self.index))

    def synchronize(self) -> None:
        self._npu.call(api.SYNCHRONIZE, device=self.index)

    def kernel_fallbacks(self) -> dict[str, str]:
        """ascendgraph op -> why it ran a fallback instead of its torch_npu kernel, for every
        fallback taken in this process (the router is process-wide); the run report lists
        them (``kernel_fallbacks``, and one warning each)."""
        return dict(self.router.fallbacks)

    def weak_ref(self, tensor: torch.Tensor) -> torch.Tensor:
        """A tensor aliasing ``tensor``'s memory without keeping it alive (torch_npu's helper).

        Without the helper the tensor itself is returned: correct, but graph outputs then
        keep their pool memory until the graph is released.
        """
        if self.features["weak_ref_tensor"]:
            return self._npu.call(api.WEAK_REF_TENSOR, tensor)
        if not self._weak_ref_warned:
            self._weak_ref_warned = True
            log.warning("torch_npu has no _C._weak_ref_tensor: graph outputs are kept by strong references")
        return tensor

    def set_stream_plan(self, plan: Any) -> None:
        """Record the StreamPlan for the stream estimate; the hardware enforces its own budget."""
        if plan is not None:
            missing = [name for name in ("max_streams", "reserved_streams", "full_graph_reserve",
                                         "streams_per_piecewise_graph", "streams_per_full_graph")
                       if not hasattr(plan, name)]
            if missing:
                raise ConfigError(f"set_stream_plan expects an ascendgraph.sizes.StreamPlan, got {plan!r} "
                                  f"(it has no {', '.join(missing)})", key="stream_plan")
        self._plan = plan

    def _estimated_streams(self) -> int:
        plan = self._plan
        if plan is None:
            return len(self._graphs)
        per_kind = {"piecewise": max(1, int(plan.streams_per_piecewise_graph)),
                    "full": int(plan.streams_per_full_graph)}
        graphs = sum(per_kind[g.kind] for g in list(self._graphs.values()))
        return int(plan.reserved_streams) + int(plan.full_graph_reserve) + graphs

    def profiling(self, output_dir: str, **options: Any) -> Any:
        """torch_npu's profiler over the block; see `hw.profiler.npu_profile` for options.

        (Named like the simulator's: the protocol's ``profile`` is the DeviceProfile attribute.)
        """
        return profiler.npu_profile(self._npu, output_dir, **options)

    def xlite_runtime(self, model: Any, spec: Any) -> Any:
        """The adapter over the `xlite` package (`hw.xlite.NpuXliteRuntime`); DeviceUnavailable
        naming the fix when xlite cannot be imported."""
        from hw.xlite import NpuXliteRuntime

        return NpuXliteRuntime(self, model, spec)

    def stats(self) -> DeviceStats:
        plan = self._plan
        return DeviceStats(
            streams_in_use=self._estimated_streams(),
            stream_limit=int(plan.max_streams) if plan is not None else self.profile.stream_limit,
            graphs_alive=len(self._graphs),
            graphs_captured_total=self._captured_total,
            pool_bytes=sum(g.pool_bytes for g in list(self._graphs.values())),
            allocated_bytes=self.memory_allocated(),
            extra={
                "profile": self.profile.name,
                "device_name": self.device_name,
                "streams_in_use_is_estimate": True,
                "stream_plan": plan is not None,
                "memory_reserved": self._reserved_bytes(),
                "features": dict(self.features),
                "kernel_fallbacks": dict(self.router.fallbacks),
            },
        )

    def __repr__(self) -> str:
        return f"<NpuDevice npu:{self.index} {self.device_name} ({self.profile.name})>"


# Options the simulator takes that mean nothing on hardware: accepted when they ask for
# nothing, refused when they ask for simulation.
_SIM_ONLY = {
    "faults": "fault injection is simulator-only: use --device sim for --faults",
    "cost_model": "the cost model is simulator-only: use --device sim",
}
_IGNORED = ("profile", "seed", "env", "allow_rng_in_capture", "poison_capture_outputs", "record_kernels",
            "stream_error")


def create_npu_device(**options: Any) -> NpuDevice:
    """``get_device("npu", **options)``: device_index, soc, stream_limit; simulator options
    that request nothing are ignored (the hardware reads its SoC itself)."""
    for name, message in _SIM_ONLY.items():
        if options.pop(name, None) not in (None, "", ()):
            raise ConfigError(message, key=name)
    for name in _IGNORED:
        if name in options:
            log.debug("npu device ignores the simulator option %s=%r", name, options.pop(name))
    accepted = ("device_index", "soc", "stream_limit")
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ConfigError(
            f"unknown npu device option(s) {', '.join(unknown)}; valid options: {', '.join(accepted)}", key="device"
        )
    return NpuDevice(**options)
