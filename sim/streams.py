"""Streams, events and external events of the simulated device.

On the CPU every eager op runs when it is issued, so plain events only order work that
is already done: recording and waiting are bookkeeping. What does matter is the graph
side: a captured ExternalEvent wait suspends a replay until the event is recorded, and a
stream holding a suspended replay (or an eager wait on an unrecorded ExternalEvent)
queues later replays behind it. The device owns that logic; these objects carry the
state and forward to it.
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
        """Order this stream after ``stream`` (bookkeeping only on the CPU)."""
        self._device._check_alive()

    def record_event(self, event: "Optional[SimEvent]" = None) -> "SimEvent":
        event = event or self._device.new_event()
        event.record(self)
        return event

    def query(self) -> bool:
        """True when the stream has no work left (nothing suspended)."""
        return not self.pending

    def synchronize(self) -> None:
        self._device._synchronize_streams([self], what=f"{self}.synchronize()")

    def __repr__(self) -> str:
        return self.name

    def __eq__(self, other: object) -> bool:
        return self is other

    def __hash__(self) -> int:
        return id(self)


class SimEvent:
    """A marker recorded on one stream and waited on by another (record before wait)."""

    __slots__ = ("_device", "name", "recorded")

    def __init__(self, device: "SimDevice", name: str) -> None:
        self._device = device
        self.name = name
        self.recorded = False

    def record(self, stream: Optional[SimStream] = None) -> None:
        self._device._check_alive()
        self.recorded = True

    def wait(self, stream: Optional[SimStream] = None) -> None:
        self._device._check_alive()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self._device._host_sync_check(f"{self.name}.synchronize()")

    def __repr__(self) -> str:
        return self.name


class SimExternalEvent:
    """torch_npu's ExternalEvent: wait may come before record; reset before reuse.

    Inside a capture, wait / reset / record on the capturing stream become nodes of the
    graph; outside, record sets the flag (and resumes what waits on it), reset clears it.
    """

    __slots__ = ("_device", "name", "flag")

    def __init__(self, device: "SimDevice", name: str) -> None:
        self._device = device
        self.name = name
        self.flag = False

    def record(self, stream: Optional[SimStream] = None) -> None:
        self._device._external_record(self, stream)

    def wait(self, stream: Optional[SimStream] = None) -> None:
        self._device._external_wait(self, stream)

    def reset(self, stream: Optional[SimStream] = None) -> None:
        self._device._external_reset(self, stream)

    def __repr__(self) -> str:
        return self.name
