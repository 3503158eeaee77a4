"""Stream queues of the simulated device: the work each stream has been given and not yet run.

Theory of operation. A stream is an ordered queue of device work. What the host issues on a
stream (a graph replay, an ExternalEvent record, wait or reset, a task update's device side, a
non-blocking copy, or any `submit`-ted callable) is appended to the stream's queue; the queue
runs from its head. An item that cannot run yet stops its stream, and everything behind it
waits: an eager wait on an ExternalEvent nobody has recorded, a replay suspended at a captured
wait. Recording the event lets the streams waiting on it go on (`wake`).

`StreamQueues` (``device.queues``) owns the queues:

* ``submit(stream, work, label=...)`` appends a callable to ``stream`` and runs the queue;
* ``flush(stream=None, reason=...)`` runs a stream's queue (every stream's for None) as far as
  it can go; when something is left that nothing queued can release (a wait on an event no
  queued record sets), a device would block for ever: ``GraphHang`` names the stream and what
  it waits on (``reason`` says who asked);
* ``pending(stream=None)`` counts what is left.

Replays run through the `Runner` the device gives the queues (``advance(run, stream)``, which
returns False when the replay suspends at a wait); event flags are set and cleared here, and a
record queued behind a wait for that same event is a hang on a card (``GraphHang`` at the
record: `check_record`).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

from ascendgraph.errors import (
    EXTERNAL_EVENT_NOT_RESET,
    GRAPH_HANG_REPLAY,
    GRAPH_HANG_STREAM,
    RECORD_BEHIND_ITS_WAIT,
    ConfigError,
    GraphHang,
)

if TYPE_CHECKING:  # pragma: no cover
    from sim.streams import SimExternalEvent, SimStream

__all__ = ["StreamQueues", "Work", "EagerWait", "QueuedEventOp", "Runner"]


class Work:
    """A callable submitted to a stream (``queues.submit``)."""

    __slots__ = ("label", "run")

    def __init__(self, label: str, run: Callable[[], None]) -> None:
        self.label = label
        self.run = run

    def __repr__(self) -> str:
        return f"<Work {self.label}>"


class EagerWait:
    """An eager wait on an unrecorded ExternalEvent, blocking its stream."""

    __slots__ = ("event",)

    def __init__(self, event: "SimExternalEvent") -> None:
        self.event = event


class QueuedEventOp:
    """An eager ExternalEvent record or reset issued on a stream with work pending: like any
    task on a stream, it takes effect when the stream reaches it."""

    __slots__ = ("kind", "event")

    def __init__(self, kind: str, event: "SimExternalEvent") -> None:
        self.kind = kind  # "record" or "reset"
        self.event = event


def waits_on(item: Any) -> "Optional[SimExternalEvent]":
    """The ExternalEvent a queued item is blocked on (None: it is not blocked on one)."""
    if isinstance(item, EagerWait):
        return item.event
    if isinstance(item, (QueuedEventOp, Work)):
        return None
    return getattr(item, "waiting_on", None)


class Runner(Protocol):
    """What the queues need from the device to run a replay and to report on the host."""

    def advance(self, run: Any, stream: "SimStream") -> bool:
        """Run a replay from where it stands; False when it suspends at a wait."""

    def surface_stale(self) -> None:
        """Raise a stale-parameter error the replays noted (the host hears from the device)."""


class StreamQueues:
    """``device.queues``: per-stream queues of device work (module docstring)."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._busy: set["SimStream"] = set()  # streams with something queued

    # -- the public interface
    def submit(self, stream: "SimStream", work: Callable[[], None], *, label: str) -> None:
        """Queue ``work`` on ``stream`` and run the stream as far as it can go."""
        if not callable(work):
            raise ConfigError(f"queues.submit needs a callable, got {work!r} (label {label!r})", key="work")
        self.append(stream, Work(label, work))
        self.drain(stream)

    def flush(self, stream: "Optional[SimStream]" = None, *, reason: str) -> None:
        """Run ``stream``'s queue (every stream's when None); GraphHang when it cannot finish."""
        streams = [stream] if stream is not None else self.busy_streams()
        for each in streams:
            if each.pending:
                self.drain(each)
        self._runner.surface_stale()
        for each in streams:
            if each.pending:
                raise self.hang(each, reason)

    def pending(self, stream: "Optional[SimStream]" = None) -> int:
        if stream is not None:
            return len(stream.pending)
        return sum(len(each.pending) for each in self.busy_streams())

    def busy_streams(self) -> list["SimStream"]:
        return list(self._busy)

    # -- used by the device's replay and event code
    def append(self, stream: "SimStream", item: Any) -> None:
        stream.pending.append(item)
        self._busy.add(stream)

    def drop(self, keep: Callable[[Any], bool]) -> None:
        """Forget the queued items ``keep`` says no to (a reset graph's replays), then go on."""
        for stream in self.busy_streams():
            kept = [item for item in stream.pending if keep(item)]
            if len(kept) != len(stream.pending):
                stream.pending = deque(kept)
                self.drain(stream)

    def hang(self, stream: "SimStream", reason: str) -> GraphHang:
        """The error for ``stream`` stopped at its head for ever (``reason``: who waited)."""
        head = stream.pending[0]
        if isinstance(head, EagerWait):
            return GraphHang(GRAPH_HANG_STREAM.format(stream=stream, event=head.event))
        if isinstance(head, (Work, QueuedEventOp)):  # cannot happen: these never stop a stream
            return GraphHang(GRAPH_HANG_STREAM.format(stream=stream, event=f"{head!r} ({reason})"))
        return GraphHang(GRAPH_HANG_REPLAY.format(graph=head.graph.name, event=head.waiting_on))

    def check_record(self, event: "SimExternalEvent", stream: "SimStream") -> None:
        """A record queued behind a wait for that same event can never run: a hang on a card."""
        for item in stream.pending:
            if waits_on(item) is event:
                blocked_by = f"replay of {item.graph.name}" if hasattr(item, "graph") else "an eager wait"
                raise GraphHang(RECORD_BEHIND_ITS_WAIT.format(event=event, stream=stream, blocked_by=blocked_by))

    def set_flag(self, event: "SimExternalEvent") -> None:
        """An ExternalEvent record takes effect: set the flag, let the streams waiting on it go on."""
        if event.flag:
            raise RuntimeError(EXTERNAL_EVENT_NOT_RESET.format(event=event))
        event.flag = True
        self.wake(event)
        self._runner.surface_stale()

    def wake(self, event: "SimExternalEvent") -> None:
        for stream in self.busy_streams():
            head = stream.pending[0] if stream.pending else None
            if head is not None and waits_on(head) is event:
                self.drain(stream)

    def drain(self, stream: "SimStream") -> None:
        """Run ``stream``'s queue from its head until it is empty or its head must wait."""
        pending = stream.pending
        while pending:
            head = pending[0]
            if isinstance(head, Work):
                pending.popleft()
                head.run()
                continue
            if isinstance(head, EagerWait):
                if not head.event.flag:
                    return
                pending.popleft()
                continue
            if isinstance(head, QueuedEventOp):
                pending.popleft()
                if head.kind == "record":
                    self.set_flag(head.event)
                else:
                    head.event.flag = False
                continue
            if head.waiting_on is not None:
                if not head.waiting_on.flag:
                    return
                head.waiting_on = None
            if not self._runner.advance(head, stream):
                return
            pending.popleft()
        self._busy.discard(stream)
