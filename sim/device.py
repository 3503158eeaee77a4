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
workers) never see each other, with one exception. Eager kernels run on CPU tensors that do
not say which device issued them, so they check contracts under one process-wide policy
(`sim.kernels.activate`): the newest device's float32 leniency and lazy-initialisation rule;
an eager launch marks its kernel shape initialised on every live device. A block that
needs another device's policy sets it with `sim.kernels.contract_policy` (a ContextVar, per
thread and task).

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
from sim.replay import ReplayMixin, _EagerWait
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
        # (the simulator's convention). The torch_npu facade answers with its pinned host copies
        # (sim.facade.pinned): reading those during a capture is host work, not a device sync.
        self.host_memory: Optional[Callable[[torch.Tensor], bool]] = None
        self.contracts = kernels.ContractPolicy.from_options(
            allow_float32_attention=self.allow_float32_attention,
            lazy_kernel_init=bool(options.get("lazy_kernel_init", True)),
        )
        kernels.activate(self.contracts)  # eager kernels are process-wide: the newest device's policy
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
        self._torch_device = torch.device("meta" if self.meta_tensors else "cpu")
        self._stream_ids = itertools.count(0)
        self._default = SimStream(self, next(self._stream_ids), "stream 0 (default)")
        self._streams: list[SimStream] = [self._default]
        self._capture_stream: Optional[SimStream] = None
        self._tls = threading.local()
        self._busy: set[SimStream] = set()
        self._event_ids = itertools.count(1)
        self._graph_ids = itertools.count(1)
        self._pool_ids = itertools.count(1)
        self._hold_ids = itertools.count(1)
        self._pools: dict[int, SimPool] = {}
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
        kernels.activate(self.contracts)

    # ------------------------------------------------------------------ basics
    @property
    def torch_device(self) -> torch.device:
        return self._torch_device

    def open_work(self) -> list[str]:
        """What is open on this device right now, in words: a task update, a capture (and a
        task group open in it). Empty when nothing is."""
        found = []
        if self._update is not None:
            found.append(f"a task update of {self._update.group.name} on {self._update.stream}")
        capture = self._capture
        if capture is not None:
            group = f", with a task group open on {capture.open_group[0]}" if capture.open_group is not None else ""
            found.append(f"the capture of {capture.graph.name} on {capture.stream}{group}")
        return found

    def abandon_open_work(self) -> list[str]:
        """Close whatever a caller left open, as leaving it by an exception does: the task
        update is discarded (its group keeps its previous parameters), the capture is aborted
        (`_abort_capture`: no graph, streams and pool bytes given back), and their modes come
        off torch's mode stacks wherever they sit (`sim.mode_stack`), so later ops run eagerly
        again. Returns what was open, in words (`open_work`)."""
        found = self.open_work()
        self.abandon_task_update()
        capture = self._capture
        if capture is not None:
            self.abandon_task_group()
            self._abort_capture(capture.graph)
        return found

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

    def graph_pools(self) -> list[SimPool]:  # the pools alive (sim.memory_ledger reads them)
        return list(self._pools.values())

    def empty_cache(self) -> None:
        """Graph pools are not returned by empty_cache (as on the device): a no-op."""
        self._check_alive()

    def memory_allocated(self) -> int:
        return self._pool_bytes()

    def _host_sync_check(self, what: str) -> None:
        capture = self._capture
        if capture is not None:
            raise capture.host_sync_error(what)

    def warmup_scope(self) -> ContextManager[WarmupMode]:
        """A context for work whose results are discarded (the engine's warm-ups): kernels are
        launched at their shapes (contracts checked, lazy initialisation marked) and their
        outputs only shaped, not computed (`sim.warmup`)."""
        self._check_alive()
        return warmup_scope(self)

    def synchronize(self) -> None:
        """Wait for all streams. A replay suspended at an unrecorded ExternalEvent would
        block for ever on the device: here it raises GraphHang naming graph and event."""
        self._check_alive()
        self._host_sync_check("device.synchronize()")
        self._fault("synchronize")
        self._synchronize_streams(list(self._busy), what="device.synchronize()")
        self._host_us = max(self._host_us, self._device_us)

    def _synchronize_streams(self, streams: list[SimStream], *, what: str) -> None:
        self._check_alive()
        self._host_sync_check(what)
        self._surface_stale()
        for stream in streams:
            if not stream.pending:
                continue
            head = stream.pending[0]
            if isinstance(head, _EagerWait):
                raise GraphHang(GRAPH_HANG_STREAM.format(stream=stream, event=head.event))
            raise GraphHang(GRAPH_HANG_REPLAY.format(graph=head.graph.name, event=head.waiting_on))

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
            if pool._arena is not None:
                allocation = pool._arena.allocation_of(tensor)
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
        suspended = sum(1 for s in self._busy for item in s.pending if isinstance(item, ReplayRun))
        return DeviceStats(
            streams_in_use=self._ledger.in_use,
            stream_limit=self._ledger.budget,
            graphs_alive=self._graphs_alive,
            graphs_captured_total=self._captured_total,
            pool_bytes=pool_bytes,
            allocated_bytes=pool_bytes,
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

