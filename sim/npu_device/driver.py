"""The Python driver the npu device's C++ calls (allocator, device guard, events).

The C++ side (``csrc/npu_device.cpp``) asks this object for everything that is a decision:
which simulated NPU serves ``npu:<index>``, where a block of device memory comes from, which
stream is current, what an event is. The answers come from the simulator
(`sim.npu_device.simulator`, the only module that touches a SimDevice).

One driver per process, because torch's PrivateUse1 registration is per process. What it
serves is attached: ``attach(provider)`` with ``provider(index) -> SimDevice`` (the facade
attaches its runtime's current device; a test can attach one SimDevice). A tensor remembers
the simulated NPU that allocated it: its memory goes back there when freed, and an op mixing
tensors of two simulated NPUs is refused (`owner`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

from ascendgraph.errors import DeviceUnavailable
from sim.npu_device import simulator

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice
    from sim.streams import SimEvent, SimStream

__all__ = ["Driver", "NoSimulatedNpu", "NOT_ATTACHED"]

NOT_ATTACHED = (
    "sim.npu_device: no simulated NPU is attached to the npu device; install the torch_npu facade "
    "(python -m sim.facade -- CMD, sim.facade.install()) or attach one with sim.npu_device.attach(device)"
)


class NoSimulatedNpu(DeviceUnavailable):
    """An npu tensor was made or used while no simulated NPU was attached (a RuntimeError, as
    torch's own device errors are)."""


class Driver:
    """See the module docstring. Method names are what the C++ calls."""

    def __init__(self) -> None:
        self._provider: Optional[Callable[[int], "SimDevice"]] = None
        self._lock = threading.RLock()
        # address -> the simulated NPU that handed it out and the block. Held strongly: the
        # memory (the device's segments, a graph pool's) must outlive every tensor on it, even
        # after the facade moved on to a fresh simulated NPU or the graph was reset.
        self._owners: dict[int, "SimDevice"] = {}
        self._blocks: dict[int, simulator.Block] = {}
        self._events: dict[int, "SimEvent"] = {}
        # stream id -> stream, for the streams the device guard may name (weakly: a stream nobody
        # holds is gone). Keyed by the simulated NPU, whose stream ids start at 0 each.
        self._streams: "weakref.WeakKeyDictionary[SimDevice, weakref.WeakValueDictionary[int, SimStream]]" = \
            weakref.WeakKeyDictionary()
        self._event_ids = itertools.count(1)
        self._weak: dict[int, simulator.WeakRecord] = {}  # token -> what a weak alias was made from
        self._extension_weak_token: Optional[Callable[[Any], int]] = None  # set with the extension
        self._weak_ids = itertools.count(1)
        # address -> how many times the allocator has handed it out (negative while it is free):
        # a weak alias made at one generation is dead at any other.
        self._generations: dict[int, int] = {}

    # ------------------------------------------------------------------ attachment
    def attach(self, provider: Optional[Callable[[int], "SimDevice"]]) -> None:
        self._provider = provider

    @property
    def attached(self) -> bool:
        return self._provider is not None

    def device(self, index: int = 0) -> "SimDevice":
        provider = self._provider
        if provider is None:
            raise NoSimulatedNpu(NOT_ATTACHED)
        return provider(index)

    def owner(self, address: int) -> Optional["SimDevice"]:
        """The simulated NPU whose memory ``address`` (a storage's base address) is."""
        return self._owners.get(address)

    # ------------------------------------------------------------------ memory (the allocator)
    def malloc(self, nbytes: int, index: int) -> int:
        device = self.device(index)
        block = simulator.allocate(device, int(nbytes))
        address = block.address
        with self._lock:
            self._owners[address] = device
            self._blocks[address] = block
            self._generations[address] = abs(self._generations.get(address, 0)) + 1
        return address

    def free(self, address: int) -> None:
        with self._lock:
            device = self._owners.pop(address, None)
            block = self._blocks.pop(address, None)
            self._generations[address] = -abs(self._generations.get(address, 0))
        if device is not None and block is not None:
            simulator.free(device, block)

    def keepers(self, addresses: list[int]) -> list[Any]:
        """What keeps the memory at these base addresses mapped while queued work uses it."""
        blocks = self._blocks
        return [blocks[address].keeper for address in addresses if address in blocks]

    # ------------------------------------------------------------------ weak aliases
    def weak_record(self, token: int) -> simulator.WeakRecord:
        return self._weak[token]

    def generation(self, address: int) -> int:
        """How many times ``address`` was handed out (negative: free now)."""
        return self._generations.get(address, 0)

    def new_weak_token(self, device: "SimDevice", tensor: Any, what: str) -> int:
        address = tensor.untyped_storage().data_ptr()
        token = next(self._weak_ids)
        self._weak[token] = simulator.weak_reference(device, tensor, address, self.generation(address), what)
        return token

    def check_weak(self, token: int, op: Any, *, role: str) -> None:
        simulator.check_weak_reference(self._weak[token], op, self.generation, role=role)

    def weak_view(self, tensor: Any) -> Any:
        """The pool's weak reference a weak alias of a graph-pool block stands for (None for any
        other tensor): `sim.pool_checks.weak_view` asks, so a capture checks it."""
        token = self._extension_weak_token(tensor) if self._extension_weak_token is not None else -1
        if token < 0:
            return None
        record = self._weak.get(token)
        return record.checker if record is not None else None

    def copy_weak_token(self, token: int) -> int:
        copy = next(self._weak_ids)
        self._weak[copy] = self._weak[token]
        return copy

    def drop_weak(self, token: int) -> None:
        """The last tensor on a weak alias's storage is gone (called by the C++)."""
        self._weak.pop(token, None)

    # ------------------------------------------------------------------ streams (the device guard)
    def note_stream(self, stream: "SimStream") -> "SimStream":
        """Remember ``stream`` so the device guard can name it by id."""
        known = self._streams.get(stream.device)
        if known is None:
            known = self._streams[stream.device] = weakref.WeakValueDictionary()
        known[stream.stream_id] = stream
        return stream

    def _stream(self, device: "SimDevice", stream_id: int) -> "SimStream":
        return simulator.stream_by_id(device, stream_id, self._streams.get(device, {}))

    def current_stream(self, index: int) -> int:
        if not self.attached:
            return 0
        return self.note_stream(simulator.current_stream(self.device(index))).stream_id

    def new_stream(self, index: int, priority: int) -> int:
        return self.note_stream(simulator.new_stream(self.device(index))).stream_id

    def exchange_stream(self, stream_id: int, index: int) -> int:
        device = self.device(index)
        previous = self.note_stream(simulator.current_stream(device)).stream_id
        simulator.set_current_stream(device, self._stream(device, stream_id))
        return previous

    def query_stream(self, stream_id: int, index: int) -> bool:
        device = self.device(index)
        return bool(self._stream(device, stream_id).query())

    def synchronize_stream(self, stream_id: int, index: int) -> None:
        device = self.device(index)
        self._stream(device, stream_id).synchronize()

    def synchronize(self, index: int) -> None:
        self.device(index).synchronize()

    # ------------------------------------------------------------------ events (the device guard)
    def create_event(self, index: int) -> int:
        event_id = next(self._event_ids)
        self._events[event_id] = self.device(index).new_event()
        return event_id

    def record_event(self, event_id: int, stream_id: int, index: int) -> None:
        device = self.device(index)
        self._events[event_id].record(self._stream(device, stream_id))

    def wait_event(self, event_id: int, stream_id: int, index: int) -> None:
        device = self.device(index)
        self._events[event_id].wait(self._stream(device, stream_id))

    def query_event(self, event_id: int) -> bool:
        return bool(self._events[event_id].query())

    def synchronize_event(self, event_id: int) -> None:
        self._events[event_id].synchronize()

    def destroy_event(self, event_id: int) -> None:
        self._events.pop(event_id, None)

    def __repr__(self) -> str:
        return f"<sim.npu_device driver ({'attached' if self.attached else 'not attached'}, {len(self._owners)} blocks)>"


def describe(value: Any) -> str:
    """A tensor as messages name it: shape, dtype, device."""
    shape = tuple(getattr(value, "shape", ()))
    dtype = str(getattr(value, "dtype", "")).replace("torch.", "")
    return f"shape {shape}, {dtype}, {getattr(value, 'device', '?')}"
