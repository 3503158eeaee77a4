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
from typing import Any, Callable, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map

from sim.memory import MIN_BLOCK_BYTES, Block, BlockPool, Segment

_dispatch_stack_len = torch._C._len_torch_dispatch_stack

__all__ = [
    "DeadWeakReference",
    "PoolBlockReused",
    "GraphMemory",
    "PoolAllocation",
    "PoolArena",
    "PoolWeakTensor",
]



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


def _alias(segment: Segment, start: int, nbytes: int) -> torch.UntypedStorage:
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


class GraphMemory:
    """The blocks one capture was handed, and when its graph last wrote them (a device stamp)."""

    __slots__ = ("name", "stamp", "alive", "ranges", "arena", "__weakref__")

    def __init__(self, name: str) -> None:
        self.name = name
        self.stamp = 0
        self.alive = True
        self.ranges: dict[Segment, list[tuple[int, int]]] = {}  # per segment, in allocation order
        self.arena: Optional["PoolArena"] = None

    def wrote(self, stamp: int) -> None:
        """The graph wrote its blocks (a replay launched at ``stamp``)."""
        self.stamp = stamp
        arena = self.arena
        if arena is None:
            return
        last = arena.last_stamp
        for segment in self.ranges:
            if last.get(segment, 0) < stamp:
                last[segment] = stamp

    def overlaps(self, segment: Segment, start: int, end: int) -> bool:
        return any(s < end and start < e for s, e in self.ranges.get(segment, ()))

    def release(self) -> None:
        """The graph was reset: its blocks are no longer written by it, references to them are dead."""
        self.alive = False
        if self.arena is not None:
            for segment in self.ranges:
                writers = self.arena.writers.get(segment)
                if writers is not None:
                    writers.pop(self, None)
        self.ranges = {}


class PoolAllocation:
    """One block handed to a capture: a tensor's (seen through a user and a program alias) or a
    raw one (`sim.memory.DeviceMemory.allocate` while a stream captures: freed by address)."""

    __slots__ = ("arena", "block", "segment", "start", "nbytes", "size", "owner", "user_storage",
                 "program_storage", "stamp", "_keep", "__weakref__")

    def __init__(self, arena: "PoolArena", block: Block, nbytes: int, owner: GraphMemory, stamp: int,
                 *, raw: bool = False) -> None:
        self.arena = arena
        self.block = block
        self.segment = block.segment
        self.start = block.offset
        self.nbytes = nbytes  # what the tensor needs
        self.size = block.size  # what the block takes (rounded)
        self.owner = owner
        self.stamp = stamp  # when it was handed out (the capture poisons it: a write)
        self.program_storage = _alias(self.segment, self.start, max(nbytes, 1))
        self.user_storage: Optional[Callable[[], Optional[torch.UntypedStorage]]] = None
        self._keep: Optional[torch.UntypedStorage] = None
        if not raw:
            user = _alias(self.segment, self.start, nbytes)
            self.user_storage = weakref.ref(user)
            self._keep = user  # dropped by `PoolArena.allocate` once a tensor holds it

    @property
    def address(self) -> int:
        return self.segment.address + self.start

    @property
    def raw(self) -> bool:
        return self.user_storage is None

    def last_write(self) -> int:
        return max(self.stamp, self.owner.stamp)

    def stale_by(self) -> Optional[tuple[GraphMemory, int]]:
        """The graph (and its stamp) that wrote an overlapping block after this one's owner, or None."""
        segment = self.segment
        mine = self.last_write()
        if self.arena.last_stamp.get(segment, 0) <= mine:
            return None
        end = self.start + self.nbytes
        for other in self.arena.writers.get(segment, ()):
            if other is not self.owner and other.stamp > mine and other.overlaps(segment, self.start, end):
                return other, other.stamp
        return None


class PoolArena:
    """The host memory of one graph pool: a `sim.memory.BlockPool` whose blocks are handed to
    captures, plus who wrote which segment when (for the weak-reference checks)."""

    __slots__ = ("blocks", "live", "writers", "last_stamp", "__weakref__")

    def __init__(self, name: str = "graph pool") -> None:
        self.blocks = BlockPool(name)
        self.live: dict[int, PoolAllocation] = {}  # handed out, by address
        self.writers: dict[Segment, dict[GraphMemory, None]] = {}  # graphs holding blocks per segment (ordered set)
        self.last_stamp: dict[Segment, int] = {}  # the latest write stamp of any graph per segment

    @property
    def segments(self) -> list[Segment]:
        return self.blocks.segments

    @property
    def reserved_bytes(self) -> int:
        return self.blocks.reserved_bytes

    def sweep(self) -> int:
        """Return every block whose user tensors are all gone to the pool's free blocks."""
        freed = 0
        for allocation in list(self.live.values()):
            if allocation.user_storage is not None and allocation.user_storage() is None:
                freed += self.release(allocation)
        return freed

    def release(self, allocation: PoolAllocation) -> int:
        """Give ``allocation``'s block back to the pool (it may be handed out again); returns its size."""
        if self.live.get(allocation.address) is not allocation:
            return 0
        del self.live[allocation.address]
        self.blocks.give_back(allocation.block)
        return allocation.size

    def release_raw(self, address: int) -> bool:
        """Free a raw block (``device.memory.free``); False when none of this pool starts at ``address``."""
        allocation = self.live.get(address)
        if allocation is None or not allocation.raw:
            return False
        self.release(allocation)
        return True

    def take(self, nbytes: int, owner: GraphMemory, stamp: int, stream_id: int, *, raw: bool = False) -> PoolAllocation:
        """A block of at least ``nbytes`` handed to ``owner`` (a new segment when none fits)."""
        block = self.blocks.take(nbytes, stream_id, lambda size, small: Segment(size, small))
        allocation = PoolAllocation(self, block, nbytes, owner, stamp, raw=raw)
        block.holder = allocation
        segment = block.segment
        owner.arena = self
        owner.ranges.setdefault(segment, []).append((allocation.start, allocation.start + nbytes))
        self.writers.setdefault(segment, {})[owner] = None
        if self.last_stamp.get(segment, 0) < stamp:
            self.last_stamp[segment] = stamp
        owner.stamp = max(owner.stamp, stamp)
        self.live[allocation.address] = allocation
        return allocation

    def allocate(self, like: torch.Tensor, owner: GraphMemory, stamp: int, stream_id: int = 0) -> torch.Tensor:
        """A tensor shaped like ``like`` (a meta tensor) on a block of this pool, handed to ``owner``."""
        allocation = self.take(like.untyped_storage().nbytes(), owner, stamp, stream_id)
        user = allocation._keep
        allocation._keep = None
        assert user is not None
        return tensor_on(user, like)

    def allocation_of(self, tensor: torch.Tensor) -> Optional[PoolAllocation]:
        """The live block ``tensor``'s storage is (its user alias, or a raw block's memory), or None."""
        storage = tensor.untyped_storage()
        allocation = self.live.get(storage.data_ptr())
        if allocation is None:
            return None
        if allocation.user_storage is None:  # raw: the device type's own tensor over the address
            return allocation
        return allocation if allocation.user_storage() is storage else None

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
