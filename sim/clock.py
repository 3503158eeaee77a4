"""The simulated device's virtual clock: the host's time, the device's time and the order of events.

Theory of operation. Two clocks in microseconds run side by side (`sim.cost` prices the work):
the *host* clock advances by what the host spends issuing work (a launch, a capture, a task
update, an injected delay); the *device* clock advances by what the device's tasks take. A task
starts on the device when both the device is free and the host has issued it (``ready_us``: the
host time of its launch, or of the record that released its wait), so a device that runs behind
the host (`sim.queues`) still places each task where a card would. ``synchronize`` brings the
host up to the device; virtual time is the later of the two.

The clock also hands out *stamps*: one increasing counter ordering replay launches, applied task
updates and the writes of graph-pool blocks (`sim.pool_memory`), so "updated since that replay
began" and "written after its owner last did" are comparisons of two integers.
"""

from __future__ import annotations

from itertools import count

__all__ = ["VirtualClock"]


class VirtualClock:
    """``device.virtual_clock`` (module docstring)."""

    __slots__ = ("host_us", "device_us", "capture_us", "_stamps")

    def __init__(self) -> None:
        self.host_us = 0.0
        self.device_us = 0.0
        self.capture_us = 0.0  # host time spent capturing (a share of host_us)
        self._stamps = count(1)

    def next_stamp(self) -> int:
        """The next position in the device's order of events."""
        return next(self._stamps)

    def host_spends(self, us: float) -> None:
        """The host spends ``us`` issuing something."""
        self.host_us += us

    def device_runs(self, ready_us: float, duration_us: float) -> float:
        """A task of ``duration_us`` that may start at host time ``ready_us``: returns its start."""
        start = max(self.device_us, ready_us)
        self.device_us = start + duration_us
        return start

    def host_waits(self) -> None:
        """The host waited for the device: it is at least as late as the device."""
        self.host_us = max(self.host_us, self.device_us)

    @property
    def now_us(self) -> float:
        """Virtual time: the later of the two clocks."""
        return max(self.host_us, self.device_us)
