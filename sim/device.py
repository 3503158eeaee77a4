"""SimDevice: the CPU simulator behind ``get_device("sim")``.

Theory of operation. Tensors live on the CPU and eager ops run when issued. What the
simulator adds is the device's *graph* behaviour, enforced the way torch_npu enforces it:

* capture records instead of running (`sim.recorder`, `sim.capture`), rejects what the
  device cannot capture (docs/semantics.md §12), charges streams like the planner
  (`sim.budget`) and accounts the graph pool;
* replay re-runs the recording on the captured tensors with the captured host values,
  suspending at ExternalEvent waits nobody has recorded yet;
* task updates re-issue the ops of a task group with new arguments;
* failpoints (`sim.faults`) make any of that fail the way real stacks fail;
* a virtual clock (`sim.cost`) prices eager launches, graph launches and device tasks.

All state lives on the device object: two devices in one process (or in pytest-xdist
workers) never see each other. One exception is the eager kernels' contract policy outside
every device scope: the kernels are process-wide (torch.library), so an eager kernel that runs
outside ``track_eager`` / ``warmup_scope`` / ``kernel_policy`` takes the newest device's policy
(`sim.kernels`).

The device owns its parts as components, each a module with its own theory of operation; it
hands them to one another and calls them only through their public methods:

    device.memory       sim.memory       DeviceMemory   the caching allocator: the device pool, by address
    device.pools        sim.pools        GraphPools     graph pools, their footprints and host memory
    device.queues       sim.queues       StreamQueues   per-stream queues of device work, lag, ordering hazards
    device.virtual_clock sim.clock       VirtualClock   host and device clocks, the order of events
    device.trace        sim.tracing      Trace          kernel log and trace spans
    device.ledger       sim.budget       StreamLedger   the stream budget
    device.captures     sim.capturing    Captures       capture_begin / capture_end, abort, release
    device.replays      sim.replay       Replays        replays, ExternalEvent record / wait / reset
    device.task_groups  sim.task_groups  TaskGroups     task groups, task updates, stale parameters

`SimDevice` keeps what is the device's own (profile, options, streams, the fault plan, the op
classification cache) and the Device protocol's methods, which delegate.
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Mapping, Optional, Union

import torch

from ascendgraph.device import (
    CollectiveFabric,
    DeviceProfile,
    DeviceStats,
    FaultInjection,
    Float32Attention,
    HcclExpansionMode,
    KernelLog,
    KernelPrecheck,
    StaticKernels,
    SuperKernels,
    VirtualClock as VirtualClockCapability,
    WarmupScope,
)
from ascendgraph.errors import GRAPH_HANG_STREAM, TEXT_DEVICE_LOST, ConfigError, DeviceLost, GraphHang
from sim import kernels
from sim.budget import StreamLedger
from sim.capture import TaskGroup
from sim.capturing import Captures
from sim.clock import VirtualClock
from sim.cost import CostModel
from sim.faults import Action, FaultPlan, Term, fault_error
from sim.graph import ReplayRun, SimGraph
from sim.memory import DeviceMemory, DeviceMemoryOwner
from sim.options import OPTIONS, check_option_names, stream_error
from sim.pool_memory import PoolAllocation, PoolWeakTensor
from sim.pools import GraphPools, SimPoolHandle
from sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from sim.queues import DeviceRunner, StreamQueues
from sim.recorder import EagerTracker, OpInfo, classify
from sim.replay import Replays
from sim.streams import SimEvent, SimExternalEvent, SimStream
from sim.task_groups import TaskGroups
from sim.tracing import (
    SUPER_KERNEL_OPTION_KEYS,
    KernelRecord,
    SimProfileSession,
    Trace,
    TraceSpan,
    check_super_kernel_options,
    merge_super_kernels,
)
from sim.warmup import WarmupMode, warmup_scope

if TYPE_CHECKING:
    from sim.fabric import Fabric

__all__ = ["SimDevice", "SimPoolHandle", "KernelRecord", "TraceSpan", "OPTIONS", "SUPER_KERNEL_OPTION_KEYS"]

logger = logging.getLogger(__name__)



class SimDevice:
    """The CPU simulator device (see the module docstring)."""

    name = "sim"
    # The optional capabilities of ascendgraph.device the simulator provides (the conformance suite checks them).
    capabilities = (FaultInjection, KernelLog, VirtualClockCapability, WarmupScope, StaticKernels, SuperKernels,
                    HcclExpansionMode, Float32Attention, KernelPrecheck, CollectiveFabric)

    def __init__(
        self,
        profile: Union[str, SimProfile, DeviceProfile] = DEFAULT_PROFILE,
        stream_limit: Optional[int] = None,
        faults: Union[None, str, FaultPlan] = None,
        cost_model: Optional[CostModel] = None,
        **options: Any,
    ) -> None:
        check_option_names(options)
        self.sim_profile = get_profile(profile)
        self.profile: DeviceProfile = self.sim_profile.device
        if stream_limit is not None and (isinstance(stream_limit, bool) or not isinstance(stream_limit, int) or stream_limit < 1):
            raise ConfigError(f"stream_limit must be a positive integer, got {stream_limit!r}", key="stream_limit")
        self.uid = id(self)
        self.cost = cost_model or CostModel(self.sim_profile.cost)
        env = options.get("env")
        self.env: Mapping[str, str] = env if env is not None else os.environ
        self.seed = int(options.get("seed", 0))
        self.allow_rng_in_capture = bool(options.get("allow_rng_in_capture", False))
        self.poison_capture_outputs = bool(options.get("poison_capture_outputs", True))
        self.allow_float32_attention = bool(options.get("allow_float32_attention", False))
        self.require_task_updates = bool(options.get("require_task_updates", True))
        # Host tensors (None: all stand for device memory); the device type backed (sim.npu_device).
        self.host_memory: Optional[Callable[[torch.Tensor], bool]] = None
        self.device_type: Optional[Any] = None
        self.contracts = kernels.ContractPolicy.from_options(
            allow_float32_attention=self.allow_float32_attention,
            lazy_kernel_init=bool(options.get("lazy_kernel_init", True)),
        )
        kernels.register(self.contracts)  # eager kernels in this device's scopes use it (`kernel_policy`)
        self.stream_error = stream_error(options)
        self.ledger = StreamLedger(
            stream_limit or self.profile.stream_limit,
            reserved_streams=self.profile.reserved_streams,
            expansion_mode=options.get("hccl_op_expansion_mode") or self.env.get("HCCL_OP_EXPANSION_MODE"),
        )
        self._faults: Optional[FaultPlan] = None
        self._lost_at: Optional[str] = None
        self.set_fault_plan(faults)

        # meta_tensors (planning): same shapes, strides and byte counts, no storage, no compute.
        self.meta_tensors = bool(options.get("meta_tensors", False))
        self._torch_device = torch.device("meta" if self.meta_tensors else str(options.get("torch_device") or "cpu"))
        self._stream_ids = itertools.count(0)
        self._default = SimStream(self, next(self._stream_ids), "stream 0 (default)")
        self._streams: list[SimStream] = [self._default]
        self._tls = threading.local()
        self._event_ids = itertools.count(1)
        self._ops: dict[Any, OpInfo] = {}

        self.virtual_clock = VirtualClock()
        self.trace = Trace(self.virtual_clock, record=bool(options.get("record_kernels", False)))
        self.queues = StreamQueues(DeviceRunner(self), lag=str(options.get("lag", "device")))
        self.pools = GraphPools(self.uid)
        self.memory = DeviceMemory(DeviceMemoryOwner(self))
        self.captures = Captures(self)
        self.replays = Replays(self)
        self.task_groups = TaskGroups(self)

    def check_kernel_call(self, kernel: str, arguments: Mapping[str, Any]) -> None:
        """Pre-check one torch_npu kernel call against the contract table (KernelContractError)."""
        kernels.check_kernel_call(self.contracts, kernel, arguments)

    def allow_float32_attention_now(self) -> None:
        """Turn on the declared float32 leniency (docs/decisions.md) on a device made without it."""
        self.allow_float32_attention = True
        self.contracts.lenient = self.contracts.lenient | kernels.FLOAT32_LENIENT_RULES

    def kernel_policy(self) -> ContextManager[kernels.ContractPolicy]:
        """Eager kernels of the block use this device's contract policy (its leniencies, its
        lazy-initialisation record); `track_eager` and `warmup_scope` set it themselves."""
        return kernels.contract_policy(self.contracts)

    # ------------------------------------------------------------------ basics
    @property
    def torch_device(self) -> torch.device:
        return self._torch_device

    def check_alive(self) -> None:
        """``DeviceLost`` once an injected ``device_lost`` fault fired: every later call fails."""
        if self._lost_at is not None:
            raise DeviceLost(TEXT_DEVICE_LOST.format(site=self._lost_at))

    def op_info(self, func: Any) -> OpInfo:
        """How the simulator treats ``func`` (`sim.recorder.classify`), cached per device."""
        info = self._ops.get(func)
        if info is None:
            info = self._ops[func] = classify(func)
        return info

    def set_fault_plan(self, plan: Union[None, str, FaultPlan]) -> None:
        """Apply a fault plan (a spec string or a FaultPlan; None clears). The device keeps
        its own copy with fresh counters, seeded with the device's seed."""
        if plan is None:
            self._faults = None
        elif isinstance(plan, str):
            self._faults = FaultPlan.parse(plan, seed=self.seed)
        elif isinstance(plan, FaultPlan):
            self._faults = plan.fresh()
        else:
            raise ConfigError(f"faults must be a plan string or a FaultPlan, got {plan!r}", key="faults")

    @property
    def fault_plan(self) -> Optional[FaultPlan]:
        return self._faults

    def set_stream_plan(self, plan: Any) -> None:
        """The stack's stream limit is this `ascendgraph.sizes.StreamPlan`'s ``max_streams``
        (None: the device's own). Only the limit: graphs are charged from what they hold
        (`sim.budget`), never with the plan's per-graph figures."""
        self.ledger.set_plan(plan)

    def set_hccl_op_expansion_mode(self, mode: Optional[str]) -> None:
        """HCCL's expansion mode for the collectives captured from now on (AIV or FFTS+)."""
        self.ledger.set_expansion_mode(mode)

    def fault(self, site: str, *, stream_id: int = 0, size_bytes: int = 0) -> Optional[Term]:
        """Consult the fault plan at ``site``; raise / delay here, return hang / skip terms."""
        plan = self._faults
        if plan is None:
            return None
        term = plan.consult(site)
        if term is None:
            return None
        logger.debug("fault plan fires at %s: %s", site, term)
        if term.action is Action.RAISE:
            assert term.code is not None
            if term.code == "device_lost":
                self._lost_at = site
            raise fault_error(term.code, site=site, stream_id=stream_id, size_bytes=size_bytes)
        if term.action is Action.DELAY:
            self.virtual_clock.host_spends(term.delay_ms * 1000.0)
            return None
        if term.action is Action.HANG and site not in ("replay", "event_record"):
            raise GraphHang(
                GRAPH_HANG_STREAM.format(stream=self.current_stream(), event=f"an injected hang at {site}")
            )
        return term

    # ------------------------------------------------------------------ streams and events
    def current_stream(self) -> SimStream:
        return getattr(self._tls, "stream", None) or self._default

    def set_current_stream(self, stream: Optional[SimStream]) -> None:
        """Make ``stream`` this thread's current stream (None: the default stream), as torch_npu's
        ``set_stream`` does: not a context (`stream` is the context)."""
        if stream is not None and (not isinstance(stream, SimStream) or stream.device is not self):
            raise ConfigError(f"{stream!r} is not a stream of this device ({self!r})", key="stream")
        self._tls.stream = None if stream is self._default else stream

    def default_stream(self) -> SimStream:
        return self._default

    def new_stream(self) -> SimStream:
        self.check_alive()
        stream_id = next(self._stream_ids)
        stream = SimStream(self, stream_id, f"stream {stream_id}")
        self._streams.append(stream)
        return stream

    @contextmanager
    def stream(self, stream: Optional[SimStream]) -> Iterator[None]:
        """Make ``stream`` current for the block (None: no change)."""
        if stream is None:
            yield
            return
        if not isinstance(stream, SimStream) or stream.device is not self:
            raise ConfigError(f"{stream!r} is not a stream of this device ({self!r})", key="stream")
        previous = getattr(self._tls, "stream", None)
        self._tls.stream = stream
        try:
            yield
        finally:
            self._tls.stream = previous

    def stream_names(self) -> dict[int, str]:
        """Stream id -> name of every stream of the device (profile track names)."""
        return {stream.stream_id: stream.name for stream in self._streams}

    def new_event(self) -> SimEvent:
        return SimEvent(self, f"event#{next(self._event_ids)}")

    def new_external_event(self) -> SimExternalEvent:
        return SimExternalEvent(self, f"external event#{next(self._event_ids)}")

    # ------------------------------------------------------------------ graphs (sim.capturing, sim.replay, sim.task_groups)
    def new_graph(self, name: Optional[str] = None) -> SimGraph:
        return self.captures.new_graph(name)

    def graph_pool_handle(self) -> SimPoolHandle:
        return self.pools.new_shared()

    def graph(self, graph: SimGraph, *, pool: Optional[SimPoolHandle] = None, stream: Optional[SimStream] = None,
              capture_error_mode: str = "global", graph_kind: str = "full") -> ContextManager[None]:
        """Capture the block into ``graph`` on ``stream`` (default: a side stream).

        Like torch_npu's ``graph.__enter__`` it synchronizes first (a suspended replay
        raises GraphHang here). An exception inside the block aborts the capture and
        leaves nothing behind. ``graph_kind`` ("full" | "piecewise") selects the stream
        charge of the StreamPlan.
        """
        return self.captures.graph(graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode,
                                   graph_kind=graph_kind)

    def is_current_stream_capturing(self) -> bool:
        capture = self.captures.active
        return capture is not None and self.current_stream() is capture.stream

    @property
    def capture_in_progress(self) -> Any:
        """The `sim.capture.Capture` under way on this device, or None."""
        return self.captures.active

    @property
    def update_in_progress(self) -> Any:
        """The `sim.capture.Update` (task update) open on this device, or None."""
        return self.task_groups.open_update

    def open_work(self) -> list[str]:
        """What is open on this device right now, in words: a task update, a capture (and a
        task group open in it). Empty when nothing is."""
        found = []
        update = self.task_groups.open_update
        if update is not None:
            found.append(f"a task update of {update.group.name} on {update.stream}")
        capture = self.captures.active
        if capture is not None:
            group = f", with a task group open on {capture.open_group[0]}" if capture.open_group is not None else ""
            found.append(f"the capture of {capture.graph.name} on {capture.stream}{group}")
        return found

    def abandon_open_work(self) -> list[str]:
        """Close whatever a caller left open, as leaving it by an exception does: the task update
        is discarded (its group keeps its previous parameters), the capture is aborted (no graph;
        streams and pool bytes given back), and their modes come off torch's mode stacks
        (`sim.mode_stack`). Returns what was open, in words (`open_work`)."""
        found = self.open_work()
        self.task_groups.abandon_update()
        capture = self.captures.active
        if capture is not None:
            self.task_groups.abandon_group()
            self.captures.abort(capture.graph)
        return found

    def abandon_task_update(self) -> None:
        self.task_groups.abandon_update()

    def abandon_task_group(self) -> None:
        self.task_groups.abandon_group()

    def capturing_stream(self) -> Optional[SimStream]:
        """The stream a capture is recording on right now, or None."""
        capture = self.captures.active
        return capture.stream if capture is not None else None

    def task_group_begin(self, stream: SimStream) -> None:
        self.task_groups.group_begin(stream)

    def task_group_end(self, stream: SimStream) -> TaskGroup:
        return self.task_groups.group_end(stream)

    def task_update_begin(self, stream: SimStream, handle: TaskGroup) -> None:
        self.task_groups.update_begin(stream, handle)

    def task_update_end(self, stream: SimStream) -> None:
        self.task_groups.update_end(stream)

    # ------------------------------------------------------------------ memory, sync
    def empty_cache(self) -> None:
        """Give back the device pool's cached free segments (`sim.memory`); graph pools stay, as on the device."""
        self.memory.empty_cache()

    def memory_allocated(self) -> int:
        """Bytes handed out: the device pool's blocks and the graph pools (`sim.memory.DeviceMemory`)."""
        return self.memory.allocated_bytes()

    def check_host_sync(self, what: str) -> None:
        """``what`` synchronizes with the host: refused while a capture is under way."""
        capture = self.captures.active
        if capture is not None:
            raise capture.host_sync_error(what)

    def warmup_scope(self) -> ContextManager[WarmupMode]:
        """A context for work whose results are discarded (the engine's warm-ups): kernels are
        launched at their shapes (contracts checked, lazy initialisation marked) and their
        outputs only shaped, not computed (`sim.warmup`)."""
        self.check_alive()
        return _within(self.kernel_policy(), warmup_scope(self))

    def synchronize(self) -> None:
        """Wait for all streams. A replay suspended at an unrecorded ExternalEvent would
        block for ever on the device: here it raises GraphHang naming graph and event."""
        self.check_alive()
        self.check_host_sync("device.synchronize()")
        self.fault("synchronize")
        self.queues.flush(reason="device.synchronize()")
        self.virtual_clock.host_waits()

    def synchronize_stream(self, stream: SimStream) -> None:
        """Wait for ``stream`` (``stream.synchronize()``)."""
        what = f"{stream}.synchronize()"
        self.check_alive()
        self.check_host_sync(what)
        self.queues.flush(stream, reason=what)

    def host_read(self, what: str) -> None:
        """The host is about to read device memory (``what``: the call, for messages): inside a
        capture that is the host-sync error; otherwise the current stream's queued work runs
        first, as ``.item()`` on a card copies on the current stream and waits for it."""
        self.check_alive()
        self.check_host_sync(what)
        self.queues.flush(self.current_stream(), reason=what)
        self.virtual_clock.host_waits()

    def host_access(self, tensor: torch.Tensor, what: str, *, write: bool = False) -> None:
        """The host is about to read (``write=True``: write) ``tensor``'s host memory: a queued
        non-blocking copy that fills it (or reads it) and that nothing waited for is a
        ``StreamOrderError`` (`sim.queues.StreamQueues.check_host_access`)."""
        self.queues.check_host_access(tensor.data_ptr(), tensor.numel() * tensor.element_size(), what, write=write)

    def weak_ref(self, tensor: torch.Tensor) -> torch.Tensor:
        """torch_npu's ``_weak_ref_tensor`` on the simulator. A tensor on a graph-pool block
        (a capture output) gets a `sim.pool_memory.PoolWeakTensor`: it does not keep the block
        allocated, and an op on it raises once its graph was reset or another allocation wrote
        the block. Any other tensor gets an alias (``detach()``) that, unlike torch_npu's,
        keeps its storage alive: plain torch has no non-owning CPU alias of ordinary memory that
        fails safely (one over a raw address would read freed memory or crash the process)."""
        allocation = self.pool_allocation(tensor)
        if allocation is not None:
            return PoolWeakTensor(tensor, allocation)
        if isinstance(tensor, PoolWeakTensor):
            return tensor
        return tensor.detach()

    def graph_pools(self) -> list[Any]:
        """The graph pools alive (`sim.memory_ledger` reads them)."""
        return self.pools.all()

    def pool_allocation(self, tensor: torch.Tensor) -> Optional[PoolAllocation]:
        """The live graph-pool block ``tensor`` lies on (handed to a capture), or None."""
        if type(tensor) is not torch.Tensor or tensor.device.type == "meta":
            return None
        capture = self.captures.active
        return self.pools.allocation_of(tensor, also=capture.pool if capture is not None else None)

    # ------------------------------------------------------------------ trace (sim.tracing)
    @property
    def kernel_records(self) -> list[KernelRecord]:
        return self.trace.kernel_records

    @property
    def trace_spans(self) -> list[TraceSpan]:
        return self.trace.trace_spans

    @property
    def records_kernels(self) -> bool:
        """Whether executed tasks are kept as KernelRecords right now."""
        return self.trace.recording

    def set_record_kernels(self, enabled: bool = True) -> None:
        """Keep (or stop keeping) a KernelRecord per executed task outside profiling() too."""
        self.trace.set_recording(enabled)

    def discard_kernel_records(self) -> bool:
        """Drop the kernel records and trace spans kept so far — unless a profiling() session
        is open (its records are indexes into them). Returns whether they were dropped."""
        return self.trace.discard()

    def profiling(self, output_dir: str, **options: Any) -> ContextManager[SimProfileSession]:
        """Keep a KernelRecord per task executed in the block (replayed or tracked eager).
        Writing op_statistic.csv / kernel_details.csv from them is the profiler's job.

        (The Device protocol names this ``profile(...)``, which the ``profile`` attribute —
        the DeviceProfile — shadows on every device; hence the different name.)"""
        return self.trace.profiling(output_dir, **options)

    @contextmanager
    def track_eager(self) -> Iterator[None]:
        """Charge the eager ops issued in the block to the virtual clock (and the kernel log
        while recording); each first runs its stream's queued work (`sim.queues`). Outside it
        eager ops are free: nothing intercepts them."""
        self.check_alive()
        with self.kernel_policy(), EagerTracker(self):
            yield

    def charge_eager(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """An eager kernel ran under ``track_eager``: price it on the clock, log it while recording."""
        outputs = out if isinstance(out, (tuple, list)) else [out]
        task = self.cost.task(func, args, kwargs, [o for o in outputs if isinstance(o, torch.Tensor)])
        self.trace.charge_eager(task, self.cost.params.host_launch_us, self.current_stream().stream_id)

    # ------------------------------------------------------------------ static and super kernels
    def install_static_kernels(self, table: Mapping[tuple, str]) -> None:
        """Make fixed-shape kernels available (a static-kernel build: signature -> kernel id,
        see `sim.cost.task_signature`). Graphs captured from now on run a task whose signature
        is installed as that static kernel; earlier captures keep the kernels they had."""
        self.cost.static_kernels.update(table)

    @property
    def static_kernels(self) -> dict[tuple, str]:
        return dict(self.cost.static_kernels)

    @contextmanager
    def super_kernel_scope(self, scope_name: Optional[str] = None) -> Iterator[None]:
        """torch_npu's ``super_kernel_scope_begin/end`` around a captured region. The
        simulator notes the scope on the capture (``graph.info()["super_kernel_scopes"]``);
        `super_kernel_optimize` merges runs of static kernels whether or not a scope was open."""
        if scope_name is not None and (not isinstance(scope_name, str) or not scope_name.strip()):
            raise RuntimeError("scope_name should be None or a non-empty string.")
        capture = self.captures.active
        if capture is not None:
            capture.super_kernel_scopes.append(scope_name or "")
        yield

    def super_kernel_optimize(self, graph: SimGraph, optimize_options: Optional[dict[str, Any]] = None) -> int:
        """Merge each run of two or more consecutive static kernels of a captured graph into one
        super kernel (torch_npu's ``NPUGraph.super_kernel_optimize``; only fixed-shape binaries
        can be fused, and a graph event wait ends a run). Returns how many super kernels."""
        self.check_alive()
        if not isinstance(graph, SimGraph) or graph.device is not self:
            raise ConfigError(f"{graph!r} is not a graph of this device; use device.new_graph()", key="graph")
        check_super_kernel_options(optimize_options)
        return merge_super_kernels(graph)

    # ------------------------------------------------------------------ clock, stats
    def xlite_runtime(self, model: Any, spec: Any) -> Any:
        """The xlite stand-in (`sim.xlite.SimXliteRuntime`): the model run eagerly into a
        hidden-state buffer of ``spec.budget`` rows; refuses batches over the budget."""
        from sim.xlite import SimXliteRuntime

        self.check_alive()
        return SimXliteRuntime(self, model, spec)

    def collective_fabric(self, layout: Any, *, seed: int = 0, timeout_s: Optional[float] = 1836.0) -> "Fabric":
        """A `sim.fabric.Fabric` stepping the rank programs of ``layout`` (docs/ranks.md): how the
        runtime, which never imports ``sim``, reaches the in-process collective fabric."""
        from sim.fabric import Fabric

        return Fabric(layout, seed=seed, timeout_s=timeout_s)

    def clock(self) -> tuple[float, float]:
        """(host clock, device clock) in virtual microseconds."""
        return self.virtual_clock.host_us, self.virtual_clock.device_us

    def stats(self) -> DeviceStats:
        clock = self.virtual_clock
        ledger = self.ledger
        captures = self.captures
        queued_replays = sum(1 for s in self.queues.busy_streams() for queued in s.pending
                             if isinstance(queued.item, ReplayRun))
        return DeviceStats(
            streams_in_use=ledger.in_use,
            stream_limit=ledger.budget,
            graphs_alive=captures.graphs_alive,
            graphs_captured_total=captures.captured_total,
            pool_bytes=self.pools.bytes,
            allocated_bytes=self.memory.allocated_bytes(),
            virtual_time_us=clock.now_us,
            extra={
                "profile": self.profile.name,
                "host_time_us": clock.host_us,
                "device_time_us": clock.device_us,
                "capture_time_us": clock.capture_us,
                "replays": self.replays.count,
                "suspended_replays": queued_replays,  # replays queued or suspended on a stream
                "capturing": captures.active is not None,
                "stream_plan": ledger.plan is not None,
                "graph_streams": ledger.in_use - ledger.reserved,
                "reserved_streams": ledger.reserved,
                "hccl_expansion": ledger.expansion,
                "user_streams": len(self._streams) - 1,
                "pools": len(self.pools),
                # host memory behind the graph pools (sim.pool_memory): shared blocks, about the largest graph
                "pool_host_bytes": self.pools.host_bytes,
                "capture_fallback_ops": captures.fallback_ops,
                "kernel_records": len(self.trace.kernel_records),
                "device_lost": self._lost_at is not None,
            },
        )

    def __repr__(self) -> str:
        return f"<SimDevice #{self.uid} {self.profile.name}>"


@contextmanager
def _within(outer: ContextManager[Any], inner: ContextManager[Any]) -> Iterator[Any]:
    with outer, inner as value:
        yield value
