"""Tensors on graph-pool memory: the blocks captures are handed, reused as the NPU caching
allocator reuses them, and the checks that keep reuse honest.

Why. torch_npu's caching allocator gives every graph a private pool, or one pool shared by the
graphs captured with ``pool=`` (``torch.npu.graph_pool_handle()``; torch's CUDA twin is
``torch/cuda/graphs.py`` ``graph_pool_handle`` over c10's ``CUDACachingAllocator`` private
pools). A block allocated inside a capture belongs to that pool: when its last tensor is freed
it goes back to the pool's free blocks at once, and the next allocation of the *same* capture,
or of a later capture into the pool, may be handed it (`sim.memory` is the allocator). Inside a
capture this is how one layer's activations take the memory the previous layer freed; across
captures it is why vLLM captures its sizes largest-first into one pool and weak-references every
graph output (``vllm/compilation/cuda_graph.py``, ``CUDAGraphWrapper.__call__``:
``weak_ref_tensors``): the pool costs about its largest graph.

Theory of operation. A `PoolArena` is one pool's `sim.memory.BlockPool` plus what its blocks are used for. A
block handed to a capture is seen through two aliases over the same bytes, each with its own
torch storage (``frombuffer`` over a ctypes view that keeps the segment alive):

* the *user* alias goes to the code being captured. When its storage dies (every tensor on it
  is gone) the block goes back to the pool (a weak-reference callback; the next allocation
  takes the freed blocks in);
* the *program* alias is what the recorded program reads and writes at replay: a capture
  records every op on program aliases (`sim.capture.Capture`), so the recording never keeps a
  block allocated and replaying writes memory a later allocation may have been handed since,
  exactly as the card's recorded addresses do.

The rule: a read is valid when no one else wrote the bytes in between. Reuse means two
*identities* (allocations) may own the same bytes at different times; an identity's data is
readable until another identity writes there. What breaks that rule:

* a weak reference (`PoolWeakTensor`: the simulator's ``device.weak_ref``, the facade's
  ``torch_npu._C._weak_ref_tensor``) read after its block was handed to another allocation
  that wrote it (its poisoned fresh block counts as a write);
* a write through a weak reference (a kernel's ``out=`` or its workspace) into a block another,
  live, allocation was handed since: the weak reference's kernel is fine, the *other*
  allocation's next read gets garbage;
* a weak reference into a graph that was reset (`DeadWeakReference`: its blocks went back).

Which arguments an op reads and which it writes comes from its schema (``Tensor(a!)`` is
written), refined by `WRITE_FIRST_ARGUMENTS`: arguments a kernel writes whole before reading
them (``out``; a kernel's ``workspace``, which torch_npu declares as a plain input although the
kernel uses it as scratch). Such an argument never reads someone else's data, and its write
counts against whoever else was handed the bytes: there is no exemption.

Where it is checked:

* inside a capture, op by op in recording order (`sim.pool_checks`): a weak reference read
  after this capture handed its block to another allocation, and any read of an allocation a
  write through a weak reference overwrote since its own last write, fail the capture with
  `PoolBlockReused`. A task update's re-issued arguments are checked at their op's place;
* when a capture ends, each of its allocations is noted as intact or not at the end of the
  program (what a weak reference to a graph output reads after a replay);
* at run time (`PoolWeakTensor.resolve`), across graphs: another graph of the pool that wrote
  an overlapping block (a replay, its capture's poison, an eager write through a weak
  reference) after the owner last did -> `PoolBlockReused`. Inside its own graph's replay a
  weak reference is not checked again (its place in the program was checked statically).

vLLM Ascend shares one attention workspace per capture size among the graphs of that size
(``attention_v1.py``@182b75ea ``full_graph_fia``: ``graph_params.workspaces.get(num_tokens)``,
weak-referenced after each capture by ``compilation/acl_graph.py`` ``weak_ref_workspaces``).
Passing it stays legitimate as long as no graph's live data sits in its bytes while a kernel
writes it; when a later capture is handed the workspace's block for a tensor that lives across
an attention call, that tensor's next read is refused, as it would be garbage on a card.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import weakref
from bisect import bisect_right
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_map

from ascendgraph.errors import AscendGraphError
from sim.memory import Block, BlockPool, Segment

_dispatch_stack_len = torch._C._len_torch_dispatch_stack

__all__ = [
    "WRITE_FIRST_ARGUMENTS",
    "READ",
    "WRITE",
    "UPDATE",
    "argument_roles",
    "DeadWeakReference",
    "PoolBlockReused",
    "GraphMemory",
    "PoolAllocation",
    "PoolArena",
    "PoolWeakTensor",
    "replaying_graph",
    "enter_graph",
    "leave_graph",
]

READ, WRITE, UPDATE = "read", "write", "update"  # how an op uses an argument: reads, writes whole first, reads then writes

# Arguments a kernel writes whole before it reads them (name -> why), beside what the schema says.
WRITE_FIRST_ARGUMENTS: dict[str, str] = {
    "out": "an out= argument: the kernel writes its result there (torch's out= convention)",
    "workspace": "a kernel's scratch buffer: torch-npu 2.13.0 declares it a plain 'Tensor? workspace' "
    "(csrc/aten/npu_native_functions_by_codegen.yaml, the FIA and paged-attention .out overloads), but the kernel "
    "writes it before reading it (its size comes from the workspace query of the same call)",
    "softmax_lse": "the fused attention's second output (FIA .out's out=[attention_out, softmax_lse]; "
    "ascendgraph::paged_attention takes it as an argument)",
}

_ROLES: dict[Any, tuple[tuple[str, ...], dict[str, str]]] = {}  # func -> (roles by position, roles by name)


def argument_roles(func: Any) -> tuple[tuple[str, ...], dict[str, str]]:
    """How ``func`` uses each argument: `READ`, `WRITE` (whole, before reading) or `UPDATE`."""
    known = _ROLES.get(func)
    if known is None:
        roles = []
        for argument in func._schema.arguments:
            written = argument.alias_info is not None and argument.alias_info.is_write
            if argument.name in WRITE_FIRST_ARGUMENTS and (written or argument.name != "out"):
                roles.append(WRITE)
            else:
                roles.append(UPDATE if written else READ)
        names = {argument.name: role for argument, role in zip(func._schema.arguments, roles)}
        known = _ROLES[func] = (tuple(roles), names)
    return known


class DeadWeakReference(AscendGraphError, RuntimeError):
    """A read or write through a weak reference whose memory was freed (a simulator detection:
    a card reads or writes the freed memory silently)."""


class PoolBlockReused(DeadWeakReference):
    """A read of graph-pool bytes that another allocation wrote since their owner last did."""


DEAD_POOL_REFERENCE = (
    "simulator: {op} reads a weak reference ({what}) into graph-pool memory of {graph}, which was reset: its pool "
    "blocks went back to the allocator; a card raises nothing and reads whatever was put at that address since (a "
    "use-after-free). Read graph outputs before resetting the graph, or copy them out"
)
POOL_BLOCK_REUSED = (
    "simulator: {op} reads a weak reference ({what}) to a block that {graph} allocated in its capture, but {other} "
    "was handed an overlapping block of the same pool (the block had been freed) and wrote it (a replay, or its "
    "capture) after {graph} last did: a card reads {other}'s data there, silently (a use-after-free through the shared graph pool). Read "
    "{graph}'s outputs right after its replay, before another graph of the pool replays, or copy them out"
)
REUSED_AT_GRAPH_END = (
    "simulator: {op} reads a weak reference ({what}) to a block of {graph} that {other} took over later in the same "
    "capture: after a replay the block holds {other}'s data, and a card reads it silently. Keep a strong reference "
    "to the tensor until its last use in the captured region, or copy it out"
)


def _alias(segment: Segment, start: int, nbytes: int) -> torch.UntypedStorage:
    """A storage over ``nbytes`` of ``segment`` at ``start`` that keeps the segment alive (made
    outside a capture or tracker under way: the simulator's own bookkeeping)."""
    view = (ctypes.c_uint8 * nbytes).from_address(segment.address + start)
    view.segment = segment.memory  # type: ignore[attr-defined]  # the memory outlives every alias
    with torch._C.DisableTorchFunction():
        if _dispatch_stack_len():
            with _disable_current_modes():
                return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()
        return torch.frombuffer(view, dtype=torch.uint8).untyped_storage()


def tensor_on(storage: torch.UntypedStorage, like: torch.Tensor) -> torch.Tensor:
    """A tensor over ``storage`` with ``like``'s dtype, offset, shape and strides."""
    with torch._C.DisableTorchFunction():
        if _dispatch_stack_len():
            with _disable_current_modes():
                return torch.empty(0, dtype=like.dtype).set_(storage, like.storage_offset(), like.size(), like.stride())
        return torch.empty(0, dtype=like.dtype).set_(storage, like.storage_offset(), like.size(), like.stride())


_REPLAYING: contextvars.ContextVar[Optional["GraphMemory"]] = contextvars.ContextVar("sim_replaying_graph", default=None)


@contextlib.contextmanager
def replaying_graph(memory: Optional["GraphMemory"]) -> Iterator[None]:
    """The ops of the block are ``memory``'s graph replaying (its weak references were checked
    at their place in the program)."""
    token = _REPLAYING.set(memory)
    try:
        yield
    finally:
        _REPLAYING.reset(token)


def enter_graph(memory: Optional["GraphMemory"]) -> contextvars.Token:
    """What follows runs at a place in ``memory``'s graph (a task update); `leave_graph` ends it."""
    return _REPLAYING.set(memory)


def leave_graph(token: contextvars.Token) -> None:
    _REPLAYING.reset(token)


class _Content:
    """Who owns the bytes of one segment: sorted, disjoint (start, end, allocation) runs."""

    __slots__ = ("starts", "runs")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.runs: list[tuple[int, int, "PoolAllocation"]] = []

    def take(self, start: int, end: int, owner: "PoolAllocation") -> list["PoolAllocation"]:
        """``owner`` now holds [start, end); returns the other allocations it displaced."""
        runs = self.runs
        low = max(bisect_right(self.starts, start) - 1, 0)
        high = low
        pieces: list[tuple[int, int, PoolAllocation]] = []
        displaced: list[PoolAllocation] = []
        while high < len(runs) and runs[high][0] < end:
            s, e, holder = runs[high]
            if e > start:
                if holder is not owner and holder not in displaced:
                    displaced.append(holder)
                if s < start:
                    pieces.append((s, start, holder))
                if e > end:
                    pieces.append((end, e, holder))
            else:
                pieces.append((s, e, holder))
            high += 1
        pieces.append((start, end, owner))
        pieces.sort(key=lambda piece: piece[0])
        runs[low:high] = pieces
        self.starts[low:high] = [piece[0] for piece in pieces]
        return displaced


class GraphMemory:
    """The blocks one capture was handed, when its graph last wrote them (a device stamp), and
    the capture's check of its ops (module docstring, "Where it is checked")."""

    __slots__ = ("name", "serial", "stamp", "alive", "ranges", "arena", "allocations", "clobbered",
                 "next_stamp", "__weakref__")

    _serials = iter(range(1, 1 << 62))

    def __init__(self, name: str, next_stamp: Optional[Callable[[], int]] = None) -> None:
        self.name = name
        self.serial = next(GraphMemory._serials)
        self.stamp = 0
        self.alive = True
        # Per segment, the allocations the graph writes at replay: its own, and others' it writes
        # through weak references (a shared workspace).
        self.ranges: dict[Segment, list[PoolAllocation]] = {}
        self.arena: Optional[PoolArena] = None
        self.allocations: list[PoolAllocation] = []  # handed to this capture, in order
        self.clobbered = 0  # live allocations of the capture a weak write overwrote (and not rewritten yet)
        self.next_stamp = next_stamp or _stamps_of_its_own()

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
        return any(a.start < end and start < a.start + a.nbytes for a in self.ranges.get(segment, ()))

    def release(self) -> None:
        """The graph was reset: its blocks are no longer written by it, references to them are dead."""
        self.alive = False
        if self.arena is not None:
            for segment in self.ranges:
                writers = self.arena.writers.get(segment)
                if writers is not None:
                    writers.pop(self, None)
        self.ranges = {}

    def writes(self, allocation: "PoolAllocation") -> None:
        """The graph writes ``allocation``'s bytes at replay (its own, or through a weak reference)."""
        arena = allocation.arena
        self.arena = self.arena or arena
        runs = self.ranges.setdefault(allocation.segment, [])
        if allocation not in runs:
            runs.append(allocation)
        arena.writers.setdefault(allocation.segment, {})[self] = None


def _reads_after_the_program(func: Any) -> bool:
    """Whether an op on a weak reference outside its graph reads the data the graph's program
    left there: torch's own ops do (or an unnamed read); a custom kernel is a re-issue (see resolve)."""
    name = getattr(getattr(func, "_schema", None), "name", "aten::")
    return name.startswith(("aten::", "prims::"))


def _stamps_of_its_own() -> Callable[[], int]:
    counter = iter(range(1, 1 << 62))
    return lambda: next(counter)


class PoolAllocation:
    """One block handed to a capture: a tensor's (seen through a user and a program alias) or a
    raw one (`sim.memory.DeviceMemory.allocate` while a stream captures: freed by address)."""

    __slots__ = ("arena", "block", "segment", "start", "nbytes", "size", "owner", "index", "user_storage",
                 "program_storage", "stamp", "overwritten", "clobbered", "end_note", "_keep", "_aliases",
                 "__weakref__")

    def __init__(self, arena: "PoolArena", block: Block, nbytes: int, owner: GraphMemory, stamp: int,
                 *, raw: bool = False, index: int = 0) -> None:
        self.arena = arena
        self.block = block
        self.segment = block.segment
        self.start = block.offset
        self.nbytes = nbytes  # what the tensor needs
        self.size = block.size  # what the block takes (rounded)
        self.owner = owner
        self.index = index  # the capture's op count when the block was handed out
        self.stamp = stamp  # its last write outside a replay of its graph (handed out: the capture poisons it)
        self.program_storage = _alias(self.segment, self.start, max(nbytes, 1))
        self.user_storage: Optional[Callable[[], Optional[torch.UntypedStorage]]] = None
        self._keep: Optional[torch.UntypedStorage] = None
        # capture serial -> (op index, who) for the capture that handed these bytes to someone else
        self.overwritten: dict[int, tuple[int, str]] = {}
        self.clobbered: Optional[tuple[int, str]] = None  # live, and a weak write overwrote it at (op index, who)
        self.end_note: Optional[str] = None  # who holds the bytes at the end of its graph's program (None: itself)
        self._aliases: dict[tuple, torch.Tensor] = {}
        if not raw:
            user = _alias(self.segment, self.start, nbytes)
            self.user_storage = weakref.ref(user, _FreedWhenGone(arena, self))
            self._keep = user  # dropped by `PoolArena.allocate` once a tensor holds it

    @property
    def address(self) -> int:
        return self.segment.address + self.start

    @property
    def raw(self) -> bool:
        return self.user_storage is None

    def describe(self) -> str:
        return f"the {self.nbytes}-byte block {self.owner.name} was handed at op {self.index} of its capture"

    def program_alias(self, tensor: torch.Tensor) -> torch.Tensor:
        """The program's alias of ``tensor`` (a view of this block), one per geometry."""
        key = (tensor.dtype, tensor.storage_offset(), tuple(tensor.size()), tuple(tensor.stride()))
        alias = self._aliases.get(key)
        if alias is None:
            alias = self._aliases[key] = tensor_on(self.program_storage, tensor)
        return alias

    def last_write(self) -> int:
        return max(self.stamp, self.owner.stamp)

    def stale_by(self, exclude: Optional[GraphMemory] = None) -> Optional[tuple[GraphMemory, int]]:
        """Another graph (and its stamp) that wrote an overlapping block after this one's data was
        written, or None. ``exclude``: a graph whose replay is under way (checked statically)."""
        segment = self.segment
        mine = self.last_write()
        if self.arena.last_stamp.get(segment, 0) <= mine:
            return None
        start, end = self.start, self.start + self.nbytes
        for other in self.arena.writers.get(segment, ()):
            if other is self.owner or other is exclude:
                continue
            for written in other.ranges.get(segment, ()):
                if written is self or not (written.start < end and start < written.start + written.nbytes):
                    continue
                stamp = max(other.stamp, written.stamp)
                if stamp > mine:
                    return other, stamp
        return None


class _FreedWhenGone:
    """The callback of a block's user-alias weak reference: every user tensor is gone."""

    __slots__ = ("arena", "allocation")

    def __init__(self, arena: "PoolArena", allocation: PoolAllocation) -> None:
        self.arena = arena
        self.allocation = allocation

    def __call__(self, _ref: Any) -> None:
        self.arena.freed(self.allocation)


class PoolArena:
    """The host memory of one graph pool: a `sim.memory.BlockPool` whose blocks are handed to
    captures, who wrote which segment when, and who owns which bytes (for the checks)."""

    __slots__ = ("blocks", "live", "writers", "last_stamp", "content", "pending", "__weakref__")

    def __init__(self, name: str = "graph pool") -> None:
        self.blocks = BlockPool(name)
        self.live: dict[int, PoolAllocation] = {}  # handed out, by address
        self.writers: dict[Segment, dict[GraphMemory, None]] = {}  # graphs writing each segment (ordered set)
        self.last_stamp: dict[Segment, int] = {}  # the latest write stamp of any graph per segment
        self.content: dict[Segment, _Content] = {}
        self.pending: list[PoolAllocation] = []  # user tensors all gone: free at the next allocation

    @property
    def segments(self) -> list[Segment]:
        return self.blocks.segments

    @property
    def reserved_bytes(self) -> int:
        return self.blocks.reserved_bytes

    def content_of(self, segment: Segment) -> _Content:
        content = self.content.get(segment)
        if content is None:
            content = self.content[segment] = _Content()
        return content

    def freed(self, allocation: PoolAllocation) -> None:
        """Every user tensor of ``allocation`` is gone (a storage callback: keep it short)."""
        self.pending.append(allocation)

    def sweep(self) -> int:
        """Give the blocks whose user tensors are all gone back to the pool; returns their bytes."""
        pending, self.pending = self.pending, []
        freed = 0
        for allocation in pending:
            freed += self.release(allocation)
        for allocation in list(self.live.values()):  # a callback that has not run yet
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

    def take(self, nbytes: int, owner: GraphMemory, stamp: int, stream_id: int, *, raw: bool = False,
             index: int = 0) -> PoolAllocation:
        """A block of at least ``nbytes`` handed to ``owner`` at op ``index`` of its capture (a
        new segment when none fits); whoever held those bytes before has lost them."""
        if self.pending:
            self.sweep()
        block = self.blocks.take(nbytes, stream_id, lambda size, small: Segment(size, small))
        allocation = PoolAllocation(self, block, nbytes, owner, stamp, raw=raw, index=index)
        block.holder = allocation
        segment = block.segment
        owner.writes(allocation)
        owner.allocations.append(allocation)
        displaced = self.content_of(segment).take(allocation.start, allocation.start + allocation.size, allocation)
        if displaced:
            note = f"{owner.name}'s allocation at op {index} ({nbytes} bytes)"
            for previous in displaced:
                previous.overwritten.setdefault(owner.serial, (index, note))
        if self.last_stamp.get(segment, 0) < stamp:
            self.last_stamp[segment] = stamp
        owner.stamp = max(owner.stamp, stamp)
        self.live[allocation.address] = allocation
        return allocation

    def allocate(self, like: torch.Tensor, owner: GraphMemory, stamp: int, stream_id: int = 0,
                 index: int = 0, nbytes: Optional[int] = None) -> torch.Tensor:
        """A tensor shaped like ``like`` (a meta tensor) on a block of this pool, handed to
        ``owner`` (``nbytes``: ``like``'s storage bytes, when the caller has them)."""
        if nbytes is None:
            nbytes = like.untyped_storage().nbytes()
        allocation = self.take(nbytes, owner, stamp, stream_id, index=index)
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
        """The program's alias of ``tensor`` when it lies on a live block of this pool, else None."""
        allocation = self.allocation_of(tensor)
        if allocation is None or allocation.raw:
            return None
        return allocation.program_alias(tensor)


class PoolWeakTensor(torch.Tensor):
    """A weak reference into graph-pool memory (module docstring): ops run on the pool memory
    while the block's data is its owner's, and raise otherwise."""

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
        """Whether a read through it would succeed now."""
        allocation = self._allocation
        return allocation.owner.alive and allocation.end_note is None and allocation.stale_by() is None

    @property
    def graph_alive(self) -> bool:
        """Whether the graph that allocated the block still holds it (it was not reset)."""
        return self._allocation.owner.alive

    def resolve(self, op: str = "a read", *, role: str = READ, func: Any = None) -> torch.Tensor:
        """The pool memory, for one op using it as ``role``; raises when the owner was reset or,
        for a read, when someone else wrote the bytes since the owner did. The end of its own
        graph's program counts for torch's own ops (``func``: reading a graph's data after its
        replay); a custom kernel handed weak references outside a replay is a task update's
        re-issue on its way to the update (hw opens the update only once the kernel's pre-check
        passed), which `sim.pool_checks.check_update` checks at the kernel's place."""
        allocation = self._allocation
        owner = allocation.owner
        if not owner.alive:
            raise DeadWeakReference(DEAD_POOL_REFERENCE.format(op=op, what=self._what, graph=owner.name))
        replaying = _REPLAYING.get()
        if role != WRITE and replaying is not owner:
            if allocation.end_note is not None and replaying is None and _reads_after_the_program(func):
                raise PoolBlockReused(REUSED_AT_GRAPH_END.format(op=op, what=self._what, graph=owner.name,
                                                                 other=allocation.end_note))
            stale = allocation.stale_by(exclude=replaying)
            if stale is not None:
                raise PoolBlockReused(POOL_BLOCK_REUSED.format(op=op, what=self._what, graph=owner.name,
                                                               other=stale[0].name))
        if role != READ and replaying is None:  # an eager write: the bytes are this allocation's now
            allocation.stamp = owner.next_stamp()
            last = allocation.arena.last_stamp
            if last.get(allocation.segment, 0) < allocation.stamp:
                last[allocation.segment] = allocation.stamp
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
        roles, by_name = argument_roles(func)

        def unwrap(role: str) -> Callable[[Any], Any]:
            return lambda value: value.resolve(op, role=role, func=func) if isinstance(value, PoolWeakTensor) else value

        args = tuple(tree_map(unwrap(roles[p] if p < len(roles) else READ), value) for p, value in enumerate(args))
        kwargs = {name: tree_map(unwrap(by_name.get(name, READ)), value) for name, value in (kwargs or {}).items()}
        return func(*args, **kwargs)
