"""The npu device's one seam to the simulator's internals (`sim.device.SimDevice`).

Every call the device makes into a SimDevice goes through this module, so the device does not
depend on how the simulator is assembled inside. What it uses:

* ``device.memory`` (`sim.memory.DeviceMemory`): ``allocate(nbytes, stream=...) -> address``
  (a block of the capture's graph pool while the stream captures), ``free(address)``, the
  figures behind ``torch.npu.memory_allocated`` / ``memory_reserved``, ``empty_cache()``;
* ``device.queues`` (`sim.queues.StreamQueues`): ``submit(stream, work, label=...)`` and
  ``flush(stream, reason=...)``: the device runs work when its stream gets to it;
* ``device.host_read(what)``: before the host reads device memory (inside a capture it raises
  the simulator's host-sync error); ``device.host_access(tensor, ...)`` and the queues' pending
  host-side copies, running state and host-wait listeners, for `sim.npu_device.host_guard`;
* ``device.pool_allocation(tensor)``: the graph-pool block a tensor lies on, for weak references;
* streams: the current stream per thread, streams by id, new streams.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes

from sim import kernels
from sim.pool_memory import READ, DeadWeakReference, PoolBlockReused, PoolWeakTensor

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice
    from sim.streams import SimStream

__all__ = [
    "allocate", "free", "allocated_bytes", "reserved_bytes", "empty_cache", "submit", "flush", "host_read",
    "copy", "current_stream", "set_current_stream", "stream_by_id", "new_stream", "WeakRecord", "weak_reference",
    "check_weak_reference", "DeadWeakReference", "PoolBlockReused", "DEAD_WEAK_REFERENCE", "Block",
]

DEAD_WEAK_REFERENCE = (
    "simulator: {op} reads a tensor made by torch_npu._C._weak_ref_tensor ({what}) whose memory was {fate} since "
    "the reference was made; a card raises nothing and reads whatever the caching allocator put at that address "
    "(a use-after-free). Keep a strong reference to the tensor for as long as the weak one is used"
)


# ------------------------------------------------------------------ memory
class Block:
    """What the driver keeps per block it handed out: the address; for a block of a graph pool,
    that pool, which holds the block's memory for as long as a tensor is on it; and what keeps
    the block's bytes mapped (its segment) for device work queued on them. A ``scratch`` block
    is a replay kernel's own result, outside the device's pools (`allocate`)."""

    __slots__ = ("address", "pool", "keeper", "scratch")

    def __init__(self, address: int, pool: Any, keeper: Any, *, scratch: bool = False) -> None:
        self.address = address
        self.pool = pool
        self.keeper = keeper
        self.scratch = scratch


def allocate(device: "SimDevice", nbytes: int) -> Block:
    """A block of device memory for the current stream (the capture's pool while it captures).

    While a graph replay runs, the result a kernel computes before it lands in its captured
    output is scratch outside the device's pools: a replay allocates nothing on a card, and the
    caching allocator's state then is the host's, which may be ahead of the device (a block the
    host freed behind work still queued is free to the host, not to the replay)."""
    if kernels.replaying_now():
        with torch._C.DisableTorchFunction(), _disable_current_modes():
            memory = torch.empty(nbytes, dtype=torch.uint8)
        return Block(memory.data_ptr() if nbytes else 0, None, memory, scratch=True)
    address = int(device.memory.allocate(nbytes, stream=device.current_stream()))
    pool, keeper = None, None
    block = device.memory.block_at(address) if address else None
    if block is not None:
        keeper = block.segment
    elif address:
        # A graph-pool block: sim.memory frees it only while its pool is registered (a reset
        # graph's private pool is not), so the pool is kept here with the block.
        capture = device.capture_in_progress
        pool = capture.pool if capture is not None else None
        allocation = pool.arena.live.get(address) if pool is not None else None
        keeper = allocation.segment if allocation is not None else pool
    return Block(address, pool, keeper)


def free(device: "SimDevice", block: Block) -> None:
    if block.scratch:
        return  # its memory goes with the block (keeper)
    capture = device.capture_in_progress
    if block.pool is not None and block.pool not in device.pools.all() and (
            capture is None or capture.pool is not block.pool):
        block.pool.arena.release_raw(block.address)  # its graph was reset: the pool outlives it for this block
        return
    device.memory.free(block.address)


def allocated_bytes(device: "SimDevice") -> int:
    return int(device.memory.allocated_bytes())


def reserved_bytes(device: "SimDevice") -> int:
    return int(device.memory.reserved_bytes())


def empty_cache(device: "SimDevice") -> None:
    device.memory.empty_cache()


# ------------------------------------------------------------------ weak references
class WeakRecord:
    """What a weak alias was made from. A graph-pool block gets the pool's own weak reference
    (`sim.pool_memory.PoolWeakTensor`) as its checker: its graph reset, another allocation's
    write since, the end of its graph's program; the capture's checks see it through
    `sim.pool_checks.weak_view`. A block of the device's own pool keeps the allocator
    generation of its address (freed, or freed and handed out again)."""

    __slots__ = ("address", "generation", "checker", "what")

    def __init__(self, address: int, generation: int, checker: Optional[PoolWeakTensor], what: str) -> None:
        self.address = address
        self.generation = generation
        self.checker = checker
        self.what = what


def weak_reference(device: "SimDevice", tensor: Any, address: int, generation: int, what: str) -> WeakRecord:
    allocation = device.pool_allocation(tensor)
    checker = PoolWeakTensor(tensor, allocation) if allocation is not None else None
    return WeakRecord(address, generation, checker, what)


def check_weak_reference(record: WeakRecord, op: Any, current_generation: Callable[[int], int], *,
                         role: str = READ) -> None:
    """Raise when the memory behind a weak alias is not what the alias was made from any more, for
    an op using it as ``role`` (`sim.pool_memory.argument_roles`): DeadWeakReference (freed; a
    graph-pool block whose graph was reset) or PoolBlockReused (another allocation wrote the
    block since)."""
    if record.checker is not None:
        record.checker.resolve(str(op), role=role, func=op)
        return
    generation = current_generation(record.address)
    if generation != record.generation:
        fate = "freed" if generation < 0 else "freed and handed to another tensor"
        raise DeadWeakReference(DEAD_WEAK_REFERENCE.format(op=op, what=record.what, fate=fate))


# ------------------------------------------------------------------ queues, host reads
def submit(device: "SimDevice", stream: "SimStream", work: Callable[[], None], label: str) -> None:
    """Queue ``work`` on ``stream``; while the device is running a graph replay the kernels the
    replay issues are the replay's own work and run where they stand."""
    if kernels.replaying_now():
        work()
        return
    device.queues.submit(stream, work, label=label)


def copy(device: "SimDevice", stream: "SimStream", destination: Any, source: Any, *, destination_is_host: bool,
         source_is_host: bool, label: str) -> None:
    """A non-blocking copy between pinned host memory and the device, queued on ``stream``; while
    it is queued the host must not touch the host side (`sim.queues.StreamQueues.copy`)."""
    if kernels.replaying_now():
        destination.copy_(source)
        return
    device.queues.copy(destination, source, stream=stream, destination_is_host=destination_is_host,
                       source_is_host=source_is_host, label=label)


def host_copies_pending(device: "SimDevice") -> bool:
    """Whether a queued copy with a host side is not known to the host to have run."""
    return device.queues.host_copies_pending()


def device_is_running_work(device: "SimDevice") -> bool:
    """Whether the device's queued work is running right now (its ops are not the host's)."""
    return device.queues.running


def on_host_wait(device: "SimDevice", listener: Callable[[], None]) -> None:
    """Call ``listener`` whenever the host waited for something on ``device``."""
    device.queues.host_wait_listeners.append(listener)


def host_access(device: "SimDevice", tensor: Any, what: str, *, write: bool) -> None:
    """The host reads (writes) ``tensor``'s host memory: StreamOrderError when a queued copy
    that nothing waited for fills (reads) it."""
    device.host_access(tensor, what, write=write)


def flush(device: "SimDevice", stream: Optional["SimStream"], reason: str) -> None:
    device.queues.flush(stream, reason=reason)


def host_read(device: "SimDevice", what: str) -> None:
    """The host is about to read device memory: a synchronisation (refused inside a capture)."""
    device.host_read(what)


# ------------------------------------------------------------------ streams
def current_stream(device: "SimDevice") -> "SimStream":
    return device.current_stream()


def stream_by_id(device: "SimDevice", stream_id: int, known: Mapping[int, "SimStream"]) -> "SimStream":
    """The stream numbered ``stream_id``: the default one, or one the driver has seen (made,
    current, or noted by the facade's ``torch.npu.Stream``)."""
    if stream_id == device.default_stream().stream_id:
        return device.default_stream()
    stream = known.get(stream_id)
    if stream is None or stream.device is not device:
        raise RuntimeError(f"sim.npu_device: stream {stream_id} is not a stream of {device!r}")
    return stream


def set_current_stream(device: "SimDevice", stream: "SimStream") -> None:
    device.set_current_stream(stream)


def new_stream(device: "SimDevice") -> "SimStream":
    return device.new_stream()
