"""Streams, events and external events of the simulated device.

A stream is a queue of device work (`sim.queues`: what the host issues runs when something
waits for it). An Event recorded on a stream is a marker in its queue: another stream waiting on
it goes on once the marker is reached, ``event.synchronize()`` runs the queue up to it. An
ExternalEvent is a flag: a wait (eager, or captured in a graph) holds its stream until a record
sets it, a reset clears it. The device's queues own that logic; these objects carry the state
and forward to them.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Any, Deque, Optional

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["SimStream", "SimEvent", "SimExternalEvent"]


class SimStream:
    """An ordered queue of device work (torch_npu's Stream)."""

    __slots__ = ("_device", "_stream_id", "name", "pending", "__weakref__")

    def __init__(self, device: "SimDevice", stream_id: int, name: str) -> None:
        self._device = device
        self._stream_id = stream_id
        self.name = name
        # Work that cannot run yet: the head is suspended on an unrecorded ExternalEvent.
        self.pending: Deque[Any] = deque()

    @property
    def stream_id(self) -> int:
        return self._stream_id

    @property
    def device(self) -> "SimDevice":
        return self._device

    def wait_event(self, event: "SimEvent | SimExternalEvent") -> None:
        event.wait(self)

    def wait_stream(self, stream: "SimStream") -> None:
        """Order this stream's later work after everything issued on ``stream`` so far."""
        self._device.check_alive()
        if stream is self:
            return
        queues = self._device.queues
        queues.wait_for(self, queues.tail(stream))

    def record_event(self, event: "Optional[SimEvent]" = None) -> "SimEvent":
        event = event or self._device.new_event()
        event.record(self)
        return event

    def query(self) -> bool:
        """True when the stream has no work left: the device runs what it can first (it does not
        stand still while the host asks)."""
        self._device.queues.run(self)
        return not self.pending

    def synchronize(self) -> None:
        self._device.synchronize_stream(self)

    def __repr__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


class SimEvent:
    """A marker recorded on one stream and waited on by another (record before wait)."""

    __slots__ = ("_device", "name", "recorded", "marker")

    def __init__(self, device: "SimDevice", name: str) -> None:
        self._device = device
        self.name = name
        self.recorded = False
        self.marker: Any = None  # its place in the recording stream's queue (`sim.queues.Queued`)

    def record(self, stream: Optional[SimStream] = None) -> None:
        from sim.queues import Marker

        device = self._device
        device.check_alive()
        self.recorded = True
        stream = stream or device.current_stream()
        if stream is device.capturing_stream():
            return  # inside a capture: part of the graph (not modelled), not device work of its own
        self.marker = device.queues.issue(stream, Marker(self))

    def wait(self, stream: Optional[SimStream] = None) -> None:
        """``stream``'s later work waits until the device reached this event's record."""
        device = self._device
        device.check_alive()
        stream = stream or device.current_stream()
        if self.marker is not None and stream is not device.capturing_stream():
            device.queues.wait_for(stream, self.marker)

    def query(self) -> bool:
        return self.marker is None or self._device.queues.marker_done(self.marker)

    def synchronize(self) -> None:
        self._device.check_host_sync(f"{self.name}.synchronize()")
        if self.marker is not None:
            self._device.queues.host_waited(self.marker, reason=f"{self.name}.synchronize()")

    def __repr__(self) -> str:
        return self.name


class SimExternalEvent:
    """torch_npu's ExternalEvent: wait may come before record; reset before reuse.

    Inside a capture, wait / reset / record on the capturing stream become nodes of the
    graph; outside, record sets the flag (and resumes what waits on it), reset clears it.
    """

    __slots__ = ("_device", "name", "flag", "recorded_us", "ledger")

    def __init__(self, device: "SimDevice", name: str) -> None:
        self._device = device
        self.name = name
        self.flag = False
        self.recorded_us = 0.0  # the host clock when the record that set the flag was issued
        self.ledger: Any = None  # its records and their consumers (`sim.queues`)

    def record(self, stream: Optional[SimStream] = None) -> None:
        self._device.replays.record_external(self, stream)

    def wait(self, stream: Optional[SimStream] = None) -> None:
        self._device.replays.wait_external(self, stream)

    def reset(self, stream: Optional[SimStream] = None) -> None:
        self._device.replays.reset_external(self, stream)

    def __repr__(self) -> str:
        return self.name
