"""The npu device's one seam to the simulator's internals (`sim.device.SimDevice`).

Every call the device makes into a SimDevice goes through this module, so the device does not
depend on how the simulator is assembled inside. What it uses:

* memory: ``device.memory.allocate(nbytes, stream=...) -> address``, ``free(address)``,
  ``allocated_bytes()``, ``reserved_bytes()``, ``empty_cache()`` (the simulator's caching
  allocator, graph pools included);
* stream queues: ``device.queues.submit(stream, work, label=...)`` and
  ``flush(stream, reason=...)`` (work runs when the simulated device gets to it, behind the host);
* ``device.host_read(what)``: before the host reads device memory (flushes; inside a capture it
  raises the simulator's host-sync error);
* streams: the current stream per thread, streams by id, new streams.

A SimDevice without ``memory`` / ``queues`` / ``host_read`` (the simulator before its memory
and queue components) gets the interim stand-ins below: plain host memory with byte accounting
and torch_npu's out-of-memory text, and work that runs when it is issued. They are marked for
replacement and used only through this module.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch

from sim.pool_memory import DeadWeakReference

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice
    from sim.streams import SimStream

__all__ = [
    "memory_of", "allocate", "free", "allocated_bytes", "reserved_bytes", "empty_cache", "submit", "flush",
    "host_read", "current_stream", "set_current_stream", "stream_by_id", "new_stream", "is_capturing",
    "weak_reference", "check_weak_reference", "DeadWeakReference", "out_of_memory_text", "format_size",
]


def format_size(nbytes: int) -> str:
    """torch_npu's size format (``format_size`` in NPUCachingAllocator.cpp): bytes up to 1 KiB,
    then KiB / MiB / GiB with two decimals."""
    if nbytes <= 1024:
        return f"{nbytes} bytes"
    if nbytes <= 1048576:
        return f"{nbytes / 1024.0:.2f} KiB"
    if nbytes <= 1073741824:
        return f"{nbytes / 1048576.0:.2f} MiB"
    return f"{nbytes / 1073741824.0:.2f} GiB"


def out_of_memory_text(nbytes: int, index: int, total: int, allocated: int, reserved: int) -> str:
    """torch_npu's out-of-memory message (torch-npu 2.13.0 lib/libtorch_npu.so: "NPU out of memory.
    Tried to allocate ", " total capacity; ", " already allocated; ", " free; ", " reserved in total
    by PyTorch)")."""
    free = max(total - reserved, 0)
    return (f"NPU out of memory. Tried to allocate {format_size(nbytes)} (NPU {index}; {format_size(total)} total "
            f"capacity; {format_size(allocated)} already allocated; {format_size(free)} free; "
            f"{format_size(reserved)} reserved in total by PyTorch)")


DEAD_WEAK_REFERENCE = (
    "simulator: {op} reads a tensor made by torch_npu._C._weak_ref_tensor ({what}) whose memory was {fate} "
    "since the reference was made; a card raises nothing and reads whatever the caching allocator put at that "
    "address since (a use-after-free). Keep a strong reference to the tensor for as long as the weak one is used"
)


class _InterimMemory:
    """Stand-in for ``device.memory`` until the simulator has it (replace, do not extend): every
    allocation is a fresh host buffer; freed addresses get a new generation, so a weak reference
    made before can tell that its block is gone."""

    def __init__(self, device: "SimDevice") -> None:
        self._device = weakref.ref(device)
        self._blocks: dict[int, tuple[torch.Tensor, bool]] = {}  # address -> (buffer, counted here)
        self._generation: dict[int, int] = {}
        self._bytes = 0

    def allocate(self, nbytes: int, *, stream: Any = None, counted: bool = True) -> int:
        device = self._device()
        if counted and device is not None:
            total = int(device.profile.memory_bytes)
            used = self._bytes + int(device.memory_allocated())
            if used + nbytes > total:
                raise torch.OutOfMemoryError(out_of_memory_text(nbytes, 0, total, used, used))
        buffer = torch.empty(max(nbytes, 1), dtype=torch.uint8)
        address = buffer.data_ptr()
        self._blocks[address] = (buffer, counted)
        self._generation[address] = self._generation.get(address, 0) + 1
        if counted:
            self._bytes += buffer.numel()
        return address

    def free(self, address: int) -> None:
        entry = self._blocks.pop(address, None)
        if entry is not None:
            buffer, counted = entry
            if counted:
                self._bytes -= buffer.numel()
            self._generation[address] = self._generation.get(address, 0) + 1

    def allocated_bytes(self) -> int:
        return self._bytes

    def reserved_bytes(self) -> int:
        return self._bytes

    def empty_cache(self) -> None:
        pass

    def generation(self, address: int) -> int:
        return self._generation.get(address, 0)

    def live(self, address: int) -> bool:
        return address in self._blocks


_INTERIM: "weakref.WeakKeyDictionary[Any, _InterimMemory]" = weakref.WeakKeyDictionary()


def memory_of(device: "SimDevice") -> Any:
    memory = getattr(device, "memory", None)
    if memory is not None:
        return memory
    interim = _INTERIM.get(device)
    if interim is None:
        interim = _INTERIM[device] = _InterimMemory(device)
    return interim


def is_capturing(device: "SimDevice", stream: Optional["SimStream"] = None) -> bool:
    """Whether ``stream`` (default: the current one) is being captured."""
    return bool(device.is_current_stream_capturing()) if stream is None or stream is device.current_stream() else False


def allocate(device: "SimDevice", nbytes: int) -> int:
    """A block of device memory for the current stream (the capture's pool while it captures)."""
    memory = memory_of(device)
    if isinstance(memory, _InterimMemory):
        # While capturing, the capture takes its outputs' bytes from its graph pool and counts
        # them there; the interim allocator only lends the host buffer.
        return memory.allocate(nbytes, counted=not is_capturing(device))
    return int(memory.allocate(nbytes, stream=device.current_stream()))


def free(device: "SimDevice", address: int) -> None:
    memory_of(device).free(address)


def allocated_bytes(device: "SimDevice") -> int:
    return int(memory_of(device).allocated_bytes())


def reserved_bytes(device: "SimDevice") -> int:
    return int(memory_of(device).reserved_bytes())


def empty_cache(device: "SimDevice") -> None:
    memory_of(device).empty_cache()


# ------------------------------------------------------------------ weak references
class WeakRecord:
    """What a weak alias was made from: the block's address and its generation then."""

    __slots__ = ("device", "address", "generation", "what")

    def __init__(self, device: "SimDevice", address: int, generation: int, what: str) -> None:
        self.device = weakref.ref(device)
        self.address = address
        self.generation = generation
        self.what = what


def weak_reference(device: "SimDevice", address: int, what: str) -> WeakRecord:
    memory = memory_of(device)
    generation = memory.generation(address) if hasattr(memory, "generation") else 0
    return WeakRecord(device, address, generation, what)


def check_weak_reference(record: WeakRecord, op: str) -> None:
    """DeadWeakReference when the block behind a weak alias was freed or handed out again."""
    device = record.device()
    if device is None:
        raise DeadWeakReference(DEAD_WEAK_REFERENCE.format(op=op, what=record.what, fate="released with its simulated NPU"))
    memory = memory_of(device)
    check = getattr(memory, "check_weak_reference", None)
    if check is not None:  # the simulator's own block-generation check
        check(record.address, record.generation, op=op, what=record.what)
        return
    if not memory.live(record.address):
        raise DeadWeakReference(DEAD_WEAK_REFERENCE.format(op=op, what=record.what, fate="freed"))
    if memory.generation(record.address) != record.generation:
        raise DeadWeakReference(DEAD_WEAK_REFERENCE.format(op=op, what=record.what,
                                                           fate="freed and handed to another tensor"))


# ------------------------------------------------------------------ queues, host reads
def submit(device: "SimDevice", stream: "SimStream", work: Callable[[], None], label: str) -> None:
    queues = getattr(device, "queues", None)
    if queues is None:  # interim: the device runs work when it is issued
        work()
        return
    queues.submit(stream, work, label=label)


def flush(device: "SimDevice", stream: Optional["SimStream"], reason: str) -> None:
    queues = getattr(device, "queues", None)
    if queues is not None:
        queues.flush(stream, reason=reason)


def host_read(device: "SimDevice", what: str) -> None:
    """The host is about to read device memory: a synchronisation (refused inside a capture)."""
    read = getattr(device, "host_read", None)
    if read is not None:
        read(what)
        return
    device._check_alive()  # interim, until SimDevice.host_read
    device._host_sync_check(what)


# ------------------------------------------------------------------ streams
def current_stream(device: "SimDevice") -> "SimStream":
    return device.current_stream()


def stream_by_id(device: "SimDevice", stream_id: int) -> "SimStream":
    for stream in device._streams:  # interim, until the simulator looks streams up by id
        if stream.stream_id == stream_id:
            return stream
    raise RuntimeError(f"sim.npu_device: stream {stream_id} does not exist on {device!r}")


def set_current_stream(device: "SimDevice", stream: "SimStream") -> None:
    device._tls.stream = None if stream is device.default_stream() else stream  # interim: the per-thread slot


def new_stream(device: "SimDevice") -> "SimStream":
    return device.new_stream()
