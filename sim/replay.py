"""Replays and ExternalEvents on the simulator (``device.replays``).

Theory of operation. ``graph.replay()`` checks the graph may replay (captured, its captured
addresses unmoved), consults the failpoint, prices the launch on the host clock, stamps the run
(`sim.clock`: later task updates count for it, its pool blocks hold its data again) and queues it
on the current stream (`sim.queues`). When the stream runs it, `advance` executes the program
segment by segment on the captured tensors — below autograd, outside every other dispatch mode,
each segment priced on the device clock and logged while recording — and suspends at a captured
wait on an ExternalEvent nobody has recorded yet; a record of the event lets it go on. Inside a
capture, ExternalEvent record / wait / reset on the capturing stream become graph nodes; outside,
they are device work of their stream like any other (`sim.queues`).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Optional

import torch

from sim import kernels
from sim.capture import COPY_MANY, COPY_ONE, modes_off
from sim.faults import Action
from sim.graph import ReplayRun, SimGraph
from sim.pool_memory import replaying_graph
from sim.streams import SimExternalEvent, SimStream

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["Replays"]

_NO_CONTEXT = contextlib.nullcontext()


class Replays:
    """``device.replays`` (module docstring)."""

    def __init__(self, device: "SimDevice") -> None:
        self.device = device
        self.count = 0  # replays launched on the device

    def _captured(self, kind: str, event: SimExternalEvent, stream: Optional[SimStream]) -> Optional[SimStream]:
        """The stream an ExternalEvent ``kind`` goes to, or None when a capture recorded it as a node."""
        device = self.device
        device.check_alive()
        stream = stream or device.current_stream()
        capture = device.captures.active
        if capture is not None and stream is capture.stream:
            capture.control(kind, event)
            return None
        return stream

    def record_external(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        target = self._captured("record", event, stream)
        if target is None:
            return
        term = self.device.fault("event_record", stream_id=target.stream_id)
        if term is not None and term.action is Action.HANG:
            return  # the record never reaches the device
        # Stream order: the record runs after what the stream holds. If that is a wait for this
        # very event, the record can never run: a hang on the device (`sim.queues`).
        self.device.queues.record_external(event, target)

    def wait_external(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        target = self._captured("wait", event, stream)
        if target is not None:
            self.device.queues.wait_external(event, target)

    def reset_external(self, event: SimExternalEvent, stream: Optional[SimStream]) -> None:
        target = self._captured("reset", event, stream)
        if target is not None:
            self.device.queues.reset_external(event, target)  # stream order, as a record

    # ------------------------------------------------------------------ graphs: replay
    def replay(self, graph: SimGraph) -> None:
        device = self.device
        device.check_alive()
        graph.transition("replay")
        stream = device.current_stream()
        capture = device.captures.active
        if capture is not None and capture.open_group is not None and stream is capture.stream:
            raise capture.refuse_in_group("graph replay", f"replay of {graph.name}")
        term = device.fault("replay", stream_id=stream.stream_id)
        program = graph.program
        assert program is not None
        program.addresses.check(graph.name)
        graph.replays += 1
        self.count += 1
        clock = device.virtual_clock
        clock.host_spends(device.cost.graph_launch_us(program.num_kernels))
        run = ReplayRun(graph, program, clock.next_stamp())
        if graph.memory is not None:  # its pool blocks hold its data again (sim.pool_memory)
            graph.memory.wrote(run.stamp)
        if term is not None and term.action is Action.PERTURB:
            run.perturb = term.value
        if term is not None and term.action is Action.HANG:
            run.waiting_on = SimExternalEvent(device, f"an injected hang at replay of {graph.name}")
        run.ready_us = clock.host_us
        device.queues.issue_replay(stream, run)  # runs when issued unless lag="device": then when waited for
        device.task_groups.surface_stale()

    def advance(self, run: ReplayRun, stream: SimStream) -> bool:
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
        device = self.device
        clock = device.virtual_clock
        trace = device.trace
        quiet = modes_off() if device.captures.active is None else _NO_CONTEXT
        with quiet, torch._C._AutoDispatchBelowADInplaceOrView(), kernels.replaying(), replaying_graph(run.graph.memory):
            while index < count:
                segment = segments[index]
                if segment.groups and device.require_task_updates:
                    device.task_groups.check_fresh(run, segment)
                for call, args, kwargs, mode, target in segment.entries:
                    result = call(*args, **kwargs) if kwargs else call(*args)
                    if mode == COPY_ONE:
                        target.copy_(result)
                    elif mode == COPY_MANY:
                        _copy_many(target, result)
                start = clock.device_runs(run.ready_us, segment.time_us)
                if trace.recording:
                    trace.log_tasks(segment.kernels, start, stream.stream_id, run.graph.name)
                    trace.mark_replay(run, stream, start)
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
        if trace.recording:
            trace.end_replay_part(run, stream, finished)
        for event in recorded:
            device.queues.wake(event)
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
