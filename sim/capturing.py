"""Captures on the simulator (``device.captures``): capture_begin / capture_end, the ``device.graph``
context, the stream and memory a capture holds, aborting a failed capture and releasing a graph.

Theory of operation. At most one capture is under way per device (`active`); its `sim.capture.
Capture` records what the capturing stream issues. ``capture_begin`` checks torch_npu's rules
(a side stream, no second capture, ``TASK_QUEUE_ENABLE`` not 2), consults the failpoint and
charges the graph's stream (`sim.budget`); every fresh allocation of the capture goes through
`malloc` (the failpoint, the device's memory: graph pools plus the device pool, torch_npu's OOM
text); a captured collective charges its group's streams. ``capture_end`` turns the records into
a `sim.program.Program`, notes the graph's pool footprint and hold, and prices the capture on the
host clock. A failed capture (an exception in the block, a fault at capture_begin / capture_end,
an OOM, a task-group rule) gives back every stream and byte it took: `abort`. A graph's hold is
released exactly once, by ``reset`` or by garbage collection of the graph.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager
from itertools import count
from typing import TYPE_CHECKING, Any, Iterator, Optional

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
from sim import pool_checks
from sim.capture import Capture
from sim.graph import CAPTURED, CAPTURING, IDLE, GraphHold, SimGraph
from sim.pools import SimPoolHandle
from sim.program import Program
from sim.streams import SimStream

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["Captures"]


class Captures:
    """``device.captures`` (module docstring)."""

    def __init__(self, device: "SimDevice") -> None:
        self.device = device
        self.active: Optional[Capture] = None
        self.graphs_alive = 0
        self.captured_total = 0
        self.fallback_ops = 0  # ops without a meta kernel run at capture
        self._graph_ids = count(1)
        self._stream: Optional[SimStream] = None  # the side stream device.graph captures on by default

    def new_graph(self, name: Optional[str] = None) -> SimGraph:
        self.device.check_alive()
        return SimGraph(self.device, name or f"graph#{next(self._graph_ids)}")

    def default_stream(self) -> SimStream:
        if self._stream is None:
            self._stream = self.device.new_stream()
            self._stream.name += " (capture)"
        return self._stream

    @contextmanager
    def graph(self, graph: SimGraph, *, pool: Optional[SimPoolHandle], stream: Optional[SimStream],
              capture_error_mode: str, graph_kind: str) -> Iterator[None]:
        device = self.device
        if not isinstance(graph, SimGraph) or graph.device is not device:
            raise ConfigError(f"{graph!r} is not a graph of this device; use device.new_graph()", key="graph")
        if self.active is None:
            device.synchronize()
        with device.stream(stream or self.default_stream()):
            graph.capture_begin(pool=pool, capture_error_mode=capture_error_mode, graph_kind=graph_kind)
            try:
                yield
                graph.capture_end()
            except BaseException:
                if graph.state == CAPTURING:
                    self.abort(graph)
                raise

    def stream_exhausted(self, stream_id: int) -> RuntimeError:
        device = self.device
        if device.profile.old_hdk:
            return RuntimeError(TEXT_ALLOC_SQ_CQ.format(stream_id=stream_id))
        tail = TEXT_EL0009 if device.stream_error == "el0009" else TEXT_STREAMS_INSUFFICIENT
        return RuntimeError(TEXT_207008_CAPTURE_BEGIN + "\n" + tail)

    def collective(self, capture: Capture, func: Any, group: str) -> None:
        """A collective of ``group`` is being captured: its graph holds the group's streams."""
        device = self.device
        ledger = device.ledger
        if ledger.add_collective(capture.charge, group):
            return
        if device.profile.old_hdk:
            raise self.stream_exhausted(ledger.in_use)
        tail = TEXT_EL0009 if device.stream_error == "el0009" else TEXT_STREAMS_INSUFFICIENT
        raise RuntimeError(
            f"HCCL {ledger.expansion} expansion of {func} (group {group!r}) captured in {capture.graph.name} "
            f"needs {ledger.collective_cost(capture.charge, group)} more streams, "
            f"{ledger.in_use} of {ledger.budget} are in use\n{tail}"
        )

    def begin(self, graph: SimGraph, *, pool: Optional[SimPoolHandle], capture_error_mode: str, graph_kind: str) -> None:
        device = self.device
        device.check_alive()
        if capture_error_mode not in CAPTURE_ERROR_MODES:
            raise CaptureConstraintError(UNKNOWN_CAPTURE_ERROR_MODE.format(mode=capture_error_mode))
        graph.transition("capture_begin")
        device.ledger.check_kind(graph_kind)
        stream = device.current_stream()
        if stream is device.default_stream():
            raise CaptureConstraintError(DEFAULT_STREAM_CAPTURE)
        if self.active is not None:
            raise CaptureConstraintError(CONCURRENT_CAPTURE.format(other=self.active.graph.name))
        if str(device.env.get("TASK_QUEUE_ENABLE", "")).strip() == "2":
            raise CaptureConstraintError(TASK_QUEUE_2_DURING_CAPTURE)
        target = device.pools.for_capture(pool)
        device.fault("capture_begin", stream_id=device.ledger.in_use)
        charge = device.ledger.begin_graph(graph_kind)
        if charge is None:
            raise self.stream_exhausted(device.ledger.in_use)
        capture = Capture(
            device, graph, stream, charge=charge, pool=target,
            poison=device.poison_capture_outputs, allow_rng=device.allow_rng_in_capture,
        )
        graph.generation += 1
        graph.kind = graph_kind
        graph.state = CAPTURING
        graph.capture = capture
        self.active = capture
        try:
            capture.start()
        except BaseException:
            self.abort(graph)
            raise

    def malloc(self, capture: Capture, nbytes: int) -> None:
        """A fresh allocation of the capture: the failpoint, then the device's memory."""
        device = self.device
        device.fault("malloc", size_bytes=nbytes)
        pool = capture.pool
        pools = device.pools
        held = pool.bytes
        projected = pools.bytes - held + max(held, capture.fresh_bytes + nbytes)
        device_pool = device.memory.pool  # what the device's own pool holds counts too (sim.memory)
        limit = device.profile.memory_bytes
        if projected + device_pool.reserved_bytes <= limit:
            return
        device_pool.release_cached()
        if projected + device_pool.reserved_bytes > limit:
            also = f" and the device pool {device_pool.reserved_bytes}" if device_pool.reserved_bytes else ""
            raise torch.OutOfMemoryError(
                TEXT_NPU_OOM.format(size=f"{nbytes / 2**20:.2f} MiB")
                + f" (graph pools would hold {projected} bytes{also} of the {limit} the device has)"
            )

    def pool_bytes_now(self) -> int:
        """The graph pools' bytes, the capture under way included (its pool as it would stand now)."""
        pools = self.device.pools
        total = pools.bytes
        capture = self.active
        if capture is not None:
            pool = capture.pool
            held = pool.bytes if pools.is_kept(pool) else 0
            total += max(held, capture.fresh_bytes) - held
        return total

    def end(self, graph: SimGraph) -> None:
        device = self.device
        graph.transition("capture_end")
        capture = self.active
        assert capture is not None and capture.graph is graph
        if device.current_stream() is not capture.stream:
            raise CaptureConstraintError(CAPTURE_END_OTHER_STREAM)
        capture.stop()
        if capture.open_group is not None:
            self.abort(graph)
            raise CaptureConstraintError(
                TASK_GROUP_MISUSE.format(
                    what="capture_end",
                    detail=f"a task group opened on {capture.open_group[0]} was never closed; "
                    "call task_group_end before ending the capture (the capture was discarded)",
                )
            )
        try:
            device.fault("capture_end", stream_id=device.ledger.in_use)
            pool_checks.finish(capture.memory)
            program = Program(capture.records, device.cost)
            program.mark_groups(capture.groups)
        except BaseException:
            self.abort(graph)
            raise
        pool = capture.pool
        token = device.pools.hold(pool, capture.fresh_bytes)
        hold = GraphHold(capture.charge, pool, token, capture.fresh_bytes)
        graph.hold = hold
        graph.finalizer = weakref.finalize(graph, self.release_hold, hold)
        graph.pool_handle = pool.handle
        graph.program = program
        graph.pool_blocks = tuple(capture.pool_blocks)
        graph.memory = capture.memory
        graph.pool_bytes = capture.fresh_bytes
        graph.super_kernel_scopes = tuple(capture.super_kernel_scopes)
        graph.capture = None
        graph.state = CAPTURED
        graph.capture_wall_s = time.perf_counter() - capture.started
        graph.capture_time_us = device.cost.capture_us(program.num_tasks)
        clock = device.virtual_clock
        device.trace.span("capture", f"capture {graph.name}", capture.stream.stream_id, clock.host_us,
                          graph.capture_time_us, graph.name)
        clock.host_spends(graph.capture_time_us)
        clock.capture_us += graph.capture_time_us
        self.fallback_ops += capture.fallback_ops
        self.graphs_alive += 1
        self.captured_total += 1
        self.active = None

    def abort(self, graph: SimGraph) -> None:
        """Undo a capture under way: no records, streams and pool bytes given back."""
        capture = graph.capture
        if capture is None:
            return
        capture.stop()
        self.device.ledger.release(capture.charge)
        capture.memory.release()
        self.device.pools.abandon(capture.pool)  # raw blocks a caller kept stay held until freed
        graph.capture = None
        graph.state = IDLE
        graph.generation += 1
        if self.active is capture:
            self.active = None

    def release_hold(self, hold: GraphHold) -> None:
        if hold.released:
            return
        hold.released = True
        self.device.ledger.release(hold.charge)
        self.device.pools.release(hold.pool, hold.token)
        self.graphs_alive -= 1

    def reset(self, graph: SimGraph) -> None:
        graph.transition("reset")
        if graph.state == CAPTURING:
            self.abort(graph)
            return
        if graph.state == CAPTURED:
            self.device.queues.drop(lambda item: getattr(item, "graph", None) is not graph)
            if graph.finalizer is not None:
                graph.finalizer()
            graph.hold = None
            graph.finalizer = None
            graph.program = None
            graph.pool_blocks = ()
            if graph.memory is not None:
                graph.memory.release()
                graph.memory = None
            graph.pool_bytes = 0
            graph.state = IDLE
            graph.generation += 1
