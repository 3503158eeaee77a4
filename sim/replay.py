"""Replay and ExternalEvents on the simulator: launched replays run their program segment by
segment and suspend at a captured wait on an event nobody has recorded yet; recording the
event (eagerly, or from a task update on another stream) resumes them. An eager record (or reset) is a
task of its stream: on a stream with work pending it waits its turn, and a record queued
behind a wait for that same event is a hang on the device (GraphHang at the record).

`ReplayMixin` is part of `sim.device.SimDevice`.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Optional, cast

import torch

from sim import kernels
from sim.capture import COPY_MANY, COPY_ONE, modes_off
from sim.faults import Action
from sim.graph import ReplayRun, SimGraph
from sim.pool_memory import replaying_graph
from sim.streams import SimExternalEvent, SimStream

__all__ = ["ReplayMixin"]

_NO_CONTEXT = contextlib.nullcontext()


if TYPE_CHECKING:  # the type checker reads the mixin as a part of SimDevice (sim.device_parts)
    from sim.device import SimDevice
    from sim.device_parts import DeviceParts as _Parts
else:
    _Parts = object


class ReplayMixin(_Parts):
    """ExternalEvent record / wait / reset, stream draining, and graph replay."""

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
        # Stream order: the record runs after what the stream holds. If that is a wait for this
        # very event, the record can never run: a hang on the device (`sim.queues`).
        self.queues.record_external(event, stream)

    def _external_wait(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        self._check_alive()
        stream = stream or self._current()
        capture = self._capture
        if capture is not None and stream is capture.stream:
            capture.control("wait", event)
            return
        self.queues.wait_external(event, stream)

    def _external_reset(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        self._check_alive()
        stream = stream or self._current()
        capture = self._capture
        if capture is not None and stream is capture.stream:
            capture.control("reset", event)
            return
        self.queues.reset_external(event, stream)  # stream order, as a record

    # ------------------------------------------------------------------ graphs: replay
    def _replay(self, graph: SimGraph) -> None:
        self._check_alive()
        graph._transition("replay")
        stream = self._current()
        capture = self._capture
        if capture is not None and capture.open_group is not None and stream is capture.stream:
            raise capture.refuse_in_group("graph replay", f"replay of {graph.name}")
        term = self._fault("replay", stream_id=stream.stream_id)
        program = graph.program
        assert program is not None
        program.addresses.check(graph.name)
        graph.replays += 1
        self._replays += 1
        self._host_us += self.cost.graph_launch_us(program.num_kernels)
        run = ReplayRun(graph, program, next(self._stamps))
        if graph._memory is not None:  # its pool blocks hold its data again (sim.pool_memory)
            graph._memory.wrote(run.stamp)
        if term is not None and term.action is Action.PERTURB:
            run.perturb = term.value
        if term is not None and term.action is Action.HANG:
            run.waiting_on = SimExternalEvent(cast("SimDevice", self), f"an injected hang at replay of {graph.name}")
        run.ready_us = self._host_us
        self.queues.issue_replay(stream, run)  # runs now under lag="immediate", else when waited for
        self._surface_stale()

    def _advance(self, run: ReplayRun, stream: SimStream) -> bool:
        """Run a replay from where it stands; False when it suspends at a wait."""
        segments = run.program.segments
        count = len(segments)
        index = run.segment
        recorded: list[SimExternalEvent] = []
        finished = True
        if run.waited is not None:  # resumed: its wait ended when the record was issued
            run.ready_us = max(run.ready_us, run.waited.recorded_us)
            run.waited = None
        # Replays inside this device's own capture are recorded (a child graph); any other
        # mode (an eager tracker, another device's capture) must not see graph tasks.
        quiet = modes_off() if self._capture is None else _NO_CONTEXT
        with quiet, torch._C._AutoDispatchBelowADInplaceOrView(), kernels.replaying(), replaying_graph(run.graph._memory):
            while index < count:
                segment = segments[index]
                if segment.groups and self.require_task_updates:
                    self._check_fresh(run, segment)
                for call, args, kwargs, mode, target in segment.entries:
                    result = call(*args, **kwargs) if kwargs else call(*args)
                    if mode == COPY_ONE:
                        target.copy_(result)
                    elif mode == COPY_MANY:
                        _copy_many(target, result)
                start = max(self._device_us, run.ready_us)
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
                        run.waiting_on = run.waited = event
                        finished = False
                        break
                elif control.kind == "reset":
                    event.flag = False
                else:
                    event.flag = True
                    event.recorded_us = run.ready_us
                    recorded.append(event)
        run.segment = index
        if finished and run.perturb:
            _perturb_outputs(run.program, run.perturb)
        if self._profiling:
            self._end_replay_part(run, stream, finished)
        for event in recorded:
            self.queues.wake(event)
        return finished


def _perturb_outputs(program: Any, value: float) -> None:
    """Add ``value`` to the graph's output: what the last kernel writing a fresh floating
    tensor wrote (a planted divergence of known size, `perturb(x)` of the fault plan)."""
    for segment in reversed(program.segments):
        for *_, mode, target in reversed(segment.entries):
            targets = (target,) if mode == COPY_ONE else tuple(target or ()) if mode == COPY_MANY else ()
            written = [t for t in targets if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if written:
                with torch.no_grad():
                    for tensor in written:
                        tensor.add_(value)
                return


def _copy_many(targets: tuple, results: Any) -> None:
    for target, value in zip(targets, results):
        if target is None:
            continue
        if isinstance(target, torch.Tensor):
            target.copy_(value)
        else:
            for t, v in zip(target, value):
                t.copy_(v)
