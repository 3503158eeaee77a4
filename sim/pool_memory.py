"""Host memory of a simulated graph pool: blocks that later captures reuse, and the checks that keep reuse honest.

Why. torch_npu's caching allocator gives every graph a private pool, or one pool shared by
the graphs captured with ``pool=`` (``torch.npu.graph_pool_handle()``; torch's CUDA twin is
``torch/cuda/graphs.py`` ``graph_pool_handle`` over c10's ``CUDACachingAllocator`` private
pools). A block allocated inside a capture belongs to that pool: when its last tensor is
freed it goes back to the pool's free list, not to the device, and a *later* capture into
the same pool may be handed it. vLLM captures its sizes largest-first into one pool and
turns every graph output into a weak reference right after capture
(``vllm/compilation/cuda_graph.py``, ``CUDAGraphWrapper.__call__``: ``weak_ref_tensors``)
so the next, smaller capture reuses the blocks: the pool costs about its largest graph,
not the sum of all of them.

What. A `PoolArena` holds real host memory in segments (owning uint8 tensors) and carves
blocks out of them, first fit, in 512-byte units. A block handed to a capture is seen
through two aliases over the same bytes, each with its own torch storage (``frombuffer``
over a ctypes view that keeps the segment alive, so no alias can outlive its memory):

* the *user* alias goes to the code being captured. When its storage dies (every tensor on
  it is gone) the block is free for the next capture into the pool (`PoolArena.sweep`,
  run when a capture begins; blocks are never reused inside the capture that freed them);
* the *program* alias is what the graph's recorded program reads and writes at replay
  (`sim.capture.Capture.bind_program`), so a graph never keeps its blocks "allocated":
  replaying it writes into memory another capture may have been handed since, as on a card.

The checks. A `PoolWeakTensor` is a weak reference into pool memory (the simulator's
``device.weak_ref`` and the facade's ``torch_npu._C._weak_ref_tensor`` of a capture
allocation). Every op on it resolves it first:

* the graph that allocated the block was reset -> `DeadWeakReference` (the pool may have
  given the memory back; a card reads whatever is there);
* another graph that was handed an overlapping block wrote it (a replay, or its capture,
  which poisons fresh blocks) after the owning graph last did -> `PoolBlockReused`: the data
  read is the other graph's, a card reads it silently.

A scratch argument (`SCRATCH_ARGUMENTS`: a kernel's ``workspace``) is exempt from the second
check: the kernel writes it before it reads it, so whose data was there does not matter.
vLLM Ascend shares one attention workspace per capture size among every graph of that size
(``attention_v1.py`` ``full_graph_fia``: ``graph_params.workspaces.get(num_tokens)``), so
another graph's replay writing it is expected. A reset owner is still refused.

Otherwise the op runs on the pool memory itself. Writes count too: a write through a stale
reference overwrites the other graph's data (torch_npu's task update re-issuing an ``out=``
kernel into a weak reference does it every replay, legitimately, because the owning graph's
replay comes first and makes it fresh again).
"""

from __future__ import annotations

import contextlib
import ctypes
import weakref
from bisect import bisect_right
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map

_dispatch_stack_len = torch._C._len_torch_dispatch_stack

__all__ = [
    "BLOCK_BYTES",
    "SEGMENT_BYTES",
    "DeadWeakReference",
    "PoolBlockReused",
    "GraphMemory",
    "PoolAllocation",
    "PoolArena",
    "PoolWeakTensor",
]

BLOCK_BYTES = 512  # the caching allocator's rounding of a block
SEGMENT_BYTES = 4 << 20  # the least a new segment reserves (larger blocks get a segment of their own size)


class DeadWeakReference(RuntimeError):
    """A read or write through a weak reference whose memory was freed."""


class PoolBlockReused(DeadWeakReference):
    """A read or write through a weak reference into a pool block another graph has written since."""


DEAD_POOL_REFERENCE = (
    "simulator: {op} reads a weak reference ({what}) into graph-pool memory of {graph}, which was reset: its pool "
    "blocks went back to the allocator; a card raises nothing and reads whatever was put at that address since (a "
    "use-after-free). Read graph outputs before resetting the graph, or copy them out"
)
# Kernel arguments the kernel writes before it reads them (module docstring): whose data a
# weak reference passed there points at does not matter.
SCRATCH_ARGUMENTS = frozenset({"workspace"})

POOL_BLOCK_REUSED = (
    "simulator: {op} reads a weak reference ({what}) to a block that {graph} allocated in its capture, but {other} "
    "was handed an overlapping block of the same pool (the block had been freed) and wrote it (a replay, or its "
    "capture) after {graph} last did: a card reads {other}'s data there, silently (a use-after-free through the shared graph pool). Read "
    "{graph}'s outputs right after its replay, before another graph of the pool replays, or copy them out"
)


def _alias(segment: "PoolSegment", start: int, nbytes: int) -> torch.UntypedStorage:
    """A storage over ``nbytes`` of ``segment`` at ``start`` that keeps the segment alive."""
    view = (ctypes.c_uint8 * nbytes).from_address(segment.address + start)
    view.segment = segment.memory  # type: ignore[attr-defined]  # the memory outlives every alias
    with torch._C.DisableTorchFunction(), _quiet():
        return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()


def _quiet() -> Any:
    """Keep the simulator's own bookkeeping out of a capture or tracker under way."""
    return _disable_current_modes() if _dispatch_stack_len() else contextlib.nullcontext()


def tensor_on(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    """A tensor over ``storage`` with ``like``'s dtype, offset, shape and strides."""
    with torch._C.DisableTorchFunction(), _quiet():
        return torch.empty(0, dtype=like.dtype).set_(storage, like.storage_offset(), like.size(), like.stride())


class PoolSegment:
    """One reservation of host memory; ``free`` is its sorted list of free [start, end) ranges."""

    __slots__ = ("memory", "address", "nbytes", "free", "writers", "last_stamp", "__weakref__")

    def __init__(self, nbytes: int) -> None:
        self.memory = torch.empty(nbytes, dtype=torch.uint8)
        self.address = self.memory.data_ptr()
        self.nbytes = nbytes
        self.free: list[list[int]] = [[0, nbytes]]
        self.writers: dict["GraphMemory", None] = {}  # graphs holding blocks here (insertion-ordered set)
        self.last_stamp = 0  # the latest write stamp of any graph in this segment

    def take(self, size: int) -> Optional[int]:
        for index, (start, end) in enumerate(self.free):
            if end - start >= size:
                if end - start == size:
                    del self.free[index]
                else:
                    self.free[index][0] = start + size
                return start
        return None

    def give_back(self, start: int, size: int) -> None:
        end = start + size
        free = self.free
        index = bisect_right(free, [start, end])
        if index > 0 and free[index - 1][1] == start:
            free[index - 1][1] = end
            if index < len(free) and free[index][0] == end:
                free[index - 1][1] = free[index][1]
                del free[index]
        elif index < len(free) and free[index][0] == end:
            free[index][0] = start
        else:
            free.insert(index, [start, end])

    @property
    def free_bytes(self) -> int:
        return sum(end - start for start, end in self.free)


class GraphMemory:
    """The blocks one capture was handed, and when its graph last wrote them (a device stamp)."""

    __slots__ = ("name", "stamp", "alive", "ranges", "__weakref__")

    def __init__(self, name: str) -> None:
        self.name = name
        self.stamp = 0
        self.alive = True
        self.ranges: dict[PoolSegment, list[tuple[int, int]]] = {}  # per segment, in allocation order

    def wrote(self, stamp: int) -> None:
        """The graph wrote its blocks (a replay launched at ``stamp``)."""
        self.stamp = stamp
        for segment in self.ranges:
            if segment.last_stamp < stamp:
                segment.last_stamp = stamp

    def overlaps(self, segment: PoolSegment, start: int, end: int) -> bool:
        return any(s < end and start < e for s, e in self.ranges.get(segment, ()))

    def release(self) -> None:
        """The graph was reset: its blocks are no longer written by it, references to them are dead."""
        self.alive = False
        for segment in self.ranges:
            segment.writers.pop(self, None)
        self.ranges = {}


class PoolAllocation:
    """One block handed to a capture."""

    __slots__ = ("segment", "start", "nbytes", "size", "owner", "user_storage", "program_storage", "stamp", "_keep")

    def __init__(self, segment: PoolSegment, start: int, nbytes: int, size: int, owner: GraphMemory,
                 stamp: int) -> None:
        self.segment = segment
        self.start = start
        self.nbytes = nbytes  # what the tensor needs
        self.size = size  # what the block takes (rounded)
        self.owner = owner
        self.stamp = stamp  # when it was handed out (the capture poisons it: a write)
        self.program_storage = _alias(segment, start, nbytes)
        user = _alias(segment, start, nbytes)
        self.user_storage: Callable[[], Optional[torch.UntypedStorage]] = weakref.ref(user)
        self._keep: Optional[torch.UntypedStorage] = user  # dropped by `PoolArena.allocate` once a tensor holds it

    def last_write(self) -> int:
        return max(self.stamp, self.owner.stamp)

    def stale_by(self) -> Optional[tuple[GraphMemory, int]]:
        """The graph (and its stamp) that wrote an overlapping block after this one's owner, or None."""
        segment = self.segment
        mine = self.last_write()
        if segment.last_stamp <= mine:
            return None
        end = self.start + self.nbytes
        for other in segment.writers:
            if other is not self.owner and other.stamp > mine and other.overlaps(segment, self.start, end):
                return other, other.stamp
        return None


class PoolArena:
    """The host memory of one graph pool."""

    __slots__ = ("segments", "live", "by_address", "__weakref__")

    def __init__(self) -> None:
        self.segments: list[PoolSegment] = []
        self.live: list[PoolAllocation] = []  # handed out; free again once the user storage dies
        self.by_address: dict[int, PoolAllocation] = {}  # live blocks by address, for weak references

    @property
    def reserved_bytes(self) -> int:
        return sum(segment.nbytes for segment in self.segments)

    def sweep(self) -> int:
        """Return every block whose user tensors are all gone to its segment's free list."""
        kept: list[PoolAllocation] = []
        freed = 0
        for allocation in self.live:
            if allocation.user_storage() is None:
                allocation.segment.give_back(allocation.start, allocation.size)
                address = allocation.segment.address + allocation.start
                if self.by_address.get(address) is allocation:
                    del self.by_address[address]
                freed += allocation.size
            else:
                kept.append(allocation)
        self.live = kept
        return freed

    def allocate(self, like: torch.Tensor, owner: GraphMemory, stamp: int) -> torch.Tensor:
        """A tensor shaped like ``like`` (a meta tensor) on a block of this pool, handed to ``owner``."""
        nbytes = like.untyped_storage().nbytes()
        size = -(-nbytes // BLOCK_BYTES) * BLOCK_BYTES
        for segment in self.segments:
            start = segment.take(size)
            if start is not None:
                break
        else:
            segment = PoolSegment(max(size, SEGMENT_BYTES))
            self.segments.append(segment)
            start = segment.take(size)
            assert start is not None
        allocation = PoolAllocation(segment, start, nbytes, size, owner, stamp)
        owner.ranges.setdefault(segment, []).append((start, start + nbytes))
        segment.writers[owner] = None
        if segment.last_stamp < stamp:
            segment.last_stamp = stamp
        owner.stamp = max(owner.stamp, stamp)
        self.live.append(allocation)
        self.by_address[segment.address + start] = allocation
        user = allocation._keep
        allocation._keep = None
        assert user is not None
        return tensor_on(user, like)

    def allocation_of(self, tensor: torch.Tensor) -> Optional[PoolAllocation]:
        """The live block ``tensor``'s storage is (its user alias), or None."""
        storage = tensor.untyped_storage()
        allocation = self.by_address.get(storage.data_ptr())
        if allocation is None or allocation.user_storage() is not storage:
            return None
        return allocation

    def program_tensor(self, tensor: torch.Tensor) -> Optional[torch.Tensor]:
        """The program's alias of ``tensor`` when it lies on a block of this pool, else None."""
        allocation = self.allocation_of(tensor)
        if allocation is None:
            return None
        return tensor_on(allocation.program_storage, tensor)


class PoolWeakTensor(torch.Tensor):
    """A weak reference into graph-pool memory (module docstring): ops run on the pool memory
    while the block's data is its graph's, and raise otherwise."""

    _allocation: PoolAllocation
    _alias: torch.Tensor
    _what: str

    @staticmethod
    def __new__(cls, tensor: torch.Tensor, allocation: PoolAllocation) -> "PoolWeakTensor":
        return torch.Tensor._make_wrapper_subclass(
            cls, tensor.shape, strides=tensor.stride(), storage_offset=tensor.storage_offset(),
            dtype=tensor.dtype, device=tensor.device, requires_grad=False,
        )

    def __init__(self, tensor: torch.Tensor, allocation: PoolAllocation) -> None:
        self._allocation = allocation
        self._alias = tensor_on(allocation.program_storage, tensor)
        self._what = f"shape {tuple(tensor.shape)}, {str(tensor.dtype).replace('torch.', '')}"

    @property
    def alive(self) -> bool:
        """Whether an op on it would succeed now."""
        allocation = self._allocation
        return allocation.owner.alive and allocation.stale_by() is None

    @property
    def graph_alive(self) -> bool:
        """Whether the graph that allocated the block still holds it (it was not reset)."""
        return self._allocation.owner.alive

    def resolve(self, op: str = "a read", *, scratch: bool = False) -> torch.Tensor:
        """The pool memory, for one op; raises when it is not the owning graph's any more
        (for ``scratch``, only when the owning graph was reset)."""
        allocation = self._allocation
        owner = allocation.owner
        if not owner.alive:
            raise DeadWeakReference(DEAD_POOL_REFERENCE.format(op=op, what=self._what, graph=owner.name))
        stale = None if scratch else allocation.stale_by()
        if stale is not None:
            raise PoolBlockReused(POOL_BLOCK_REUSED.format(op=op, what=self._what, graph=owner.name,
                                                           other=stale[0].name))
        return self._alias

    def data_ptr(self) -> int:
        return self._alias.data_ptr()

    def untyped_storage(self) -> torch.UntypedStorage:
        return self._alias.untyped_storage()

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]  # torch's Tensor.__repr__ takes tensor_contents keyword-only too, unannotated
        state = "readable" if self.alive else "not readable"
        return f"PoolWeakTensor({self._what} of {self._allocation.owner.name}, {state})"

    @classmethod
    def __torch_dispatch__(  # type: ignore[override]  # torch declares it with a narrower signature than the dispatcher calls
            cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        op = str(func)

        def unwrap(value: Any) -> Any:
            return value.resolve(op) if isinstance(value, PoolWeakTensor) else value

        def unwrap_scratch(value: Any) -> Any:
            return value.resolve(op, scratch=True) if isinstance(value, PoolWeakTensor) else value

        names = [argument.name for argument in func._schema.arguments]
        args = tuple(tree_map(unwrap_scratch if position < len(names) and names[position] in SCRATCH_ARGUMENTS
                              else unwrap, value) for position, value in enumerate(args))
        kwargs = {name: tree_map(unwrap_scratch if name in SCRATCH_ARGUMENTS else unwrap, value)
                  for name, value in (kwargs or {}).items()}
        return func(*args, **kwargs)
