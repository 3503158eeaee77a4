"""Task groups and task updates on the simulator (torch_npu's graph_task_group_* and
graph_task_update_*).

`TaskGroupMixin` is part of `sim.device.SimDevice`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from sim.pool_memory import enter_graph, leave_graph
from sim.queues import Work
from sim.tracing import TraceSpan

__all__ = ["TaskGroupMixin"]


if TYPE_CHECKING:  # the type checker reads the mixin as a part of SimDevice (sim.device_parts)
    from sim.device_parts import DeviceParts as _Parts
else:
    _Parts = object


class TaskGroupMixin(_Parts):
    """Open / close task groups while capturing; update them after capture; catch replays
    that execute a task group nobody updated (stale parameters)."""

    def _check_fresh(self, run: ReplayRun, segment: Segment) -> None:
        """Note every task group starting in ``segment`` not updated since ``run`` was launched.

        vLLM Ascend updates every attention task group after every FULL replay, so a group
        executed without an update since its replay began ran with an earlier batch's
        parameters (docs/decisions.md "Stale FULL-graph parameters"). The replay still completes (the device does not stop for
        it); the error surfaces at the next point the host hears from the device."""
        for group in segment.groups:
            if group.updated_stamp < run.stamp:
                self._note_stale(run, group)

    def _note_stale(self, run: ReplayRun, group: TaskGroup) -> None:
        if group.index in run.reported:
            return  # each stale group of a run is reported once
        run.reported.add(group.index)
        op = str(group.graph.program.records[group.record_indices[0]].func) if group.graph.program else "?"
        self._stale.append(
            StaleGraphParams(
                STALE_GRAPH_PARAMS.format(replay=run.number, graph=run.graph.name, group=f"task group {group.index}", op=op)
            )
        )

    def _stale_at_release(self, run: ReplayRun, event: object) -> None:
        """The host issued the record that releases ``run``'s wait on ``event`` (the device runs
        behind it): a task group that wait gates and that no update issued since the replay's
        launch touched will run stale whatever comes next, since nothing the host issues from now
        on is ordered before it. Noted here, where the host is (the replay, when it runs, skips it)."""
        if not self.require_task_updates:
            return
        segments = run.program.segments
        start = next((index for index in range(run.segment, len(segments))
                      if segments[index].control is not None and segments[index].control.kind == "wait"
                      and segments[index].control.event is event), None)
        if start is None:
            return
        for segment in segments[start + 1:]:
            for group in segment.groups:
                if group.issued_stamp < run.stamp:
                    self._note_stale(run, group)
            if segment.control is not None and segment.control.kind == "wait":
                break

    def _surface_stale(self) -> None:
        """Raise the first stale-parameter error noted so far (each is reported once)."""
        if self._stale:
            first = self._stale[0]
            self._stale.clear()
            raise first

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
        # The re-issued ops take the group's place in the graph's program: weak references into the
        # graph are checked there (`sim.pool_memory.GraphMemory.check_update`), not as eager reads.
        update.in_graph = enter_graph(graph._memory)
        self._update = update

    def task_update_end(self, stream: SimStream) -> None:
        update = self._update
        if update is None or update.stream is not stream:
            raise self._misuse("task_update_end", f"no task update is open on {stream}; call task_update_begin first")
        self._update = None
        update.collector.__exit__(None, None, None)
        leave_graph(update.in_graph)
        self._check_alive()
        term = self._fault("task_update", stream_id=stream.stream_id)
        if term is not None and term.action is Action.SKIP_UPDATE:
            return
        program = update.group.graph.program
        assert program is not None
        detail = update.mismatch(program.records)
        if detail is not None:
            raise CaptureConstraintError(TASK_UPDATE_MISMATCH.format(group=update.group.name, detail=detail))
        memory = update.group.graph._memory
        if memory is not None:  # weak references must hold their owner's data at the op's place
            for record_index, (func, args, kwargs) in zip(update.group.record_indices, update.calls):
                memory.check_update(func, args, kwargs, record_index)
        group = update.group
        stamp = next(self._stamps)  # the update's place among replay launches: when it was issued
        group.issued_stamp = stamp
        self.queues.check_update(group.graph, group.name, stream, f"the update issued after replay {group.graph.replays}")

        def apply() -> None:  # the device side: the group's tasks take the new arguments
            for record_index, (_, args, kwargs) in zip(group.record_indices, update.calls):
                program.replace(record_index, args, kwargs)
            group.updated_stamp = stamp

        self.queues.issue(stream, Work(f"task update of {group.name}", apply))
        cost_us = self.cost.params.host_launch_us * len(update.calls)
        if self._profiling:
            self.trace_spans.append(
                TraceSpan("task_update", f"update {group.name}", stream.stream_id, self._host_us, cost_us,
                          group.graph.name)
            )
        self._host_us += cost_us
