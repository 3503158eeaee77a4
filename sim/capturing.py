"""Capture on the simulator: the ``device.graph(...)`` context, capture_begin / capture_end,
the graph pool accounting of a capture, aborting a failed capture and releasing a graph.

A failed capture (an exception in the block, a fault at capture_begin / capture_end, an
OOM, a task-group rule) gives back every stream and byte it took: `_abort_capture`.

`CaptureMixin` is part of `sim.device.SimDevice`.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Optional, cast

import torch

from ascendgraph.device import CAPTURE_ERROR_MODES
from ascendgraph.errors import (
    CAPTURE_END_OTHER_STREAM,
    CONCURRENT_CAPTURE,
    DEFAULT_STREAM_CAPTURE,
    TASK_GROUP_MISUSE,
    TASK_QUEUE_2_DURING_CAPTURE,
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_ALLOC_SQ_CQ,
    TEXT_EL0009,
    TEXT_NPU_OOM,
    TEXT_STREAMS_INSUFFICIENT,
    UNKNOWN_CAPTURE_ERROR_MODE,
    CaptureConstraintError,
    ConfigError,
)
from sim.capture import Capture
from sim.program import Program
from sim.graph import CAPTURED, CAPTURING, IDLE, GraphHold, SimGraph
from sim.pools import SimPool, SimPoolHandle
from sim.streams import SimStream
from sim.tracing import TraceSpan

__all__ = ["CaptureMixin"]


if TYPE_CHECKING:  # the type checker reads the mixin as a part of SimDevice (sim.device_parts)
    from sim.device import SimDevice
    from sim.device_parts import DeviceParts as _Parts
else:
    _Parts = object


class CaptureMixin(_Parts):
    """Graph capture, pools, abort and release."""

    def new_graph(self, name: Optional[str] = None) -> SimGraph:
        self._check_alive()
        return SimGraph(cast("SimDevice", self), name or f"graph#{next(self._graph_ids)}")

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
            cast("SimDevice", self), graph, stream, charge=charge, pool=target,
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
        device_pool = self.memory.pool  # what the device's own pool holds counts too (sim.memory)
        if projected + device_pool.reserved_bytes > self.profile.memory_bytes:
            device_pool.release_cached()
        if projected + device_pool.reserved_bytes > self.profile.memory_bytes:
            held = f" and the device pool {device_pool.reserved_bytes}" if device_pool.reserved_bytes else ""
            raise torch.OutOfMemoryError(
                TEXT_NPU_OOM.format(size=f"{nbytes / 2**20:.2f} MiB")
                + f" (graph pools would hold {projected} bytes{held} of the {self.profile.memory_bytes} "
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
            capture.memory.finish()
            program = Program(capture.records, self.cost)
            program.mark_groups(capture.groups)
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
        graph._pool_blocks = tuple(capture.pool_blocks)
        graph._memory = capture.memory
        graph.pool_bytes = capture.fresh_bytes
        graph.super_kernel_scopes = tuple(capture.super_kernel_scopes)
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
        capture.memory.release()
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
        pool.trim()
        if not pool.shared and not pool.footprints:
            self._pools.pop(pool.handle.pool_id, None)
        self._graphs_alive -= 1

    def _reset_graph(self, graph: SimGraph) -> None:
        graph._transition("reset")
        if graph.state == CAPTURING:
            self._abort_capture(graph)
            return
        if graph.state == CAPTURED:
            self.queues.drop(lambda item: getattr(item, "graph", None) is not graph)
            if graph._finalizer is not None:
                graph._finalizer()
            graph._hold = None
            graph._finalizer = None
            graph.program = None
            graph._pool_blocks = ()
            if graph._memory is not None:
                graph._memory.release()
                graph._memory = None
            graph.pool_bytes = 0
            graph.state = IDLE
            graph.generation += 1
