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

Pool-memory model: see `sim.pools`.

The device is one class assembled from cohesive parts:

    sim.capturing    CaptureMixin     device.graph(), capture_begin/end, pools, abort, release
    sim.replay       ReplayMixin      replay, ExternalEvent record/wait/reset, suspended streams
    sim.task_groups  TaskGroupMixin   task groups, task updates, stale-parameter detection
    sim.tracing      TracingMixin     kernel log, trace spans, profiling, static / super kernels
    sim.pools        SimPool(Handle)  graph memory pools
"""
from __future__ import annotations

import itertools
import logging
import os
import threading
from contextlib import contextmanager
from typing import Any, Callable, ContextManager, Iterator, Mapping, Optional, Union

import torch

from ascendgraph.device import (
    DeviceProfile,
    DeviceStats,
    FaultInjection,
    Float32Attention,
    HcclExpansionMode,
    KernelLog,
    KernelPrecheck,
    StaticKernels,
    SuperKernels,
    VirtualClock,
    WarmupScope,
)
from ascendgraph.errors import (
    GRAPH_HANG_REPLAY,
    GRAPH_HANG_STREAM,
    TEXT_DEVICE_LOST,
    ConfigError,
    DeviceLost,
    GraphHang,
    StaleGraphParams,
)
from sim.budget import StreamLedger
from sim.capture import Capture, Update
from sim.capturing import CaptureMixin
from sim.cost import CostModel
from sim import kernels
from sim.faults import Action, FaultPlan, Term, fault_error
from sim.graph import ReplayRun
from sim.pool_memory import PoolAllocation, PoolWeakTensor
from sim.pools import SimPool, SimPoolHandle
from sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from sim.recorder import OpInfo, classify
from sim.replay import ReplayMixin
from sim.queues import StreamQueues
from sim.memory import DeviceMemory, MemoryOwner
from sim.streams import SimEvent, SimExternalEvent, SimStream
from sim.task_groups import TaskGroupMixin
from sim.tracing import SUPER_KERNEL_OPTION_KEYS, KernelRecord, TraceSpan, TracingMixin
from sim.warmup import WarmupMode, warmup_scope

__all__ = ["SimDevice", "SimPoolHandle", "KernelRecord", "TraceSpan", "OPTIONS", "SUPER_KERNEL_OPTION_KEYS"]

logger = logging.getLogger(__name__)

# Keyword options SimDevice accepts besides profile / stream_limit / faults / cost_model.
OPTIONS = {
    "env": "mapping read for TASK_QUEUE_ENABLE at capture_begin (default: os.environ)",
    "seed": "seed of the fault plan's percentage draws (default 0)",
    "allow_rng_in_capture": "record RNG ops instead of rejecting them (default False)",
    "poison_capture_outputs": "fill fresh capture outputs with NaN until the first replay (default True)",
    "stream_error": "'207008' (default) or 'el0009': which CANN line a stream exhaustion carries",
    "record_kernels": "keep a KernelRecord per executed task from the start (default False)",
    "allow_float32_attention": "declared leniency (docs/decisions.md, 'float32 on the simulator'): accept float32 where the kernels take only "
    "float16/bfloat16 (an NPU would refuse it; default False)",
    "lazy_kernel_init": "model the workspace allocation of a kernel's first launch per shape, refused "
    "inside a capture (so captures need warm-ups; default True)",
    "require_task_updates": "a replay that executes a task group not updated since that replay began raises "
    "StaleGraphParams (default True; False leaves stale parameters to the check against eager)",
    "hccl_op_expansion_mode": "HCCL's collective expansion (AIV, or anything else: FFTS+) pricing captured "
    "collectives in streams (default: HCCL_OP_EXPANSION_MODE of env)",
    "meta_tensors": "tensors live on the meta device: captures still count streams, pool bytes and "
    "virtual time, but no memory is held and nothing computes (planning only; default False)",
    "torch_device": "the torch device the device's tensors live on: 'cpu' (default: CPU tensors stand for device "
    "memory) or 'npu' (the torch_npu facade's simulated NPU, sim.npu_device; set device_type too)",
    "lag": "when queued device work runs (sim.queues): 'device' (default, what a card does: when the host waits for "
    "it) or 'immediate' (as soon as it is issued: the host waits for every item)",
}
STREAM_ERROR_VARIANTS = ("207008", "el0009")


class SimDevice(CaptureMixin, ReplayMixin, TaskGroupMixin, TracingMixin):
    """The CPU simulator device (see the module docstring)."""

    name = "sim"
    # The optional capabilities of ascendgraph.device the simulator provides (the conformance suite checks them).
    capabilities = (FaultInjection, KernelLog, VirtualClock, WarmupScope, StaticKernels, SuperKernels,
                    HcclExpansionMode, Float32Attention, KernelPrecheck)

    def __init__(
        self,
        profile: Union[str, SimProfile, DeviceProfile] = DEFAULT_PROFILE,
        stream_limit: Optional[int] = None,
        faults: Union[None, str, FaultPlan] = None,
        cost_model: Optional[CostModel] = None,
        **options: Any,
    ) -> None:
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise ConfigError(
                f"unknown SimDevice option(s) {', '.join(unknown)}; valid options: "
                + "; ".join(f"{k} ({v})" for k, v in OPTIONS.items()),
                key="device",
            )
        self.sim_profile = get_profile(profile)
        self.profile: DeviceProfile = self.sim_profile.device
        if stream_limit is not None and (isinstance(stream_limit, bool) or not isinstance(stream_limit, int) or stream_limit < 1):
            raise ConfigError(f"stream_limit must be a positive integer, got {stream_limit!r}", key="stream_limit")
        self.uid = id(self)
        self.cost = cost_model or CostModel(self.sim_profile.cost)
        env = options.get("env")
        self._env: Mapping[str, str] = env if env is not None else os.environ
        self.seed = int(options.get("seed", 0))
        self.allow_rng_in_capture = bool(options.get("allow_rng_in_capture", False))
        self.poison_capture_outputs = bool(options.get("poison_capture_outputs", True))
        self.allow_float32_attention = bool(options.get("allow_float32_attention", False))
        # Which tensors live in host memory: None means every tensor stands for device memory
        # (the simulator's convention). A device backing the npu device type (the torch_npu
        # facade's) answers by the tensor's device: reading a CPU tensor during a capture is host
        # work, not a device sync.
        self.host_memory: Optional[Callable[[torch.Tensor], bool]] = None
        self.contracts = kernels.ContractPolicy.from_options(
            allow_float32_attention=self.allow_float32_attention,
            lazy_kernel_init=bool(options.get("lazy_kernel_init", True)),
        )
        kernels.register(self.contracts)  # eager kernels in this device's scopes use it (`kernel_policy`)
        self.stream_error = str(options.get("stream_error", "207008")).lower()
        if self.stream_error not in STREAM_ERROR_VARIANTS:
            raise ConfigError(
                f"stream_error must be one of {', '.join(STREAM_ERROR_VARIANTS)}, got {self.stream_error!r}",
                key="stream_error",
            )
        self._ledger = StreamLedger(
            stream_limit or self.profile.stream_limit,
            reserved_streams=self.profile.reserved_streams,
            expansion_mode=options.get("hccl_op_expansion_mode") or self._env.get("HCCL_OP_EXPANSION_MODE"),
        )
        self._faults: Optional[FaultPlan] = None
        self.set_fault_plan(faults)

        # meta_tensors (planning): same shapes, strides and byte counts, no storage, no compute.
        self.meta_tensors = bool(options.get("meta_tensors", False))
        self._torch_device = torch.device("meta" if self.meta_tensors else str(options.get("torch_device") or "cpu"))
        # The torch device type this device backs (sim.npu_device.NpuDeviceType), or None for CPU
        # tensors: captures and task updates ask it where an op's tensors live.
        self.device_type: Optional[Any] = None
        self._stream_ids = itertools.count(0)
        self._default = SimStream(self, next(self._stream_ids), "stream 0 (default)")
        self._streams: list[SimStream] = [self._default]
        self._capture_stream: Optional[SimStream] = None
        self._tls = threading.local()
        self.queues = StreamQueues(_QueueRunner(self), lag=str(options.get("lag", "device")))
        self._event_ids = itertools.count(1)
        self._graph_ids = itertools.count(1)
        self._pool_ids = itertools.count(1)
        self._hold_ids = itertools.count(1)
        self._pools: dict[int, SimPool] = {}
        self.memory = DeviceMemory(_DeviceMemoryOwner(self))
        self._ops: dict[Any, OpInfo] = {}

        self._capture: Optional[Capture] = None
        self._update: Optional[Update] = None
        self._graphs_alive = 0
        self._captured_total = 0
        self._replays = 0
        self.require_task_updates = bool(options.get("require_task_updates", True))
        self._stamps = itertools.count(1)  # orders replay launches and applied task updates
        self._stale: list[StaleGraphParams] = []  # noted by replays, raised at the next host contact
        self._fallback_ops = 0
        self._lost_at: Optional[str] = None

        self._host_us = 0.0
        self._device_us = 0.0
        self._capture_time_us = 0.0
        self.kernel_records: list[KernelRecord] = []
        self.trace_spans: list[TraceSpan] = []
        self._sessions = 0  # open profiling() sessions
        self._profiling = bool(options.get("record_kernels", False))
        self._replay_marks: dict[int, tuple[float, Optional[float], str]] = {}  # id(run) -> (start, wait start, event)

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

    def _check_alive(self) -> None:
        if self._lost_at is not None:
            raise DeviceLost(TEXT_DEVICE_LOST.format(site=self._lost_at))

    def _op_info(self, func: Any) -> OpInfo:
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
        self._ledger.set_plan(plan)

    def set_hccl_op_expansion_mode(self, mode: Optional[str]) -> None:
        """HCCL's expansion mode for the collectives captured from now on (AIV or FFTS+)."""
        self._ledger.set_expansion_mode(mode)

    def _fault(self, site: str, *, stream_id: int = 0, size_bytes: int = 0) -> Optional[Term]:
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
            self._host_us += term.delay_ms * 1000.0
            return None
        if term.action is Action.HANG and site not in ("replay", "event_record"):
            raise GraphHang(
                GRAPH_HANG_STREAM.format(stream=self._current(), event=f"an injected hang at {site}")
            )
        return term

    # ------------------------------------------------------------------ streams and events
    def _current(self) -> SimStream:
        return getattr(self._tls, "stream", None) or self._default

    def current_stream(self) -> SimStream:
        return self._current()

    def default_stream(self) -> SimStream:
        return self._default

    def new_stream(self) -> SimStream:
        self._check_alive()
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

    def new_event(self) -> SimEvent:
        return SimEvent(self, f"event#{next(self._event_ids)}")

    def new_external_event(self) -> SimExternalEvent:
        return SimExternalEvent(self, f"external event#{next(self._event_ids)}")

    # ------------------------------------------------------------------ memory, sync
    def _pool_bytes(self) -> int:
        # A copy: a graph's finalizer (garbage collection during the sum) may drop its pool.
        return sum(pool.bytes for pool in list(self._pools.values()))

    def empty_cache(self) -> None:
        """Give back the device pool's cached free segments (`sim.memory`); graph pools stay, as on the device."""
        self.memory.empty_cache()

    def memory_allocated(self) -> int:
        """Bytes handed out: the device pool's blocks and the graph pools (`sim.memory.DeviceMemory`)."""
        return self.memory.allocated_bytes()

    def _host_sync_check(self, what: str) -> None:
        capture = self._capture
        if capture is not None:
            raise capture.host_sync_error(what)

    def warmup_scope(self) -> ContextManager[WarmupMode]:
        """A context for work whose results are discarded (the engine's warm-ups): kernels are
        launched at their shapes (contracts checked, lazy initialisation marked) and their
        outputs only shaped, not computed (`sim.warmup`)."""
        self._check_alive()
        return _within(self.kernel_policy(), warmup_scope(self))

    def synchronize(self) -> None:
        """Wait for all streams. A replay suspended at an unrecorded ExternalEvent would
        block for ever on the device: here it raises GraphHang naming graph and event."""
        self._check_alive()
        self._host_sync_check("device.synchronize()")
        self._fault("synchronize")
        self.queues.flush(reason="device.synchronize()")
        self._host_us = max(self._host_us, self._device_us)

    def _synchronize_streams(self, streams: list[SimStream], *, what: str) -> None:
        self._check_alive()
        self._host_sync_check(what)
        for stream in streams:
            self.queues.flush(stream, reason=what)

    def host_read(self, what: str) -> None:
        """The host is about to read device memory (``what``: the call, for messages): inside a
        capture that is the host-sync error; otherwise the current stream's queued work runs
        first, as ``.item()`` on a card copies on the current stream and waits for it."""
        self._check_alive()
        self._host_sync_check(what)
        self.queues.flush(self._current(), reason=what)
        self._host_us = max(self._host_us, self._device_us)

    def host_access(self, tensor: torch.Tensor, what: str, *, write: bool = False) -> None:
        """The host is about to read (``write=True``: write) ``tensor``'s host memory: a queued
        non-blocking copy that fills it (or reads it) and that nothing waited for is a
        ``StreamOrderError`` (`sim.queues.StreamQueues.check_host_access`)."""
        self.queues.check_host_access(tensor.data_ptr(), tensor.numel() * tensor.element_size(), what, write=write)

    def capturing_stream(self) -> Optional[SimStream]:
        """The stream a capture is recording on right now, or None."""
        capture = self._capture
        return capture.stream if capture is not None else None

    def weak_ref(self, tensor: torch.Tensor) -> torch.Tensor:
        """torch_npu's ``_weak_ref_tensor`` on the simulator. A tensor on a graph-pool block
        (a capture output) gets a `sim.pool_memory.PoolWeakTensor`: it does not keep the block
        allocated, and an op on it raises once its graph was reset or another graph of the pool
        wrote the block. Any other tensor gets an alias (``detach()``) that, unlike torch_npu's,
        keeps its storage alive: plain torch has no non-owning CPU alias of ordinary memory that
        fails safely (one over a raw address would read freed memory or crash the process)."""
        allocation = self.pool_allocation(tensor)
        if allocation is not None:
            return PoolWeakTensor(tensor, allocation)
        if isinstance(tensor, PoolWeakTensor):
            return tensor
        return tensor.detach()

    def pool_allocation(self, tensor: torch.Tensor) -> Optional[PoolAllocation]:
        """The live graph-pool block ``tensor`` lies on (handed to a capture), or None."""
        if type(tensor) is not torch.Tensor or tensor.device.type == "meta":
            return None
        pools = list(self._pools.values())
        if self._capture is not None:
            pools.append(self._capture.pool)
        for pool in pools:
            if pool.has_arena:
                allocation = pool.arena.allocation_of(tensor)
                if allocation is not None:
                    return allocation
        return None

    # ------------------------------------------------------------------ clock, profiling, stats
    def xlite_runtime(self, model: Any, spec: Any) -> Any:
        """The xlite stand-in (`sim.xlite.SimXliteRuntime`): the model run eagerly into a
        hidden-state buffer of ``spec.budget`` rows; refuses batches over the budget."""
        from sim.xlite import SimXliteRuntime

        self._check_alive()
        return SimXliteRuntime(self, model, spec)

    def collective_fabric(self, layout: Any, *, seed: int = 0, timeout_s: Optional[float] = 1836.0) -> Any:
        """A `sim.fabric.Fabric` stepping the rank programs of ``layout`` (docs/ranks.md): how the
        runtime, which never imports ``sim``, reaches the in-process collective fabric."""
        from sim.fabric import Fabric

        return Fabric(layout, seed=seed, timeout_s=timeout_s)

    @property
    def host_clock_us(self) -> float:
        """The virtual host clock (injected delays included), read by the multi-rank runner."""
        return self._host_us

    def clock(self) -> tuple[float, float]:
        """(host clock, device clock) in virtual microseconds."""
        return self._host_us, self._device_us

    def stats(self) -> DeviceStats:
        pool_bytes = self._pool_bytes()
        suspended = sum(1 for s in self.queues.busy_streams() for queued in s.pending if isinstance(queued.item, ReplayRun))
        return DeviceStats(
            streams_in_use=self._ledger.in_use,
            stream_limit=self._ledger.budget,
            graphs_alive=self._graphs_alive,
            graphs_captured_total=self._captured_total,
            pool_bytes=pool_bytes,
            allocated_bytes=self.memory.allocated_bytes(),
            virtual_time_us=max(self._host_us, self._device_us),
            extra={
                "profile": self.profile.name,
                "host_time_us": self._host_us,
                "device_time_us": self._device_us,
                "capture_time_us": self._capture_time_us,
                "replays": self._replays,
                "suspended_replays": suspended,
                "capturing": self._capture is not None,
                "stream_plan": self._ledger.plan is not None,
                "graph_streams": self._ledger.in_use - self._ledger.reserved,
                "reserved_streams": self._ledger.reserved,
                "hccl_expansion": self._ledger.expansion,
                "user_streams": len(self._streams) - 1,
                "pools": len(self._pools),
                # host memory behind the graph pools (sim.pool_memory): shared blocks, about the largest graph
                "pool_host_bytes": sum(pool.arena_bytes for pool in list(self._pools.values())),
                "capture_fallback_ops": self._fallback_ops,
                "kernel_records": len(self.kernel_records),
                "device_lost": self._lost_at is not None,
            },
        )

    def __repr__(self) -> str:
        return f"<SimDevice #{self.uid} {self.profile.name}>"



@contextmanager
def _within(outer: ContextManager[Any], inner: ContextManager[Any]) -> Iterator[Any]:
    with outer, inner as value:
        yield value


class _QueueRunner:
    """What `sim.queues.StreamQueues` needs from its device: run a replay, report stale parameters."""

    __slots__ = ("_device",)

    def __init__(self, device: SimDevice) -> None:
        self._device = device

    def advance(self, run: Any, stream: SimStream) -> bool:
        return self._device._advance(run, stream)

    def surface_stale(self) -> None:
        self._device._surface_stale()

    def host_clock_us(self) -> float:
        return self._device._host_us

    def released(self, run: Any, event: Any) -> None:
        self._device._stale_at_release(run, event)


class _DeviceMemoryOwner(MemoryOwner):
    """What `sim.memory.DeviceMemory` needs from its device: the limit, the graph pools, the capture."""

    __slots__ = ("_device",)

    def __init__(self, device: SimDevice) -> None:
        self._device = device

    def memory_limit(self) -> int:
        return int(self._device.profile.memory_bytes)

    def graph_pool_bytes(self) -> int:
        """The graph pools' bytes, the capture under way included (its pool as it would stand now)."""
        device = self._device
        total = device._pool_bytes()
        capture = device._capture
        if capture is not None:
            pool = capture.pool
            held = pool.bytes if device._pools.get(pool.handle.pool_id) is pool else 0
            total += max(held, capture.fresh_bytes) - held
        return total

    def capture_allocate(self, nbytes: int, stream: Optional[SimStream]) -> Optional[int]:
        device = self._device
        capture = device._capture
        if capture is None or (stream or device._current()) is not capture.stream:
            return None
        return capture.allocate_raw(nbytes)

    def capture_free(self, address: int) -> bool:
        device = self._device
        pools = list(device._pools.values())
        if device._capture is not None:
            pools.append(device._capture.pool)
        for pool in pools:
            if pool.has_arena and pool.arena.release_raw(address):
                return True
        return False

    def stream_id(self, stream: Optional[SimStream]) -> int:
        return (stream or self._device._current()).stream_id

    def consult_malloc_fault(self, nbytes: int) -> None:
        self._device._fault("malloc", size_bytes=nbytes)

    def check_alive(self) -> None:
        self._device._check_alive()

    def has_memory(self) -> bool:
        return not self._device.meta_tensors
