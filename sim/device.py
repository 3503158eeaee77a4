"""SimDevice: the CPU simulator behind ``get_device("sim")``.

Theory of operation. Tensors live on the CPU and eager ops run when issued. What the
simulator adds is the device's *graph* behaviour, enforced the way torch_npu enforces it:

* capture records instead of running (`sim.recorder`, `sim.capture`), rejects what the
  device cannot capture (SEMANTICS §12), charges streams like the planner
  (`sim.budget`) and accounts the graph pool;
* replay re-runs the recording on the captured tensors with the captured host values,
  suspending at ExternalEvent waits nobody has recorded yet;
* task updates re-issue the ops of a task group with new arguments;
* failpoints (`sim.faults`) make any of that fail the way real stacks fail;
* a virtual clock (`sim.cost`) prices eager launches, graph launches and device tasks.

All state lives on the device object: two devices in one process (or in pytest-xdist
workers) never see each other.

Pool-memory model: a graph's footprint is the bytes of the fresh storages allocated while
it was captured (no reuse inside a capture). A pool costs the largest footprint of the
graphs alive in it (graphs sharing a pool reuse its blocks, as vLLM captures the largest
size first), and the device's pool bytes are the sum over pools.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections import deque
import contextlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, NamedTuple, Optional, Union

import torch

from ascendgraph.device import CAPTURE_ERROR_MODES, DeviceProfile, DeviceStats
from ascendgraph.errors import (
    CAPTURE_END_OTHER_STREAM,
    CONCURRENT_CAPTURE,
    DEFAULT_STREAM_CAPTURE,
    EXTERNAL_EVENT_NOT_RESET,
    GRAPH_HANG_REPLAY,
    GRAPH_HANG_STREAM,
    HOST_SYNC_DURING_CAPTURE,
    TASK_GROUP_MISUSE,
    TASK_QUEUE_2_DURING_CAPTURE,
    TASK_UPDATE_MISMATCH,
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_ALLOC_SQ_CQ,
    TEXT_DEVICE_LOST,
    TEXT_EL0009,
    TEXT_NPU_OOM,
    TEXT_STREAMS_INSUFFICIENT,
    UNKNOWN_CAPTURE_ERROR_MODE,
    CaptureConstraintError,
    ConfigError,
    DeviceLost,
    GraphHang,
)
from sim.budget import StreamLedger
from sim.capture import COPY_MANY, COPY_ONE, Capture, Program, TaskGroup, Update, modes_off
from sim.cost import CostModel
from sim.faults import Action, FaultPlan, Term, fault_error
from sim.graph import CAPTURED, CAPTURING, IDLE, GraphHold, ReplayRun, SimGraph
from sim.profiles import DEFAULT_PROFILE, SimProfile, get_profile
from sim.recorder import EagerTracker, OpInfo, classify
from sim.streams import SimEvent, SimExternalEvent, SimStream

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
    "hccl_op_expansion_mode": "HCCL's collective expansion (AIV, or anything else: FFTS+) pricing captured "
    "collectives in streams (default: HCCL_OP_EXPANSION_MODE of env)",
    "meta_tensors": "tensors live on the meta device: captures still count streams, pool bytes and "
    "virtual time, but no memory is held and nothing computes (planning only; default False)",
}
STREAM_ERROR_VARIANTS = ("207008", "el0009")
# torch_npu's NPUGraph.super_kernel_optimize(optimize_options=...) keys (2.13); accepted, not modelled.
SUPER_KERNEL_OPTION_KEYS = frozenset({
    "preload_code", "split_mode", "stream_fusion", "constant_codegen", "auto_op_parallel", "opt_extend",
    "dcci_before_kernel_start", "dcci_after_kernel_end", "dcci_disable_on_kernel", "aggressive_opt_strategies",
    "ubuf_lock_ignore_kernel", "early_start",
})
_NO_CONTEXT = contextlib.nullcontext()


@dataclass(frozen=True)
class SimPoolHandle:
    """Opaque graph memory-pool handle (graph_pool_handle() or graph.pool())."""

    device_uid: int
    pool_id: int


class SimPool:
    __slots__ = ("handle", "shared", "footprints")

    def __init__(self, handle: SimPoolHandle, shared: bool) -> None:
        self.handle = handle
        self.shared = shared
        self.footprints: dict[int, int] = {}

    @property
    def bytes(self) -> int:
        return max(self.footprints.values(), default=0)


class KernelRecord(NamedTuple):
    """One executed task on the virtual clock (what a profiler turns into CSV rows).

    ``graph`` is the graph's name for replayed tasks and None for eager ops.
    """

    name: str
    op_type: str
    stream_id: int
    start_us: float
    duration_us: float
    input_shapes: tuple
    input_dtypes: tuple
    output_shapes: tuple
    output_dtypes: tuple
    graph: Optional[str]
    flops: float
    bytes: float
    block_dim: int = 0  # cores the kernel launched on (a super kernel: the largest of its parts)
    parts: tuple = ()  # a super kernel: names of the kernels merged into it


class TraceSpan(NamedTuple):
    """A device activity that is not a kernel, on the virtual clock (kept while profiling).

    ``kind``: "capture" (a graph recorded on its capture stream), "replay" (a graph's
    launch to its last kernel, on the replaying stream — its kernels lie inside), "wait"
    (a replay suspended at an ExternalEvent until the event was recorded) or
    "task_update" (a task group's kernels re-issued on the update stream).
    """

    kind: str
    name: str
    stream_id: int
    start_us: float
    duration_us: float
    graph: Optional[str]


class _EagerWait:
    """An eager wait on an unrecorded ExternalEvent, blocking its stream."""

    __slots__ = ("event",)

    def __init__(self, event: SimExternalEvent) -> None:
        self.event = event


class SimProfileSession:
    """What ``device.profile(...)`` yields: the kernel records of the profiled region."""

    def __init__(self, device: "SimDevice", output_dir: str, start: int, options: dict[str, Any]) -> None:
        self.device = device
        self.output_dir = output_dir
        self.options = options
        self._start = start
        self._stop: Optional[int] = None

    @property
    def records(self) -> list[KernelRecord]:
        return self.device.kernel_records[self._start : self._stop]


class SimDevice:
    """The CPU simulator device (see the module docstring)."""

    name = "sim"

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
        self._env: Mapping[str, str] = options.get("env") if options.get("env") is not None else os.environ
        self.seed = int(options.get("seed", 0))
        self.allow_rng_in_capture = bool(options.get("allow_rng_in_capture", False))
        self.poison_capture_outputs = bool(options.get("poison_capture_outputs", True))
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

    def _capture_collective(self, capture: Capture, func: Any, group: str) -> None:
        """A collective of ``group`` is being captured: its graph holds the group's streams."""
        if self._ledger.add_collective(capture.charge, group):
            return
        if self.profile.old_hdk:
            raise self._stream_exhausted(self._ledger.in_use)
        tail = TEXT_EL0009 if self.stream_error == "el0009" else TEXT_STREAMS_INSUFFICIENT
        raise RuntimeError(
            f"HCCL {self._ledger.expansion} expansion of {func} (group {group!r}) captured in {capture.graph.name} "
            f"needs {self._ledger.collective_cost(capture.charge, group)} more streams, "
            f"{self._ledger.in_use} of {self._ledger.budget} are in use\n{tail}"
        )

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

    def _external_record(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        self._check_alive()
        stream = stream or self._current()
        capture = self._capture
        if capture is not None and stream is capture.stream:
            capture.control("record", event)
            return
        term = self._fault("event_record", stream_id=stream.stream_id)
        if term is not None and term.action is Action.HANG:
            return  # the record never reaches the device
        if event.flag:
            raise RuntimeError(EXTERNAL_EVENT_NOT_RESET.format(event=event))
        event.flag = True
        self._wake(event)

    def _external_wait(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        self._check_alive()
        stream = stream or self._current()
        capture = self._capture
        if capture is not None and stream is capture.stream:
            capture.control("wait", event)
            return
        if event.flag and not stream.pending:
            return
        stream.pending.append(_EagerWait(event))
        self._busy.add(stream)

    def _external_reset(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        self._check_alive()
        stream = stream or self._current()
        capture = self._capture
        if capture is not None and stream is capture.stream:
            capture.control("reset", event)
            return
        event.flag = False

    def _wake(self, event: SimExternalEvent) -> None:
        for stream in list(self._busy):
            head = stream.pending[0] if stream.pending else None
            waiting = head.event if isinstance(head, _EagerWait) else getattr(head, "waiting_on", None)
            if waiting is event:
                self._drain(stream)

    def _drain(self, stream: SimStream) -> None:
        pending = stream.pending
        while pending:
            head = pending[0]
            if isinstance(head, _EagerWait):
                if not head.event.flag:
                    return
                pending.popleft()
                continue
            if head.waiting_on is not None:
                if not head.waiting_on.flag:
                    return
                head.waiting_on = None
            if not self._advance(head, stream):
                return
            pending.popleft()
        self._busy.discard(stream)

    # ------------------------------------------------------------------ graphs: capture
    def new_graph(self, name: Optional[str] = None) -> SimGraph:
        self._check_alive()
        return SimGraph(self, name or f"graph#{next(self._graph_ids)}")

    def graph_pool_handle(self) -> SimPoolHandle:
        handle = SimPoolHandle(self.uid, next(self._pool_ids))
        self._pools[handle.pool_id] = SimPool(handle, shared=True)
        return handle

    def _default_capture_stream(self) -> SimStream:
        if self._capture_stream is None:
            self._capture_stream = self.new_stream()
            self._capture_stream.name += " (capture)"
        return self._capture_stream

    @contextmanager
    def graph(
        self,
        graph: SimGraph,
        *,
        pool: Optional[SimPoolHandle] = None,
        stream: Optional[SimStream] = None,
        capture_error_mode: str = "global",
        graph_kind: str = "full",
    ) -> Iterator[None]:
        """Capture the block into ``graph`` on ``stream`` (default: a side stream).

        Like torch_npu's ``graph.__enter__`` it synchronizes first (a suspended replay
        raises GraphHang here). An exception inside the block aborts the capture and
        leaves nothing behind. ``graph_kind`` ("full" | "piecewise") selects the stream
        charge of the StreamPlan.
        """
        if not isinstance(graph, SimGraph) or graph.device is not self:
            raise ConfigError(f"{graph!r} is not a graph of this device; use device.new_graph()", key="graph")
        if self._capture is None:
            self.synchronize()
        with self.stream(stream or self._default_capture_stream()):
            graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode, graph_kind=graph_kind)
            try:
                yield
                graph.capture_end()
            except BaseException:
                if graph.state == CAPTURING:
                    self._abort_capture(graph)
                raise

    def is_current_stream_capturing(self) -> bool:
        capture = self._capture
        return capture is not None and self._current() is capture.stream

    def _stream_exhausted(self, stream_id: int) -> RuntimeError:
        if self.profile.old_hdk:
            return RuntimeError(TEXT_ALLOC_SQ_CQ.format(stream_id=stream_id))
        tail = TEXT_EL0009 if self.stream_error == "el0009" else TEXT_STREAMS_INSUFFICIENT
        return RuntimeError(TEXT_207008_CAPTURE_BEGIN + "\n" + tail)

    def _capture_begin(
        self, graph: SimGraph, *, pool: Optional[SimPoolHandle], capture_error_mode: str, graph_kind: str
    ) -> None:
        self._check_alive()
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise CaptureConstraintError(UNKNOWN_CAPTURE_ERROR_MODE.format(mode=capture_error_mode))
        graph._transition("capture_begin")
        self._ledger.check_kind(graph_kind)
        stream = self._current()
        if stream is self._default:
            raise CaptureConstraintError(DEFAULT_STREAM_CAPTURE)
        if self._capture is not None:
            raise CaptureConstraintError(CONCURRENT_CAPTURE.format(other=self._capture.graph.name))
        if str(self._env.get("TASK_QUEUE_ENABLE", "")).strip() == "2":
            raise CaptureConstraintError(TASK_QUEUE_2_DURING_CAPTURE)
        target = self._pool_for(pool)
        self._fault("capture_begin", stream_id=self._ledger.in_use)
        charge = self._ledger.begin_graph(graph_kind)
        if charge is None:
            raise self._stream_exhausted(self._ledger.in_use)
        capture = Capture(
            self, graph, stream, charge=charge, pool=target,
            poison=self.poison_capture_outputs, allow_rng=self.allow_rng_in_capture,
        )
        graph.generation += 1
        graph.kind = graph_kind
        graph.state = CAPTURING
        graph.capture = capture
        self._capture = capture
        try:
            capture.start()
        except BaseException:
            self._abort_capture(graph)
            raise

    def _pool_for(self, handle: Optional[SimPoolHandle]) -> SimPool:
        if handle is None:
            private = SimPoolHandle(self.uid, next(self._pool_ids))
            return SimPool(private, shared=False)
        if not isinstance(handle, SimPoolHandle) or handle.device_uid != self.uid:
            raise ConfigError(
                f"pool {handle!r} does not belong to this device; use device.graph_pool_handle() "
                "or graph.pool() of a graph of this device",
                key="pool",
            )
        pool = self._pools.get(handle.pool_id)
        if pool is None:  # the handle of a private pool whose graphs were all reset
            pool = self._pools[handle.pool_id] = SimPool(handle, shared=True)
        return pool

    def _capture_malloc(self, capture: Capture, nbytes: int) -> None:
        self._fault("malloc", size_bytes=nbytes)
        pool = capture.pool
        projected = self._pool_bytes() - pool.bytes + max(pool.bytes, capture.fresh_bytes + nbytes)
        if projected > self.profile.memory_bytes:
            raise torch.OutOfMemoryError(
                TEXT_NPU_OOM.format(size=f"{nbytes / 2**20:.2f} MiB")
                + f" (graph pools would hold {projected} bytes of the {self.profile.memory_bytes} "
                "the device has)"
            )

    def _capture_end(self, graph: SimGraph) -> None:
        graph._transition("capture_end")
        capture = self._capture
        assert capture is not None and capture.graph is graph
        if self._current() is not capture.stream:
            raise CaptureConstraintError(CAPTURE_END_OTHER_STREAM)
        capture.stop()
        if capture.open_group is not None:
            self._abort_capture(graph)
            raise CaptureConstraintError(
                TASK_GROUP_MISUSE.format(
                    what="capture_end",
                    detail=f"a task group opened on {capture.open_group[0]} was never closed; "
                    "call task_group_end before ending the capture (the capture was discarded)",
                )
            )
        try:
            self._fault("capture_end", stream_id=self._ledger.in_use)
            program = Program(capture.records, self.cost)
        except BaseException:
            self._abort_capture(graph)
            raise
        pool = capture.pool
        if not pool.shared:
            self._pools[pool.handle.pool_id] = pool
        token = next(self._hold_ids)
        pool.footprints[token] = capture.fresh_bytes
        hold = GraphHold(capture.charge, pool, token, capture.fresh_bytes)
        graph._hold = hold
        graph._finalizer = weakref.finalize(graph, self._release_hold, hold)
        graph._pool_handle = pool.handle
        graph.program = program
        graph.pool_bytes = capture.fresh_bytes
        graph.capture = None
        graph.state = CAPTURED
        graph.capture_wall_s = time.perf_counter() - capture.started
        graph.capture_time_us = self.cost.capture_us(program.num_tasks)
        if self._profiling:
            self.trace_spans.append(
                TraceSpan("capture", f"capture {graph.name}", capture.stream.stream_id, self._host_us,
                          graph.capture_time_us, graph.name)
            )
        self._host_us += graph.capture_time_us
        self._capture_time_us += graph.capture_time_us
        self._fallback_ops += capture.fallback_ops
        self._graphs_alive += 1
        self._captured_total += 1
        self._capture = None

    def _abort_capture(self, graph: SimGraph) -> None:
        """Undo a capture under way: no records, streams and pool bytes given back."""
        capture = graph.capture
        if capture is None:
            return
        capture.stop()
        self._ledger.release(capture.charge)
        graph.capture = None
        graph.state = IDLE
        graph.generation += 1
        if self._capture is capture:
            self._capture = None

    def _release_hold(self, hold: GraphHold) -> None:
        if hold.released:
            return
        hold.released = True
        self._ledger.release(hold.charge)
        pool = hold.pool
        pool.footprints.pop(hold.token, None)
        if not pool.shared and not pool.footprints:
            self._pools.pop(pool.handle.pool_id, None)
        self._graphs_alive -= 1

    def _reset_graph(self, graph: SimGraph) -> None:
        graph._transition("reset")
        if graph.state == CAPTURING:
            self._abort_capture(graph)
            return
        if graph.state == CAPTURED:
            for stream in list(self._busy):
                kept = [item for item in stream.pending if getattr(item, "graph", None) is not graph]
                if len(kept) != len(stream.pending):
                    stream.pending = deque(kept)
                    self._drain(stream)
            if graph._finalizer is not None:
                graph._finalizer()
            graph._hold = None
            graph._finalizer = None
            graph.program = None
            graph.pool_bytes = 0
            graph.state = IDLE
            graph.generation += 1

    # ------------------------------------------------------------------ graphs: replay
    def _replay(self, graph: SimGraph) -> None:
        self._check_alive()
        graph._transition("replay")
        stream = self._current()
        term = self._fault("replay", stream_id=stream.stream_id)
        program = graph.program
        assert program is not None
        graph.replays += 1
        self._replays += 1
        self._host_us += self.cost.graph_launch_us(program.num_kernels)
        run = ReplayRun(graph, program)
        if term is not None and term.action is Action.HANG:
            run.waiting_on = SimExternalEvent(self, f"an injected hang at replay of {graph.name}")
        if run.waiting_on is not None or stream.pending:
            stream.pending.append(run)
            self._busy.add(stream)
            return
        if not self._advance(run, stream):
            stream.pending.append(run)
            self._busy.add(stream)

    def _advance(self, run: ReplayRun, stream: SimStream) -> bool:
        """Run a replay from where it stands; False when it suspends at a wait."""
        segments = run.program.segments
        count = len(segments)
        index = run.segment
        recorded: list[SimExternalEvent] = []
        finished = True
        # Replays inside this device's own capture are recorded (a child graph); any other
        # mode (an eager tracker, another device's capture) must not see graph tasks.
        quiet = modes_off() if self._capture is None else _NO_CONTEXT
        with quiet, torch._C._AutoDispatchBelowADInplaceOrView():
            while index < count:
                segment = segments[index]
                for call, args, kwargs, mode, target in segment.entries:
                    result = call(*args, **kwargs) if kwargs else call(*args)
                    if mode == COPY_ONE:
                        target.copy_(result)
                    elif mode == COPY_MANY:
                        _copy_many(target, result)
                start = max(self._device_us, self._host_us)
                if self._profiling:
                    self._log_tasks(segment.kernels, start, stream.stream_id, run.graph.name)
                    self._mark_replay(run, stream, start)
                self._device_us = start + segment.time_us
                index += 1
                control = segment.control
                if control is None:
                    continue
                event = control.event
                if control.kind == "wait":
                    if not event.flag:
                        run.waiting_on = event
                        finished = False
                        break
                elif control.kind == "reset":
                    event.flag = False
                else:
                    event.flag = True
                    recorded.append(event)
        run.segment = index
        if self._profiling:
            self._end_replay_part(run, stream, finished)
        for event in recorded:
            self._wake(event)
        return finished

    def _mark_replay(self, run: ReplayRun, stream: SimStream, start: float) -> None:
        """Trace: note a replay's first kernel; close the wait a resumed replay sat in."""
        mark = self._replay_marks.get(id(run))
        if mark is None:
            self._replay_marks[id(run)] = (start, None, "")
        elif mark[1] is not None:
            self.trace_spans.append(
                TraceSpan("wait", f"wait {mark[2]}", stream.stream_id, mark[1], start - mark[1], run.graph.name)
            )
            self._replay_marks[id(run)] = (mark[0], None, "")

    def _end_replay_part(self, run: ReplayRun, stream: SimStream, finished: bool) -> None:
        mark = self._replay_marks.get(id(run))
        if mark is None:
            return
        if finished:
            del self._replay_marks[id(run)]
            self.trace_spans.append(
                TraceSpan("replay", f"replay {run.graph.name}", stream.stream_id, mark[0], self._device_us - mark[0],
                          run.graph.name)
            )
        else:
            self._replay_marks[id(run)] = (mark[0], self._device_us, str(run.waiting_on))

    def _log_tasks(self, tasks: list, start: float, stream_id: int, graph: Optional[str]) -> None:
        clock = start
        append = self.kernel_records.append
        for task in tasks:
            append(
                KernelRecord(
                    task.name, task.op_type, stream_id, clock, task.duration_us, task.input_shapes,
                    task.input_dtypes, task.output_shapes, task.output_dtypes, graph, task.flops, task.bytes,
                    task.block_dim, task.parts,
                )
            )
            clock += task.duration_us

    # ------------------------------------------------------------------ task groups
    def _misuse(self, what: str, detail: str) -> CaptureConstraintError:
        return CaptureConstraintError(TASK_GROUP_MISUSE.format(what=what, detail=detail))

    def task_group_begin(self, stream: SimStream) -> None:
        self._check_alive()
        capture = self._capture
        if capture is None or stream is not capture.stream:
            raise self._misuse(
                "task_group_begin", f"{stream} is not capturing; open task groups on the capturing stream"
            )
        if capture.open_group is not None:
            raise self._misuse(
                "task_group_begin", f"a task group is already open on {stream}; close it with task_group_end"
            )
        capture.group_begin(stream)

    def task_group_end(self, stream: SimStream) -> TaskGroup:
        self._check_alive()
        capture = self._capture
        if capture is None or capture.open_group is None or capture.open_group[0] is not stream:
            raise self._misuse("task_group_end", f"no task group is open on {stream}; call task_group_begin first")
        return capture.group_end(capture.graph.generation)

    def task_update_begin(self, stream: SimStream, handle: TaskGroup) -> None:
        self._check_alive()
        if not isinstance(handle, TaskGroup) or handle.graph.device is not self:
            raise self._misuse("task_update_begin", f"{handle!r} is not a task-group handle of this device")
        capture = self._capture
        if capture is not None and stream is capture.stream:
            raise self._misuse("task_update_begin", f"{stream} is capturing; update on another stream")
        graph = handle.graph
        if graph.state != CAPTURED or graph.generation != handle.generation:
            raise self._misuse(
                "task_update_begin",
                f"{handle.name} belongs to a capture that no longer exists (the graph was reset or "
                "captured again); use the handles of the current capture",
            )
        if self._update is not None:
            raise self._misuse(
                "task_update_begin", f"an update of {self._update.group.name} is still open; call task_update_end"
            )
        update = Update(self, handle, stream)
        update.collector.__enter__()
        self._update = update

    def task_update_end(self, stream: SimStream) -> None:
        update = self._update
        if update is None or update.stream is not stream:
            raise self._misuse("task_update_end", f"no task update is open on {stream}; call task_update_begin first")
        self._update = None
        update.collector.__exit__(None, None, None)
        self._check_alive()
        term = self._fault("task_update", stream_id=stream.stream_id)
        if term is not None and term.action is Action.SKIP_UPDATE:
            return
        program = update.group.graph.program
        assert program is not None
        detail = update.mismatch(program.records)
        if detail is not None:
            raise CaptureConstraintError(TASK_UPDATE_MISMATCH.format(group=update.group.name, detail=detail))
        for record_index, (_, args, kwargs) in zip(update.group.record_indices, update.calls):
            program.replace(record_index, args, kwargs)
        cost_us = self.cost.params.host_launch_us * len(update.calls)
        if self._profiling:
            self.trace_spans.append(
                TraceSpan("task_update", f"update {update.group.name}", stream.stream_id, self._host_us, cost_us,
                          update.group.graph.name)
            )
        self._host_us += cost_us

    # ------------------------------------------------------------------ memory, sync
    def _pool_bytes(self) -> int:
        return sum(pool.bytes for pool in self._pools.values())

    def empty_cache(self) -> None:
        """Graph pools are not returned by empty_cache (as on the device): a no-op."""
        self._check_alive()

    def memory_allocated(self) -> int:
        return self._pool_bytes()

    def _host_sync_check(self, what: str) -> None:
        capture = self._capture
        if capture is not None:
            raise CaptureConstraintError(HOST_SYNC_DURING_CAPTURE.format(what=what, graph=capture.graph.name))

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
        for stream in streams:
            if not stream.pending:
                continue
            head = stream.pending[0]
            if isinstance(head, _EagerWait):
                raise GraphHang(GRAPH_HANG_STREAM.format(stream=stream, event=head.event))
            raise GraphHang(GRAPH_HANG_REPLAY.format(graph=head.graph.name, event=head.waiting_on))

    def weak_ref(self, tensor: torch.Tensor) -> torch.Tensor:
        """An alias of ``tensor`` (``detach()``): it shares the storage and, unlike
        torch_npu's ``_weak_ref_tensor``, keeps it alive. Plain torch has no non-owning CPU
        alias that fails safely: one built over a raw address would read freed memory
        (or crash the test process) instead of failing a test."""
        return tensor.detach()

    # ------------------------------------------------------------------ clock, profiling, stats
    def _charge_eager(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        outputs = out if isinstance(out, (tuple, list)) else [out]
        task = self.cost.task(func, args, kwargs, [o for o in outputs if isinstance(o, torch.Tensor)])
        self._host_us += self.cost.params.host_launch_us
        start = max(self._device_us, self._host_us)
        self._device_us = start + task.duration_us
        if self._profiling:
            self._log_tasks([task], start, self._current().stream_id, None)

    @contextmanager
    def track_eager(self) -> Iterator[None]:
        """Charge the eager ops issued in the block to the virtual clock (and the kernel
        log while profiling). Outside it eager ops are free: nothing intercepts them."""
        self._check_alive()
        with EagerTracker(self):
            yield

    @contextmanager
    def profiling(self, output_dir: str, **options: Any) -> Iterator[SimProfileSession]:
        """Keep a KernelRecord per task executed in the block (replayed or tracked eager).
        Writing op_statistic.csv / kernel_details.csv from them is the profiler's job.

        (The Device protocol names this ``profile(...)``, which the ``profile`` attribute —
        the DeviceProfile — shadows on every device; hence the different name.)"""
        session = SimProfileSession(self, output_dir, len(self.kernel_records), options)
        previous = self._profiling
        self._profiling = True
        self._sessions += 1
        try:
            yield session
        finally:
            self._sessions -= 1
            self._profiling = previous
            session._stop = len(self.kernel_records)

    def xlite_runtime(self, model: Any, spec: Any) -> Any:
        """The xlite stand-in (`sim.xlite.SimXliteRuntime`): the model run eagerly into a
        hidden-state buffer of ``spec.budget`` rows; refuses batches over the budget."""
        from sim.xlite import SimXliteRuntime

        self._check_alive()
        return SimXliteRuntime(self, model, spec)

    def stream_names(self) -> dict[int, str]:
        """Stream id -> name of every stream of the device (profile track names)."""
        return {stream.stream_id: stream.name for stream in self._streams}

    @property
    def records_kernels(self) -> bool:
        """Whether executed tasks are kept as KernelRecords right now."""
        return self._profiling

    def set_record_kernels(self, enabled: bool = True) -> None:
        """Keep (or stop keeping) a KernelRecord per executed task outside profiling() too."""
        self._profiling = bool(enabled) or self._sessions > 0

    def discard_kernel_records(self) -> bool:
        """Drop the kernel records and trace spans kept so far — unless a profiling() session
        is open (its records are indexes into them). Returns whether they were dropped."""
        if self._sessions:
            return False
        del self.kernel_records[:]
        del self.trace_spans[:]
        self._replay_marks.clear()
        return True

    # ------------------------------------------------------------------ static and super kernels
    def install_static_kernels(self, kernels: Mapping[tuple, str]) -> None:
        """Make fixed-shape kernels available (a static-kernel build: signature -> kernel id,
        see `sim.cost.task_signature`). Graphs captured from now on run a task whose signature
        is installed as that static kernel; earlier captures keep the kernels they had."""
        self.cost.static_kernels.update(kernels)

    @property
    def static_kernels(self) -> dict[tuple, str]:
        return dict(self.cost.static_kernels)

    def super_kernel_optimize(self, graph: SimGraph, optimize_options: Optional[dict[str, Any]] = None) -> int:
        """Merge each run of two or more consecutive static kernels of a captured graph into one
        super kernel (torch_npu's ``NPUGraph.super_kernel_optimize``; only fixed-shape binaries
        can be fused, and a graph event wait ends a run). Returns how many super kernels."""
        self._check_alive()
        if not isinstance(graph, SimGraph) or graph.device is not self:
            raise ConfigError(f"{graph!r} is not a graph of this device; use device.new_graph()", key="graph")
        if optimize_options is not None:
            if not isinstance(optimize_options, dict):
                raise TypeError("optimize_options param must be dict or None.")
            for key in optimize_options:
                if key not in SUPER_KERNEL_OPTION_KEYS:
                    raise ValueError(f"Invalid optimize_options param key: '{key}'.")
        if graph.state != CAPTURED or graph.program is None:
            raise CaptureConstraintError(
                f"super_kernel_optimize needs a captured graph; {graph.name} is {graph.state} (optimise after capture_end)"
            )
        from sim.cost import STATIC_KERNEL_TAG

        return graph.program.merge_runs(
            lambda task: task.op_type.endswith(STATIC_KERNEL_TAG), f"super_kernel_{graph.name.replace('#', '')}"
        )

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
                "capture_fallback_ops": self._fallback_ops,
                "kernel_records": len(self.kernel_records),
                "device_lost": self._lost_at is not None,
            },
        )

    def __repr__(self) -> str:
        return f"<SimDevice #{self.uid} {self.profile.name}>"


def _copy_many(targets: tuple, results: Any) -> None:
    for target, value in zip(targets, results):
        if target is None:
            continue
        if isinstance(target, torch.Tensor):
            target.copy_(value)
        else:
            for t, v in zip(target, value):
                t.copy_(v)
