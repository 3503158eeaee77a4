"""What orders the simulated device's queued work, and the hazards when nothing does.

Theory of operation. Every item the host issues on a stream (`sim.queues`) gets a position on its
stream and a vector clock: for every stream, the position of the last item ordered before it — by
stream order, by an Event record and its wait, by an ExternalEvent record the host issued before an
eager wait, or because the host waited for it before issuing (the host's own clock, which a
synchronize, an event synchronize or a host read advances). An item is ordered before another when
its position is within the other's clock; when two items are not ordered, a card may run them
either way round, however fast or slow the device happens to be. So these are errors when the second
item is issued:

* an ExternalEvent record not ordered after whatever consumes the event's previous record (the
  replay whose captured wait and reset it released, or an eager reset): the earlier record can be
  lost and the next replay waits for ever — ``GraphHang``. Records and their consumers are paired in
  issue order per event (`_EventLedger`). A second record with no consumer issued in between keeps
  torch_npu-independent strictness: "recorded again without reset()";
* a task update not ordered after an earlier replay of its graph than the latest (the update is for
  the latest one): the earlier replay may still run the group, with the next step's parameters —
  ``StreamOrderError``;
* a host access to host memory a queued non-blocking copy writes (or reads) and the host did not
  wait for — ``StreamOrderError``.

Under ``lag="synchronous"`` the host waits for every item it issues, so the queues do not ask.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Optional

from ascendgraph.errors import (
    EVENT_RECORDED_BEFORE_CONSUMED,
    EXTERNAL_EVENT_NOT_RESET,
    HOST_ACCESS_BEFORE_COPY,
    UPDATE_BEFORE_REPLAY,
    GraphHang,
    StreamOrderError,
)

if TYPE_CHECKING:  # pragma: no cover
    from sim.queues import Queued
    from sim.streams import SimExternalEvent, SimStream

__all__ = ["Clock", "StreamOrder", "join"]

Clock = dict[int, int]  # stream id -> position of the last item ordered before


def join(a: Clock, b: Clock) -> Clock:
    """Everything ordered before either."""
    if not b:
        return dict(a)
    joined = dict(a)
    for key, value in b.items():
        if joined.get(key, 0) < value:
            joined[key] = value
    return joined


def upto(queued: "Queued") -> Clock:
    """``queued`` and everything ordered before it."""
    return {**queued.clock, queued.stream.stream_id: queued.position}


class _EventLedger:
    """The records of one ExternalEvent the host issued, each with what consumes it."""

    __slots__ = ("records", "waiting", "last_record", "__weakref__")

    def __init__(self) -> None:
        self.records: list[list[Any]] = []  # the last two: [record, consumer or None, consumer's name]
        self.waiting: deque[tuple[Queued, str]] = deque()  # consumers issued before the record they consume
        self.last_record: Optional[Queued] = None


class StreamOrder:
    """The queues' ordering book (module docstring)."""

    def __init__(self) -> None:
        self._positions: dict[int, int] = {}  # stream id -> items issued on it
        self._clocks: dict[int, Clock] = {}  # stream id -> what its next item is ordered after
        self.host: Clock = {}  # what the host knows has run
        self._replays: dict[int, list[Queued]] = {}  # id(graph) -> its replays not known to have run
        self._copies: list[Queued] = []  # queued work touching host memory

    # -- positions and clocks
    def place(self, stream: "SimStream", after: Optional[Clock] = None) -> tuple[int, Clock]:
        """The position and clock of an item issued on ``stream`` now (``after``: also ordered after it)."""
        sid = stream.stream_id
        position = self._positions.get(sid, 0) + 1
        self._positions[sid] = position
        clock = self.clock_of(stream)
        if after is not None:
            clock = join(clock, after)
        self._clocks[sid] = {**clock, sid: position}
        return position, clock

    def clock_of(self, stream: "SimStream") -> Clock:
        """What an item issued on ``stream`` now would be ordered after."""
        return join(self._clocks.get(stream.stream_id, {}), self.host)

    def host_waited_for(self, stream: "SimStream") -> None:
        """The host waited for everything issued on ``stream``."""
        sid = stream.stream_id
        self.host = join(self.host, {**self._clocks.get(sid, {}), sid: self._positions.get(sid, 0)})

    def host_waited_for_all(self) -> None:
        """The host waited for every stream (``device.synchronize()``)."""
        for sid, position in self._positions.items():
            self.host = join(self.host, {**self._clocks.get(sid, {}), sid: position})

    def host_waited_until(self, queued: "Queued") -> None:
        """The host waited for ``queued`` (an event's record)."""
        self.host = join(self.host, upto(queued))

    # -- copies
    def note_copy(self, queued: "Queued") -> None:
        self._copies = [each for each in self._copies if not each.ordered_before(self.host)]
        self._copies.append(queued)

    def copies_pending(self) -> bool:
        """Whether a queued copy touching host memory is not known to the host to have run."""
        self._copies = [each for each in self._copies if not each.ordered_before(self.host)]
        return bool(self._copies)

    def check_host_access(self, start: int, nbytes: int, what: str, *, write: bool) -> None:
        """The host is about to read (or write) host bytes [start, start + nbytes)."""
        end = start + nbytes
        for queued in list(self._copies):
            work = queued.item
            if queued.ordered_before(self.host):
                self._copies.remove(queued)
                continue
            span = work.host_writes if not write else (work.host_reads or work.host_writes)
            if span is not None and span[0] < end and start < span[1]:
                raise StreamOrderError(HOST_ACCESS_BEFORE_COPY.format(
                    what=what, access="writes" if write else "reads", copy=work.label, stream=queued.stream,
                    role="reads" if write and work.host_reads else "fills"))

    # -- replays, ExternalEvents
    def note_replay(self, queued: "Queued", resets: list["SimExternalEvent"]) -> None:
        """A replay queued: later updates of its graph are checked against it; it consumes one
        record of every event in ``resets``."""
        run = queued.item
        if any(segment.groups for segment in run.program.segments):  # only task updates ask about it
            replays = self._replays.setdefault(id(run.graph), [])
            replays[:] = [each for each in replays if not each.ordered_before(self.host)]
            replays.append(queued)
        for event in resets:
            self.note_consumer(event, queued, f"replay {run.number} of {run.graph.name}")

    def note_consumer(self, event: "SimExternalEvent", queued: "Queued", label: str) -> None:
        """``queued`` resets ``event``: it consumes the oldest record nothing consumes yet, or the next one."""
        ledger = self._ledger(event)
        open_record = next((entry for entry in ledger.records if entry[1] is None), None)
        if open_record is not None:
            open_record[1:] = [queued, label]
        else:
            ledger.waiting.append((queued, label))

    def check_record(self, event: "SimExternalEvent", stream: "SimStream") -> Optional[tuple["Queued", str]]:
        """A record of ``event`` about to be issued on ``stream``: raise when the previous record's
        consumer is not ordered before it; returns the consumer this record is for (or None)."""
        ledger = self._ledger(event)
        consumer = ledger.waiting[0] if ledger.waiting else None
        if ledger.records:
            _, previous, previous_label = ledger.records[-1]
            if previous is None:  # nothing issued in between consumes the previous record: the flag is still set
                raise RuntimeError(EXTERNAL_EVENT_NOT_RESET.format(event=event))
            if previous.stream is not stream and not previous.ordered_before(self.clock_of(stream)):
                what = f"the record for {consumer[1]}" if consumer is not None else "its next record"
                raise GraphHang(EVENT_RECORDED_BEFORE_CONSUMED.format(
                    event=event, stream=stream, what=what, consumer=previous_label, consumer_stream=previous.stream))
        return consumer

    def note_record(self, event: "SimExternalEvent", queued: "Queued",
                    consumer: Optional[tuple["Queued", str]]) -> None:
        ledger = self._ledger(event)
        ledger.last_record = queued
        if consumer is not None:
            ledger.waiting.popleft()
            ledger.records.append([queued, consumer[0], consumer[1]])
        else:
            ledger.records.append([queued, None, ""])
        del ledger.records[:-2]

    def last_record(self, event: "SimExternalEvent") -> Optional[Clock]:
        """The clock an eager wait on ``event`` is ordered after: its last record the host issued."""
        record = self._ledger(event).last_record
        return upto(record) if record is not None else None

    def _ledger(self, event: "SimExternalEvent") -> _EventLedger:
        ledger = event.ledger
        if ledger is None:
            ledger = event.ledger = _EventLedger()
        return ledger

    # -- task updates
    def check_update(self, graph: Any, group: str, stream: "SimStream", label: str) -> None:
        """A task update of ``graph``'s ``group`` on ``stream``: every replay of the graph before the
        latest must be ordered before it (the update is for the latest one)."""
        replays = self._replays.get(id(graph))
        if not replays:
            return
        clock = self.clock_of(stream)
        replays[:] = [queued for queued in replays if not queued.ordered_before(clock) and queued.stream is not stream]
        for queued in replays[:-1]:
            raise StreamOrderError(UPDATE_BEFORE_REPLAY.format(
                what=label, group=group, stream=stream, replay=f"replay {queued.item.number} of {graph.name}",
                replay_stream=queued.stream))
