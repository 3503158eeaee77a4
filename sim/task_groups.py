"""Task groups and task updates on the simulator (``device.task_groups``: torch_npu's
graph_task_group_* and graph_task_update_*), and stale-parameter detection.

Theory of operation. While a stream captures, ``task_group_begin`` / ``_end`` name a run of the
capture's records (kernel tasks only, `sim.capture`). After capture, ``task_update_begin`` opens an
update of a group on another stream: the ops issued until ``task_update_end`` do not run but are
collected, checked against the group op for op, against the kernel contracts and against the
graph's pool memory at the group's place (`sim.pool_memory`), and their device side — the group's
tasks take the new arguments — is queued on the update stream (`sim.queues`), stamped when issued.
A replay that executes a group not updated since it was launched ran with an earlier batch's
parameters: noted when the replay reaches the group, or when the host issues the record that
releases the group's wait with no update issued since the launch, and raised once at the next
point the host hears from the device (`surface_stale`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ascendgraph.errors import (
    STALE_GRAPH_PARAMS,
    TASK_GROUP_MISUSE,
    TASK_UPDATE_MISMATCH,
    CaptureConstraintError,
    StaleGraphParams,
)
from sim.capture import TaskGroup, Update
from sim.program import Segment
from sim.faults import Action
from sim.graph import CAPTURED, ReplayRun
from sim.streams import SimStream
from sim import pool_checks
from sim.mode_stack import withdraw
from sim.pool_memory import enter_graph, leave_graph
from sim.queues import Work

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["TaskGroups"]


class TaskGroups:
    """``device.task_groups`` (module docstring)."""

    def __init__(self, device: "SimDevice") -> None:
        self.device = device
        self.open_update: Optional[Update] = None
        self.stale: list[StaleGraphParams] = []  # noted by replays, raised at the next host contact

    def check_fresh(self, run: ReplayRun, segment: Segment) -> None:
        """Note every task group starting in ``segment`` not updated since ``run`` was launched.

        vLLM Ascend updates every attention task group after every FULL replay, so a group
        executed without an update since its replay began ran with an earlier batch's
        parameters (docs/decisions.md "Stale FULL-graph parameters"). The replay still completes (the device does not stop for
        it); the error surfaces at the next point the host hears from the device."""
        for group in segment.groups:
            if group.updated_stamp < run.stamp:
                self.note_stale(run, group)

    def note_stale(self, run: ReplayRun, group: TaskGroup) -> None:
        if group.index in run.reported:
            return  # each stale group of a run is reported once
        run.reported.add(group.index)
        op = str(group.graph.program.records[group.record_indices[0]].func) if group.graph.program else "?"
        self.stale.append(
            StaleGraphParams(
                STALE_GRAPH_PARAMS.format(replay=run.number, graph=run.graph.name, group=f"task group {group.index}", op=op)
            )
        )

    def stale_at_release(self, run: ReplayRun, event: object) -> None:
        """The host issued the record that releases ``run``'s wait on ``event`` (the device runs
        behind it): a task group that wait gates and that no update issued since the replay's
        launch touched will run stale whatever comes next, since nothing the host issues from now
        on is ordered before it. Noted here, where the host is (the replay, when it runs, skips it)."""
        if not self.device.require_task_updates:
            return
        segments = run.program.segments
        waits = [index for index in range(run.segment, len(segments))
                 if (control := segments[index].control) is not None and control.kind == "wait" and control.event is event]
        if not waits:
            return
        start = waits[0]
        for segment in segments[start + 1:]:
            for group in segment.groups:
                if group.issued_stamp < run.stamp:
                    self.note_stale(run, group)
            if segment.control is not None and segment.control.kind == "wait":
                break

    def surface_stale(self) -> None:
        """Raise the first stale-parameter error noted so far (each is reported once)."""
        if self.stale:
            first = self.stale[0]
            self.stale.clear()
            raise first

    def _misuse(self, what: str, detail: str) -> CaptureConstraintError:
        return CaptureConstraintError(TASK_GROUP_MISUSE.format(what=what, detail=detail))

    def group_begin(self, stream: SimStream) -> None:
        self.device.check_alive()
        capture = self.device.captures.active
        if capture is None or stream is not capture.stream:
            raise self._misuse(
                "task_group_begin", f"{stream} is not capturing; open task groups on the capturing stream"
            )
        if capture.open_group is not None:
            raise self._misuse(
                "task_group_begin", f"a task group is already open on {stream}; close it with task_group_end"
            )
        capture.group_begin(stream)

    def group_end(self, stream: SimStream) -> TaskGroup:
        self.device.check_alive()
        capture = self.device.captures.active
        if capture is None or capture.open_group is None or capture.open_group[0] is not stream:
            raise self._misuse("task_group_end", f"no task group is open on {stream}; call task_group_begin first")
        return capture.group_end(capture.graph.generation)

    def update_begin(self, stream: SimStream, handle: TaskGroup) -> None:
        self.device.check_alive()
        if not isinstance(handle, TaskGroup) or handle.graph.device is not self.device:
            raise self._misuse("task_update_begin", f"{handle!r} is not a task-group handle of this device")
        capture = self.device.captures.active
        if capture is not None and stream is capture.stream:
            raise self._misuse("task_update_begin", f"{stream} is capturing; update on another stream")
        graph = handle.graph
        if graph.state != CAPTURED or graph.generation != handle.generation:
            raise self._misuse(
                "task_update_begin",
                f"{handle.name} belongs to a capture that no longer exists (the graph was reset or "
                "captured again); use the handles of the current capture",
            )
        if self.open_update is not None:
            raise self._misuse(
                "task_update_begin", f"an update of {self.open_update.group.name} is still open; call task_update_end"
            )
        update = Update(self.device, handle, stream)
        update.collector.__enter__()
        # The re-issued ops take the group's place in the graph's program: weak references into the
        # graph are checked there (`sim.pool_checks.check_update`), not as eager reads.
        update.in_graph = enter_graph(graph.memory)
        self.open_update = update

    def abandon_update(self) -> None:
        """Close the task update under way without applying it, as leaving it by an exception
        does: its calls are discarded (the group keeps its previous parameters) and its
        collector comes off torch's mode stack (`sim.mode_stack`). No-op when none is open."""
        update = self.open_update
        if update is None:
            return
        self.open_update = None
        withdraw(update.collector)
        leave_graph(update.in_graph)

    def abandon_group(self) -> None:
        """Close the task group open in the capture under way without making it a group (no
        handle: its ops stay plain captured tasks), as leaving it by an exception does, so the
        capture can still end. No-op when none is open."""
        capture = self.device.captures.active
        if capture is not None:
            capture.open_group = None

    def update_end(self, stream: SimStream) -> None:
        update = self.open_update
        if update is None or update.stream is not stream:
            raise self._misuse("task_update_end", f"no task update is open on {stream}; call task_update_begin first")
        self.open_update = None
        withdraw(update.collector)
        leave_graph(update.in_graph)
        self.device.check_alive()
        device = self.device
        term = device.fault("task_update", stream_id=stream.stream_id)
        if term is not None and term.action is Action.SKIP_UPDATE:
            return
        program = update.group.graph.program
        assert program is not None
        detail = update.mismatch(program.records)
        if detail is not None:
            raise CaptureConstraintError(TASK_UPDATE_MISMATCH.format(group=update.group.name, detail=detail))
        memory = update.group.graph.memory
        if memory is not None:  # weak references must hold their owner's data at the op's place
            for record_index, (func, args, kwargs) in zip(update.group.record_indices, update.calls):
                pool_checks.check_update(memory, func, args, kwargs, record_index)
        group = update.group
        clock = device.virtual_clock
        stamp = clock.next_stamp()  # the update's place among replay launches: when it was issued
        group.issued_stamp = stamp
        device.queues.check_update(group.graph, group.name, stream, f"the update issued after replay {group.graph.replays}")

        def apply() -> None:  # the device side: the group's tasks take the new arguments
            for record_index, (_, args, kwargs) in zip(group.record_indices, update.calls):
                program.replace(record_index, args, kwargs)
            group.updated_stamp = stamp

        device.queues.issue(stream, Work(f"task update of {group.name}", apply))
        cost_us = device.cost.params.host_launch_us * len(update.calls)
        device.trace.span("task_update", f"update {group.name}", stream.stream_id, clock.host_us, cost_us,
                          group.graph.name)
        clock.host_spends(cost_us)
