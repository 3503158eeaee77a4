"""Stream queues of the simulated device: the work each stream was given and has not run yet,
run when something waits for it (the device lags the host), and the ordering hazards that lag
makes observable.

Theory of operation. A stream is an ordered queue of device work. What the host issues on a
stream — a graph replay, an ExternalEvent record, wait or reset, an Event record or wait, a
task update's device side, a non-blocking copy, or any callable a device type `submit`s — is
appended to the stream's queue. With ``lag="device"`` (the default, what a card does: the host
never waits unless asked) nothing runs when it is issued. A stream's queue runs when the host
waits for it: ``stream.synchronize()``, ``device.synchronize()``, ``event.synchronize()``, a
host read of device memory (``device.host_read``), an eager kernel the simulator sees issued on
that stream (it must not overtake the stream's queue), or another stream waiting on one of its
events (the waiter pulls the recording stream up to the record). With ``lag="immediate"``
every item runs as soon as it is issued, unless its stream is blocked (an unrecorded
ExternalEvent wait), but the host still knows only what it waited for; with
``lag="synchronous"`` the host also waits for each item.

Ordering. Each queued item carries what is ordered before it; when the host issues an item that
nothing orders after work a card might still run first — an ExternalEvent record before the
previous replay's wait and reset, a task update before the previous replay, a host access to a
buffer a queued copy has not filled — it is a named error, whatever the device's speed
(`sim.stream_order`): the same with ``lag="device"`` and ``"immediate"``. Under
``lag="synchronous"`` the host waits for every item, so none can happen.

Replays run through the `Runner` the device gives the queues (``advance(run, stream)``
returns False when the replay suspends at a captured wait); ExternalEvent flags are set and
cleared here. A record queued behind a wait for that same event can never run: ``GraphHang``
at the record (`check_record`).
"""

from __future__ import annotations

from collections import deque
from itertools import count
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

import torch

from ascendgraph.errors import (
    EXTERNAL_EVENT_NOT_RESET,
    GRAPH_HANG_REPLAY,
    GRAPH_HANG_STREAM,
    RECORD_BEHIND_ITS_WAIT,
    ConfigError,
    GraphHang,
)
from sim.stream_order import Clock, StreamOrder, upto

if TYPE_CHECKING:  # pragma: no cover
    from sim.streams import SimEvent, SimExternalEvent, SimStream

__all__ = [
    "LAG_MODES",
    "DeviceRunner",
    "StreamQueues",
    "Queued",
    "Work",
    "EagerWait",
    "QueuedEventOp",
    "Marker",
    "MarkerWait",
    "Runner",
]

LAG_MODES = {
    "device": "queued work runs when the host waits for it (a synchronize, a host read, an eager kernel on its stream, "
    "a wait on one of its events): what a card does",
    "immediate": "every item runs when it is issued unless its stream is blocked (a device as fast as can be), but the "
    "host still knows only what it waited for: the ordering hazards are the same as with 'device'",
    "synchronous": "every item runs when it is issued and the host waits for it: no ordering hazard can happen "
    "(tests that look at the device between issue and completion)",
}


class Work:
    """A callable submitted to a stream (``queues.submit``, a task update's device side, a copy)."""

    __slots__ = ("label", "run", "host_writes", "host_reads")

    def __init__(self, label: str, run: Callable[[], None]) -> None:
        self.label = label
        self.run = run
        self.host_writes: Optional[tuple[int, int]] = None  # host bytes [start, end) it writes (a D2H copy)
        self.host_reads: Optional[tuple[int, int]] = None  # host bytes it reads (an H2D copy)

    def __repr__(self) -> str:
        return f"<Work {self.label}>"


class EagerWait:
    """An eager wait on an ExternalEvent: its stream goes on once the event is recorded."""

    __slots__ = ("event",)

    def __init__(self, event: "SimExternalEvent") -> None:
        self.event = event


class QueuedEventOp:
    """An eager ExternalEvent record or reset: it takes effect when its stream reaches it."""

    __slots__ = ("kind", "event")

    def __init__(self, kind: str, event: "SimExternalEvent") -> None:
        self.kind = kind  # "record" or "reset"
        self.event = event


class Marker:
    """An Event recorded on a stream: done when the stream reaches it."""

    __slots__ = ("event", "done")

    def __init__(self, event: "Optional[SimEvent]") -> None:
        self.event = event
        self.done = False


class MarkerWait:
    """A stream waiting for a marker (``event.wait(stream)``, ``stream.wait_stream(other)``)."""

    __slots__ = ("marker",)

    def __init__(self, marker: "Queued") -> None:
        self.marker = marker


class Queued:
    """One item in a stream's queue, with its place in the device's order."""

    __slots__ = ("item", "seq", "stream", "position", "clock", "issued_us")

    def __init__(self, item: Any, seq: int, stream: "SimStream", position: int, clock: Clock, issued_us: float) -> None:
        self.item = item
        self.seq = seq  # global issue order
        self.stream = stream
        self.position = position  # the stream's count of items issued, this one included
        self.clock = clock  # what is ordered before it (module docstring)
        self.issued_us = issued_us  # the host clock when it was issued

    def ordered_before(self, clock: Clock) -> bool:
        return self.position <= clock.get(self.stream.stream_id, 0)

    def __repr__(self) -> str:
        return f"<Queued #{self.seq} {self.item!r} on {self.stream}>"


def waits_on(item: Any) -> "Optional[SimExternalEvent]":
    """The ExternalEvent a queued item is blocked on (None: it is not blocked on one)."""
    if isinstance(item, EagerWait):
        return item.event
    if isinstance(item, (QueuedEventOp, Work, Marker, MarkerWait)):
        return None
    return getattr(item, "waiting_on", None)


def _records(item: Any, event: "SimExternalEvent") -> bool:
    """Whether a queued item records ``event`` when it runs."""
    if isinstance(item, QueuedEventOp):
        return item.kind == "record" and item.event is event
    program = getattr(item, "program", None)
    return program is not None and any(
        segment.control is not None and segment.control.kind == "record" and segment.control.event is event
        for segment in program.segments[item.segment:]
    )


class Runner(Protocol):
    """What the queues need from the device."""

    def advance(self, run: Any, stream: "SimStream") -> bool:
        """Run a replay from where it stands; False when it suspends at a wait."""

    def surface_stale(self) -> None:
        """Raise a stale-parameter error the replays noted (the host hears from the device)."""

    def host_clock_us(self) -> float:
        """The virtual host clock now."""

    def released(self, run: Any, event: "SimExternalEvent") -> None:
        """The host issued the record that releases ``run``'s wait on ``event``."""


class StreamQueues:
    """``device.queues``: per-stream queues of device work (module docstring)."""

    def __init__(self, runner: Runner, *, lag: str = "device") -> None:
        if lag not in LAG_MODES:
            raise ConfigError(
                f"lag must be one of {', '.join(LAG_MODES)}, got {lag!r} ("
                + "; ".join(f"{k}: {v}" for k, v in LAG_MODES.items()) + ")",
                key="lag",
            )
        self.lag = lag
        self.runs_at_issue = lag != "device"  # work runs when issued (unless its stream is blocked)
        self.host_waits_each = lag == "synchronous"  # the host knows every item it issued has run
        self.checks_order = lag != "synchronous"  # the ordering hazards (sim.stream_order) are errors
        self._runner = runner
        self._busy: set["SimStream"] = set()  # streams with something queued
        self._seq = count(1)
        self.order = StreamOrder()
        self._running = 0  # > 0 while queued work runs: it issues nothing of its own
        self._active: set["SimStream"] = set()  # streams running right now (further up the call stack)
        # called after the host waited for something (a flush, an event's record): who guards
        # host memory of queued copies steps aside once nothing is pending (sim.npu_device.host_guard)
        self.host_wait_listeners: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ the public interface
    def submit(self, stream: "SimStream", work: Callable[[], None], *, label: str) -> None:
        """Queue ``work`` on ``stream`` (it runs when the stream is waited for; at once unless
        ``lag="device"``)."""
        if not callable(work):
            raise ConfigError(f"queues.submit needs a callable, got {work!r} (label {label!r})", key="work")
        self.issue(stream, Work(label, work))

    def flush(self, stream: "Optional[SimStream]" = None, *, reason: str) -> None:
        """Run ``stream``'s queue (every stream's when None) to its end; ``GraphHang`` when it
        cannot get there (a wait nothing queued releases). The host then knows it has run."""
        streams = [stream] if stream is not None else self._by_head()
        for each in streams:
            if each.pending:
                self._run_stream(each)
        self._runner.surface_stale()
        for each in streams:
            if each.pending:
                raise self.hang(each, reason)
        if stream is None:
            self.order.host_waited_for_all()
        else:
            self.order.host_waited_for(stream)
        self._tell_host_waited()

    def _tell_host_waited(self) -> None:
        for listener in list(self.host_wait_listeners):
            listener()

    @property
    def running(self) -> bool:
        """Whether queued work is running right now (what it does is the device's, not the host's)."""
        return self._running > 0

    def host_copies_pending(self) -> bool:
        """Whether a queued non-blocking copy with a host side (`copy`) is not known to the host
        to have run: the host must not touch that memory yet (`check_host_access`)."""
        return self.checks_order and self.order.copies_pending()

    def run(self, stream: "SimStream") -> None:
        """Run ``stream``'s queue as far as it can go, without raising for what must wait."""
        if stream.pending and not self._running:
            self._run_stream(stream)

    def pending(self, stream: "Optional[SimStream]" = None) -> int:
        if stream is not None:
            return len(stream.pending)
        return sum(len(each.pending) for each in self.busy_streams())

    def busy_streams(self) -> list["SimStream"]:
        return list(self._busy)

    def copy(self, destination: torch.Tensor, source: torch.Tensor, *, stream: "SimStream",
             destination_is_host: bool = False, source_is_host: bool = False, label: Optional[str] = None) -> None:
        """A non-blocking copy on ``stream``: queued like any device work; while it is queued the
        host memory it writes (``destination_is_host``) or reads (``source_is_host``) must not be
        touched by the host (`check_host_access`)."""
        work = Work(label or f"copy of {tuple(source.shape)} {str(source.dtype).replace('torch.', '')}",
                    lambda: _copy(destination, source))
        if destination_is_host:
            work.host_writes = _span(destination)
        if source_is_host:
            work.host_reads = _span(source)
        self.issue(stream, work)

    def check_host_access(self, start: int, nbytes: int, what: str, *, write: bool = False) -> None:
        """The host is about to read (or, ``write=True``, write) host bytes [start, start + nbytes):
        a queued copy not known to have run that writes them (or reads them) is a
        ``StreamOrderError``."""
        self.order.check_host_access(start, nbytes, what, write=write)

    # ------------------------------------------------------------------ issuing
    def issue(self, stream: "SimStream", item: Any, *, after: Optional[Clock] = None) -> Queued:
        """Append ``item`` to ``stream``'s queue (``after``: a clock it is also ordered after)."""
        position, clock = self.order.place(stream, after)
        queued = Queued(item, next(self._seq), stream, position, clock, self._runner.host_clock_us())
        if isinstance(item, Work) and (item.host_writes or item.host_reads):
            self.order.note_copy(queued)
        stream.pending.append(queued)
        self._busy.add(stream)
        if self.runs_at_issue and not self._running:
            self._run_stream(stream)
            if self.host_waits_each and not stream.pending:
                self.order.host_waited_for(stream)
        return queued

    def issue_replay(self, stream: "SimStream", run: Any) -> Queued:
        """A replay launched on ``stream``: queued; it consumes one record of every ExternalEvent
        its program resets."""
        queued = self.issue(stream, run)
        if self.checks_order:
            self.order.note_replay(queued, _resets(run.program))
        return queued

    def wait_for(self, stream: "SimStream", marker: Queued) -> None:
        """``stream`` waits for ``marker`` (an Event recorded on another stream)."""
        self.issue(stream, MarkerWait(marker), after=upto(marker))

    def tail(self, stream: "SimStream") -> Queued:
        """A marker at the end of ``stream``'s queue (``wait_stream``)."""
        return self.issue(stream, Marker(None))

    def host_waited(self, marker: Queued, *, reason: str) -> None:
        """The host waits for ``marker`` (``event.synchronize``): run up to it (``GraphHang`` when
        nothing can get there); the host then knows everything before it ran."""
        self._run_until(marker)
        if not marker.item.done:
            raise self.hang(marker.stream, reason)
        self._runner.surface_stale()
        self.order.host_waited_until(marker)
        self._tell_host_waited()

    def marker_done(self, marker: Queued) -> bool:
        """Whether the device reached ``marker`` (``event.query``): it runs what it can first."""
        self._run_until(marker)
        return bool(marker.item.done)

    # ------------------------------------------------------------------ ExternalEvents
    def record_external(self, event: "SimExternalEvent", stream: "SimStream") -> None:
        """An eager record of ``event`` on ``stream``: it must be ordered after whatever consumed
        the event's previous record; then it is queued (the flag is set when the stream gets there)."""
        self.check_record(event, stream)
        consumer = self.order.check_record(event, stream) if self.checks_order else None
        queued = self.issue(stream, QueuedEventOp("record", event))
        if not self.checks_order:
            return
        self.order.note_record(event, queued, consumer)
        if not self.runs_at_issue and consumer is not None and hasattr(consumer[0].item, "program"):
            self._runner.released(consumer[0].item, event)  # what it gates may run stale for sure
            self._runner.surface_stale()

    def reset_external(self, event: "SimExternalEvent", stream: "SimStream") -> None:
        queued = self.issue(stream, QueuedEventOp("reset", event))
        if self.checks_order:
            self.order.note_consumer(event, queued, f"the reset on {stream}")

    def wait_external(self, event: "SimExternalEvent", stream: "SimStream") -> None:
        """An eager wait: ordered after the event's last record the host issued."""
        self.issue(stream, EagerWait(event), after=self.order.last_record(event) if self.checks_order else None)

    def check_update(self, graph: Any, group: str, stream: "SimStream", label: str) -> None:
        """A task update of ``graph``'s ``group`` on ``stream``: ordered after every earlier replay
        but the latest (`sim.stream_order`)."""
        if self.checks_order:
            self.order.check_update(graph, group, stream, label)

    # ------------------------------------------------------------------ running
    def hang(self, stream: "SimStream", reason: str) -> GraphHang:
        """The error for ``stream`` stopped at its head for ever (``reason``: who waited)."""
        head = stream.pending[0].item
        if isinstance(head, EagerWait):
            return GraphHang(GRAPH_HANG_STREAM.format(stream=stream, event=head.event))
        if isinstance(head, MarkerWait):
            return GraphHang(GRAPH_HANG_STREAM.format(stream=stream, event=f"an event recorded on {head.marker.stream} "
                                                                             f"behind a wait that never ends ({reason})"))
        if isinstance(head, (Work, QueuedEventOp, Marker)):  # cannot happen: these never stop a stream
            return GraphHang(GRAPH_HANG_STREAM.format(stream=stream, event=f"{head!r} ({reason})"))
        return GraphHang(GRAPH_HANG_REPLAY.format(graph=head.graph.name, event=head.waiting_on))

    def check_record(self, event: "SimExternalEvent", stream: "SimStream") -> None:
        """A record queued behind a wait for that same event can never run: a hang on a card."""
        for queued in stream.pending:
            item = queued.item
            if waits_on(item) is event or _waits_before_recording(item, event):
                blocked_by = f"replay of {item.graph.name}" if hasattr(item, "graph") else "an eager wait"
                raise GraphHang(RECORD_BEHIND_ITS_WAIT.format(event=event, stream=stream, blocked_by=blocked_by))

    def set_flag(self, event: "SimExternalEvent") -> None:
        """An ExternalEvent record takes effect: set the flag; waiting streams may go on."""
        if event.flag:
            raise RuntimeError(EXTERNAL_EVENT_NOT_RESET.format(event=event))
        event.flag = True
        if self.runs_at_issue:
            self.wake(event)
            self._runner.surface_stale()

    def wake(self, event: "SimExternalEvent") -> None:
        """Streams whose head waits on ``event`` go on (when work runs as it is issued)."""
        if not self.runs_at_issue:
            return
        for stream in self.busy_streams():
            head = stream.pending[0].item if stream.pending else None
            if head is not None and waits_on(head) is event:
                self._run_stream(stream)
                if self.host_waits_each and not stream.pending:
                    self.order.host_waited_for(stream)

    def drop(self, keep: Callable[[Any], bool]) -> None:
        """Forget the queued items ``keep`` says no to (a reset graph's replays)."""
        for stream in self.busy_streams():
            kept = [queued for queued in stream.pending if keep(queued.item)]
            if len(kept) != len(stream.pending):
                stream.pending = deque(kept)
                if self.runs_at_issue:
                    self._run_stream(stream)
                if not stream.pending:
                    self._busy.discard(stream)

    def abandon(self) -> list[str]:
        """The device is being replaced (the facade's next test): run what can still run, then
        forget what cannot (work behind a wait nothing will release). A card would hang there for
        good; a suite must go on, and a tensor of this device used later must not meet the hang
        again. Returns the forgotten items, in words."""
        left: list[str] = []
        for stream in self._by_head():
            try:
                self.run(stream)
            except Exception:  # noqa: BLE001 - the work failed; it is forgotten all the same
                pass
            left += [f"{queued.item!r} on {stream}" for queued in stream.pending]
            stream.pending = deque()
            self._busy.discard(stream)
        return left

    def _by_head(self) -> list["SimStream"]:
        return sorted((s for s in self._busy if s.pending), key=lambda s: s.pending[0].seq)

    def _run_until(self, target: Queued) -> None:
        stream = target.stream
        if target in stream.pending:
            self._run_stream(stream, until=target)

    def _run_stream(self, stream: "SimStream", until: Optional[Queued] = None) -> bool:
        """Run ``stream``'s queue from its head, pulling the streams its waits need; stop after
        ``until`` ran. Returns whether the stream got there (empty, or past ``until``)."""
        if stream in self._active:
            return False  # already running further up: a wait cycle, or a record waking its own stream
        self._active.add(stream)
        pending = stream.pending
        self._running += 1
        try:
            while pending:
                queued = pending[0]
                if not self._ready(queued.item):
                    return False
                if isinstance(queued.item, _ONE_SHOT):
                    pending.popleft()  # taken off first: what it raises does not leave it to run again
                    self._execute(queued, stream)
                else:  # a replay leaves the queue once it finished (it may suspend, or fail half way)
                    if not self._execute(queued, stream):
                        return False
                    pending.popleft()
                if queued is until:
                    return True
            self._busy.discard(stream)
            return True
        finally:
            self._running -= 1
            self._active.discard(stream)

    def _ready(self, item: Any) -> bool:
        if isinstance(item, MarkerWait):
            marker = item.marker
            if marker in marker.stream.pending:
                self._run_stream(marker.stream, until=marker)
            return marker not in marker.stream.pending
        event = waits_on(item)
        if event is None or event.flag:
            return True
        self._pull(event)
        return event.flag

    def _pull(self, event: "SimExternalEvent") -> None:
        """Run the stream holding the earliest queued record of ``event`` up to that record."""
        candidates = [queued for stream in self.busy_streams() if stream not in self._active
                      for queued in stream.pending if _records(queued.item, event)]
        if candidates:
            record = min(candidates, key=lambda queued: queued.seq)
            self._run_stream(record.stream, until=record)

    def _execute(self, queued: Queued, stream: "SimStream") -> bool:
        item = queued.item
        if isinstance(item, Work):
            # Device work runs below autograd, whatever mode the host is in when the stream gets
            # to it: a copy issued inside torch.inference_mode() into an inference tensor (vLLM's
            # pinned buffers) may run after the host left that mode.
            with torch._C._AutoDispatchBelowADInplaceOrView():
                item.run()
            return True
        if isinstance(item, (EagerWait, MarkerWait)):
            return True
        if isinstance(item, Marker):
            item.done = True
            return True
        if isinstance(item, QueuedEventOp):
            if item.kind == "record":
                item.event.recorded_us = queued.issued_us
                self.set_flag(item.event)
            else:
                item.event.flag = False
            return True
        item.waiting_on = None  # a replay starting, or resuming: what it waited on is set
        while not self._runner.advance(item, stream):
            event = item.waiting_on
            self._pull(event)
            if not event.flag:
                return False
            item.waiting_on = None
        return True


_ONE_SHOT = (Work, EagerWait, QueuedEventOp, Marker, MarkerWait)


def _resets(program: Any) -> list["SimExternalEvent"]:
    """The ExternalEvents a captured program resets (each replay consumes one record of each)."""
    events: list[SimExternalEvent] = []
    for segment in program.segments:
        control = segment.control
        if control is not None and control.kind == "reset" and control.event not in events:
            events.append(control.event)
    return events


def _waits_before_recording(item: Any, event: "SimExternalEvent") -> bool:
    """Whether a queued replay that has not reached ``event`` yet will wait on it before it records it."""
    program = getattr(item, "program", None)
    if program is None:
        return False
    for segment in program.segments[item.segment:]:
        control = segment.control
        if control is not None and control.event is event:
            return control.kind == "wait"
    return False


def _span(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.data_ptr()
    return start, start + tensor.numel() * tensor.element_size()


def _copy(destination: torch.Tensor, source: torch.Tensor) -> None:
    destination.copy_(source)  # run by _execute, below autograd


class DeviceRunner:
    """The `Runner` of a `sim.device.SimDevice`: its replays, its stale-parameter reports, its clock."""

    __slots__ = ("_device",)

    def __init__(self, device: Any) -> None:
        self._device = device

    def advance(self, run: Any, stream: "SimStream") -> bool:
        return self._device.replays.advance(run, stream)

    def surface_stale(self) -> None:
        self._device.task_groups.surface_stale()

    def host_clock_us(self) -> float:
        return self._device.virtual_clock.host_us

    def released(self, run: Any, event: "SimExternalEvent") -> None:
        self._device.task_groups.stale_at_release(run, event)
