"""Device memory of the simulator: a caching allocator shaped like torch_npu's, the device's
own pool and the graph pools, and the raw interface a device type allocates through.

Theory of operation. torch_npu's NPU caching allocator (torch_npu/csrc/core/npu/
NPUCachingAllocator.cpp in Ascend/pytorch, a port of c10/cuda/CUDACachingAllocator.cpp) never
gives memory back to the driver when a tensor dies: the block goes to a free list of its pool
and the next request that fits gets it. The simulator keeps the same shape, so that what a
card would hand out again is what the simulator hands out again:

* every request is rounded up to a multiple of 512 bytes (``kMinBlockSize``);
* requests of at most 1 MiB (``kSmallSize``) come from the *small* pool, whose segments are
  2 MiB (``kSmallBuffer``); larger ones from the *large* pool: a request under 10 MiB
  (``kMinLargeAlloc``) reserves a 20 MiB segment (``kLargeBuffer``), a larger one its own size
  rounded up to 2 MiB (``kRoundLarge``) (``get_allocation_size``);
* the free block chosen is the smallest that fits (best fit; the lowest address among equal
  sizes), and only among blocks last used on the requesting stream (a block is associated
  with the stream it was allocated on);
* a block larger than the request is split when the rest is worth keeping: at least 512 bytes
  in the small pool, more than 1 MiB in the large pool (``should_split``); a freed block merges
  with free neighbours of its segment;
* ``empty_cache`` gives back segments whose blocks are all free. When a new segment would take
  the device past its memory, the cached free segments are released and the request retried;
  then it fails with torch_npu's text ("NPU out of memory. Tried to allocate ...").

A graph pool (``torch.npu.graph_pool_handle()``, or a capture's private pool) is a pool of its
own: blocks allocated while a stream captures into it come from it, and freed, return to it,
so a later allocation of the same capture, or of a later capture into the same pool, may be
handed them (the private pools of c10's allocator, ``graph_pools``).

Addresses are real host addresses: a segment is an owned ``uint8`` CPU tensor, a block an
address range inside it. `DeviceMemory` (``device.memory``) is the raw interface: allocate /
free by address, the figures ``torch.npu.memory_allocated`` / ``memory_reserved`` report, and
``empty_cache``. Tensor-level use of graph-pool blocks (the captured code's alias, the replay
program's alias, weak references and their checks) is `sim.pool_memory`.

What is approximated: torch_npu's 32-byte pad before rounding on some SoCs, expandable
segments, ``max_split_size`` and garbage-collection thresholds are not modelled; a request
of 0 bytes gets no block (address 0), as c10 returns a null pointer for it.
"""

from __future__ import annotations

import contextlib
from bisect import bisect_left, insort
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ascendgraph.errors import TEXT_NPU_OOM, ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from sim.streams import SimStream

__all__ = [
    "MIN_BLOCK_BYTES",
    "SMALL_SIZE",
    "SMALL_SEGMENT",
    "LARGE_SEGMENT",
    "MIN_LARGE_ALLOC",
    "ROUND_LARGE",
    "round_size",
    "segment_size",
    "Segment",
    "Block",
    "BlockPool",
    "DeviceMemory",
    "MemoryOwner",
    "DeviceMemoryOwner",
    "out_of_memory",
]

# The allocator's constants (NPUCachingAllocator.cpp / CUDACachingAllocator.cpp, same names there).
MIN_BLOCK_BYTES = 512  # kMinBlockSize: every size is rounded up to a multiple of it
SMALL_SIZE = 1 << 20  # kSmallSize: the largest "small" request
SMALL_SEGMENT = 2 << 20  # kSmallBuffer: small requests are packed in segments of this size
LARGE_SEGMENT = 20 << 20  # kLargeBuffer: requests between 1 and 10 MiB reserve a segment of this size
MIN_LARGE_ALLOC = 10 << 20  # kMinLargeAlloc: from here on a request gets a segment of its own
ROUND_LARGE = 2 << 20  # kRoundLarge: a request's own segment is rounded up to this


def _no_modes() -> Any:
    """Hide the dispatch modes under way (a capture, a tracker) from the allocator's own work."""
    return _disable_current_modes() if torch._C._len_torch_dispatch_stack() else contextlib.nullcontext()


def round_size(nbytes: int) -> int:
    """What a block of ``nbytes`` takes (``round_size``): a multiple of 512, at least 512."""
    if nbytes < MIN_BLOCK_BYTES:
        return MIN_BLOCK_BYTES
    return -(-nbytes // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES


def segment_size(size: int) -> int:
    """What a new segment for a block of ``size`` (rounded) reserves (``get_allocation_size``)."""
    if size <= SMALL_SIZE:
        return SMALL_SEGMENT
    if size < MIN_LARGE_ALLOC:
        return LARGE_SEGMENT
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def out_of_memory(nbytes: int, detail: str) -> torch.OutOfMemoryError:
    """torch_npu's OOM (a ``torch.OutOfMemoryError`` opening with its text), with what the simulator saw."""
    return torch.OutOfMemoryError(TEXT_NPU_OOM.format(size=f"{nbytes / 2**20:.2f} MiB") + f" ({detail})")


class Segment:
    """One reservation of host memory (what ``aclrtMalloc`` returned to the allocator)."""

    __slots__ = ("memory", "address", "nbytes", "small", "__weakref__")

    def __init__(self, nbytes: int, small: bool) -> None:
        with torch._C.DisableTorchFunction(), _no_modes():  # the allocator's own memory, never a captured op
            self.memory = torch.empty(nbytes, dtype=torch.uint8)
        self.address = self.memory.data_ptr()
        self.nbytes = nbytes
        self.small = small


class Block:
    """An address range of a segment, free or handed out. ``holder`` is what the pool's user
    keeps about it while it is handed out (`sim.pool_memory.PoolAllocation`, or None)."""

    __slots__ = ("segment", "address", "size", "requested", "allocated", "prev", "next", "stream_id", "holder")

    def __init__(self, segment: Segment, address: int, size: int, stream_id: int) -> None:
        self.segment = segment
        self.address = address
        self.size = size
        self.requested = 0
        self.allocated = False
        self.prev: Optional[Block] = None
        self.next: Optional[Block] = None
        self.stream_id = stream_id
        self.holder: Any = None

    @property
    def offset(self) -> int:
        """Where the block starts inside its segment."""
        return self.address - self.segment.address

    def __repr__(self) -> str:
        state = "allocated" if self.allocated else "free"
        return f"<Block {self.size} bytes at +{self.offset} of a {self.segment.nbytes}-byte segment, {state}>"


class BlockPool:
    """The segments and free blocks of one pool (the device's own, or one graph pool), its small
    and large blocks apart (c10's ``BlockPool`` pair)."""

    __slots__ = ("name", "segments", "_free", "_by_address", "allocated_bytes", "__weakref__")

    def __init__(self, name: str) -> None:
        self.name = name
        self.segments: list[Segment] = []
        # Free blocks, small and large apart, ordered by (stream, size, address): best fit is one bisect.
        self._free: dict[bool, list[tuple[int, int, int]]] = {True: [], False: []}
        self._by_address: dict[int, Block] = {}  # every block of the pool (free or handed out) by address
        self.allocated_bytes = 0  # sum of the sizes of the blocks handed out

    @property
    def reserved_bytes(self) -> int:
        return sum(segment.nbytes for segment in self.segments)

    # -- handing out
    def take(self, nbytes: int, stream_id: int, grow: Callable[[int, bool], Segment]) -> Block:
        """A block of at least ``nbytes`` (rounded), best fit among the free blocks of the
        stream, else from a new segment ``grow(segment bytes, small)`` (which may raise OOM)."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        block = self._best_fit(size, small, stream_id)
        if block is None:
            segment = grow(segment_size(size), small)
            self.segments.append(segment)
            block = Block(segment, segment.address, segment.nbytes, stream_id)
            self._by_address[block.address] = block
        if self._should_split(block, size, small):
            rest = Block(block.segment, block.address + size, block.size - size, stream_id)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = size
            self._by_address[rest.address] = rest
            self._insert_free(rest)
        block.allocated = True
        block.requested = nbytes
        block.stream_id = stream_id
        self.allocated_bytes += block.size
        return block

    @staticmethod
    def _should_split(block: Block, size: int, small: bool) -> bool:
        remaining = block.size - size
        return remaining >= MIN_BLOCK_BYTES if small else remaining > SMALL_SIZE

    def _best_fit(self, size: int, small: bool, stream_id: int) -> Optional[Block]:
        free = self._free[small]
        index = bisect_left(free, (stream_id, size, -1))
        if index == len(free) or free[index][0] != stream_id:
            return None
        _, _, address = free.pop(index)
        return self._by_address[address]

    def _insert_free(self, block: Block) -> None:
        insort(self._free[block.segment.small], (block.stream_id, block.size, block.address))

    def _remove_free(self, block: Block) -> None:
        free = self._free[block.segment.small]
        key = (block.stream_id, block.size, block.address)
        index = bisect_left(free, key)
        if index < len(free) and free[index] == key:
            del free[index]

    # -- giving back
    def give_back(self, block: Block) -> None:
        """``block`` is free again: merge it with free neighbours and keep it for the next request."""
        if not block.allocated:
            return
        block.allocated = False
        block.holder = None
        self.allocated_bytes -= block.size
        del self._by_address[block.address]
        previous = block.prev
        if previous is not None and not previous.allocated:
            self._remove_free(previous)
            del self._by_address[previous.address]
            block.address = previous.address
            block.size += previous.size
            block.prev = previous.prev
            if block.prev is not None:
                block.prev.next = block
        following = block.next
        if following is not None and not following.allocated:
            self._remove_free(following)
            del self._by_address[following.address]
            block.size += following.size
            block.next = following.next
            if block.next is not None:
                block.next.prev = block
        self._by_address[block.address] = block
        self._insert_free(block)

    def release_cached(self) -> int:
        """Give back every segment none of whose memory is handed out (``empty_cache``); returns the bytes."""
        kept: list[Segment] = []
        released = 0
        for segment in self.segments:
            whole = self._by_address.get(segment.address)
            if whole is not None and not whole.allocated and whole.size == segment.nbytes:
                self._remove_free(whole)
                del self._by_address[whole.address]
                released += segment.nbytes
            else:
                kept.append(segment)
        self.segments = kept
        return released

    # -- lookup
    def block_at(self, address: int) -> Optional[Block]:
        """The block starting at ``address`` (free or handed out), or None."""
        return self._by_address.get(address)

    def blocks(self) -> Iterator[Block]:
        return iter(list(self._by_address.values()))

    def __repr__(self) -> str:
        return f"<BlockPool {self.name}: {self.allocated_bytes} of {self.reserved_bytes} bytes handed out>"


class MemoryOwner:
    """What `DeviceMemory` needs from its device (kept small so the allocator can be tested alone)."""

    def memory_limit(self) -> int:  # pragma: no cover - protocol
        raise NotImplementedError

    def graph_pool_bytes(self) -> int:  # pragma: no cover - protocol
        raise NotImplementedError

    def capture_allocate(self, nbytes: int, stream: Optional["SimStream"]) -> Optional[int]:  # pragma: no cover
        """An address from the capture under way when ``stream`` is capturing, else None."""
        raise NotImplementedError

    def capture_free(self, address: int) -> bool:  # pragma: no cover
        """Free ``address`` when it is a graph-pool block; False when it is not one."""
        raise NotImplementedError

    def stream_id(self, stream: Optional["SimStream"]) -> int:  # pragma: no cover
        raise NotImplementedError

    def consult_malloc_fault(self, nbytes: int) -> None:  # pragma: no cover
        raise NotImplementedError

    def check_alive(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def has_memory(self) -> bool:  # pragma: no cover
        """False on a meta-tensor device (planning: no memory behind tensors)."""
        raise NotImplementedError


class DeviceMemory:
    """``device.memory``: the device's caching allocator, by address.

    ``allocate(nbytes, stream=None)`` returns the address of at least ``nbytes`` writable bytes
    that stay the simulator's until ``free(address)``: a block of the capture's graph pool while
    ``stream`` (default: the current stream) is capturing, else of the device's own pool.
    ``allocated_bytes()`` is what is handed out (the device pool's blocks plus the graph pools'
    bytes), ``reserved_bytes()`` what is held (the device pool's segments plus the graph pools'
    bytes), ``empty_cache()`` gives back the device pool's free segments (graph pools stay, as on
    the device)."""

    def __init__(self, owner: MemoryOwner) -> None:
        self._owner = owner
        self.pool = BlockPool("device")
        self._blocks: dict[int, Block] = {}  # handed-out blocks of the device pool, by address

    # -- the raw interface
    def allocate(self, nbytes: int, *, stream: Optional["SimStream"] = None) -> int:
        owner = self._owner
        owner.check_alive()
        if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
            raise ConfigError(f"device.memory.allocate needs a byte count >= 0, got {nbytes!r}", key="nbytes")
        if not owner.has_memory():
            raise ConfigError(
                "device.memory.allocate on a meta_tensors device: planning devices hold no memory; "
                "create the device without meta_tensors=True to allocate",
                key="meta_tensors",
            )
        if nbytes == 0:
            return 0
        captured = owner.capture_allocate(nbytes, stream)
        if captured is not None:
            return captured
        owner.consult_malloc_fault(nbytes)
        block = self.pool.take(nbytes, owner.stream_id(stream), lambda size, small: self._grow(nbytes, size, small))
        self._blocks[block.address] = block
        return block.address

    def free(self, address: int) -> None:
        if address == 0:
            return
        block = self._blocks.pop(address, None)
        if block is not None:
            self.pool.give_back(block)
            return
        if self._owner.capture_free(address):
            return
        raise ConfigError(
            f"device.memory.free({address:#x}): no block of this device starts at that address "
            "(freed twice, or not from device.memory.allocate)",
            key="address",
        )

    def allocated_bytes(self) -> int:
        return self.pool.allocated_bytes + self._owner.graph_pool_bytes()

    def reserved_bytes(self) -> int:
        return self.pool.reserved_bytes + self._owner.graph_pool_bytes()

    def empty_cache(self) -> None:
        self._owner.check_alive()
        self.pool.release_cached()

    def block_at(self, address: int) -> Optional[Block]:
        """The handed-out block of the device pool starting at ``address``, or None."""
        return self._blocks.get(address)

    # -- growing
    def in_use(self) -> int:
        """Device memory held right now: the device pool's segments and the graph pools."""
        return self.pool.reserved_bytes + self._owner.graph_pool_bytes()

    def _grow(self, nbytes: int, size: int, small: bool) -> Segment:
        limit = self._owner.memory_limit()
        if self.in_use() + size > limit:
            self.pool.release_cached()  # as the allocator does before giving up: free cached segments, retry
        if self.in_use() + size > limit:
            raise out_of_memory(
                nbytes,
                f"the device holds {self.in_use()} bytes of its {limit}; a new {size}-byte segment does not fit",
            )
        return Segment(size, small)


class DeviceMemoryOwner(MemoryOwner):
    """`MemoryOwner` of a `sim.device.SimDevice`: its memory limit, its graph pools and capture."""

    __slots__ = ("_device",)

    def __init__(self, device: Any) -> None:
        self._device = device

    def memory_limit(self) -> int:
        return int(self._device.profile.memory_bytes)

    def graph_pool_bytes(self) -> int:
        # the graphs' pools, plus blocks of private pools whose graphs all went (sim.pools)
        return self._device.captures.pool_bytes_now() + self._device.pools.held_without_graphs()

    def capture_allocate(self, nbytes: int, stream: Optional["SimStream"]) -> Optional[int]:
        device = self._device
        capture = device.captures.active
        if capture is None or (stream or device.current_stream()) is not capture.stream:
            return None
        return capture.allocate_raw(nbytes)

    def capture_free(self, address: int) -> bool:
        capture = self._device.captures.active
        return self._device.pools.release_raw(address, also=capture.pool if capture is not None else None)

    def stream_id(self, stream: Optional["SimStream"]) -> int:
        return (stream or self._device.current_stream()).stream_id

    def consult_malloc_fault(self, nbytes: int) -> None:
        self._device.fault("malloc", size_bytes=nbytes)

    def check_alive(self) -> None:
        self._device.check_alive()

    def has_memory(self) -> bool:
        return not self._device.meta_tensors
