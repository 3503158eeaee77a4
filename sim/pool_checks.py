"""The capture-time check of graph-pool reads and writes: "no one else wrote it in between".

Theory of operation. A capture records ops in program order, so their pool reads and writes
can be checked once, where they are recorded, instead of at every replay (`sim.pool_memory`
keeps who owns which bytes: `PoolArena.content_of`). For each recorded op (`check_op`), in the
order a replay runs them:

* a weak reference read (not written first, `sim.pool_memory.argument_roles`) after this capture
  handed its block to another allocation, or after a write through another weak reference
  overwrote it, is refused (`PoolBlockReused`): on a card it reads the other tensor's data;
* a live tensor of the capture read after a write through a weak reference overwrote its bytes
  (and before it was written again) is refused the same way; so is a kernel whose write through a
  weak reference lands on one of its own inputs;
* then its writes through weak references take the bytes over: whoever else was handed them loses
  its data until it writes them again.

`finish` notes, at capture end, which allocations no longer hold their data at the program's end
(what a weak reference to a graph output reads after a replay); `check_update` checks the weak
references a task update re-issues at the kernel's place in the program.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import torch

from sim.pool_memory import READ, UPDATE, WRITE, GraphMemory, PoolAllocation, PoolBlockReused, PoolWeakTensor, argument_roles

__all__ = ["check_op", "check_update", "finish", "weak_view", "register_weak_view_resolver"]

# Weak references that are plain tensors: a device type's non-owning alias (sim.npu_device's
# torch_npu._C._weak_ref_tensor) is a weak view of a pool block as a PoolWeakTensor is. The device
# type registers a resolver answering with the PoolWeakTensor that stands for such a tensor.
_WEAK_VIEW_RESOLVERS: list[Any] = []


def register_weak_view_resolver(resolver: Any) -> None:
    """``resolver(tensor) -> Optional[PoolWeakTensor]`` for plain tensors that are weak views."""
    if resolver not in _WEAK_VIEW_RESOLVERS:
        _WEAK_VIEW_RESOLVERS.append(resolver)


def weak_view(value: Any) -> Optional[PoolWeakTensor]:
    """The weak reference into pool memory ``value`` is (itself, or what a resolver says a plain
    tensor is), or None."""
    if isinstance(value, PoolWeakTensor):
        return value
    if _WEAK_VIEW_RESOLVERS and type(value) is torch.Tensor:
        for resolver in _WEAK_VIEW_RESOLVERS:
            found = resolver(value)
            if found is not None:
                return found
    return None

REUSED_IN_CAPTURE = (
    "simulator: {op} (op {index} of the capture of {graph}) reads {what}, but its block was handed to {other} "
    "and written there first (no one else may write a block between its owner's write and a read): on a card "
    "it reads {other}'s data, silently (a use-after-free through the graph pool). {fix}"
)
FIX_WEAK_READ = "Keep a strong reference to the tensor for as long as it is used (weak-reference it after its last use)."
FIX_CLOBBERED = (
    "A write through a weak reference (a kernel's out= or workspace) overwrote it: keep a strong reference to that "
    "buffer until the capture's last use of it (vLLM Ascend weak-references its workspaces after the capture)."
)



def check_op(memory: GraphMemory, func: Any, args: tuple, kwargs: dict, index: int) -> None:
    """An op recorded at ``index`` of this capture: refuse a read of bytes someone else wrote
    since their owner did, then note what its writes through weak references overwrite."""
    roles, by_name = argument_roles(func)
    weak_writes: list[PoolAllocation] = []
    strong_writes: list[torch.Tensor] = []
    check_strong = memory.clobbered > 0
    for position, value in enumerate(args):
        role = roles[position] if position < len(roles) else READ
        _check_value(memory, func, value, role, index, check_strong, weak_writes, strong_writes)
    for name, value in kwargs.items():
        _check_value(memory, func, value, by_name.get(name, READ), index, check_strong, weak_writes, strong_writes)
    if weak_writes:
        _check_overlap(memory, func, args, kwargs, weak_writes, index)
    for tensor in strong_writes:
        allocation = _own(memory, tensor)
        if allocation is not None and allocation.clobbered is not None:
            allocation.clobbered = None
            memory.clobbered -= 1
            allocation.arena.content_of(allocation.segment).take(
                allocation.start, allocation.start + allocation.size, allocation)
    for weak in weak_writes:
        _weak_write(memory, weak, func, index)

_HOST_VALUES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                          torch.memory_format})


def _check_value(memory: GraphMemory, func: Any, value: Any, role: str, index: int, check_strong: bool,
                 weak_writes: list, strong_writes: list) -> None:
    if type(value) in _HOST_VALUES:  # no tensor: nothing to check (most arguments)
        return
    if isinstance(value, (list, tuple)):
        for item in value:
            _check_value(memory, func, item, role, index, check_strong, weak_writes, strong_writes)
        return
    weak = weak_view(value)
    if weak is not None:
        value = weak
        allocation = value._allocation
        if allocation.arena is not memory.arena and memory.arena is not None:
            return  # another pool's block: only the run-time check applies
        if role != WRITE:
            taken = allocation.overwritten.get(memory.serial)
            if taken is not None:
                raise PoolBlockReused(REUSED_IN_CAPTURE.format(
                    op=func, index=index, graph=memory.name, what=f"a weak reference ({value._what})",
                    other=taken[1], fix=FIX_WEAK_READ))
            if allocation.clobbered is not None:
                raise PoolBlockReused(REUSED_IN_CAPTURE.format(
                    op=func, index=index, graph=memory.name, what=f"a weak reference ({value._what})",
                    other=allocation.clobbered[1], fix=FIX_CLOBBERED))
        if role != READ:
            weak_writes.append(allocation)
        return
    if not isinstance(value, torch.Tensor):
        return
    if role == WRITE:
        if check_strong:
            strong_writes.append(value)
        return
    if check_strong:
        own = _own(memory, value)
        if own is not None and own.clobbered is not None:
            raise PoolBlockReused(REUSED_IN_CAPTURE.format(
                op=func, index=index, graph=memory.name, what=f"{own.describe()}",
                other=own.clobbered[1], fix=FIX_CLOBBERED))
        if role == UPDATE:
            strong_writes.append(value)

def _check_overlap(memory: GraphMemory, func: Any, args: tuple, kwargs: dict, weak_writes: list, index: int) -> None:
    """A kernel writing through a weak reference into bytes one of its own inputs was handed
    reads a corrupted input on a card. (Its outputs there are noted as overwritten: their next
    read is refused.)"""
    roles, by_name = argument_roles(func)
    named = [(roles[p] if p < len(roles) else READ, v) for p, v in enumerate(args)]
    named += [(by_name.get(n, READ), v) for n, v in kwargs.items()]
    for role, value in named:
        if role == WRITE:
            continue
        for tensor in _tensors((value,), {}):
            allocation = _own(memory, tensor)
            if allocation is None:
                continue
            for weak in weak_writes:
                if weak is not allocation and weak.segment is allocation.segment and \
                        weak.start < allocation.start + allocation.size and allocation.start < weak.start + weak.size:
                    raise PoolBlockReused(REUSED_IN_CAPTURE.format(
                        op=func, index=index, graph=memory.name, what=allocation.describe(),
                        other=f"its own write through a weak reference ({weak.describe()})", fix=FIX_CLOBBERED))

def _own(memory: GraphMemory, tensor: torch.Tensor) -> Optional[PoolAllocation]:
    arena = memory.arena
    if arena is None or type(tensor) is not torch.Tensor:
        return None
    allocation = arena.live.get(tensor.untyped_storage().data_ptr())
    return allocation if allocation is not None and allocation.owner is memory else None

def _weak_write(memory: GraphMemory, weak: PoolAllocation, func: Any, index: int) -> None:
    """A write at ``index`` through a weak reference to ``weak``'s block: whoever was handed
    those bytes since loses its data until it writes them again."""
    what = f"{func}'s write through a weak reference ({weak.describe()})"
    for other in weak.arena.content_of(weak.segment).take(weak.start, weak.start + weak.size, weak):
        if other.owner is not memory:
            continue
        if weak.arena.live.get(other.address) is other:
            if other.clobbered is None:
                other.clobbered = (index, what)
                memory.clobbered += 1
        else:
            other.overwritten.setdefault(memory.serial, (index, what))
    weak.overwritten.pop(memory.serial, None)  # the bytes hold weak's data again
    if weak.owner is not memory:
        memory.writes(weak)  # this graph's replays write another graph's block

def finish(memory: GraphMemory) -> None:
    """The capture ended: note which allocations still hold their data at the program's end."""
    for allocation in memory.allocations:
        taken = allocation.overwritten.get(memory.serial)
        if taken is not None:
            allocation.end_note = taken[1]
        elif allocation.clobbered is not None:
            allocation.end_note = allocation.clobbered[1]
    memory.clobbered = 0

def check_update(memory: GraphMemory, func: Any, args: tuple, kwargs: dict, index: int) -> None:
    """A task update re-issues ``func`` at record ``index``: its weak references must hold their
    owner's data at that place of the program."""
    roles, by_name = argument_roles(func)
    named = [(roles[p] if p < len(roles) else READ, v) for p, v in enumerate(args)]
    named += [(by_name.get(n, READ), v) for n, v in kwargs.items()]
    for role, value in named:
        for weak in _weak_tensors(value):
            allocation = weak._allocation
            if role != READ and allocation.owner is not memory and allocation.arena is memory.arena:
                memory.writes(allocation)  # this graph's replays now write another graph's block
            if role == WRITE or allocation.owner is not memory:
                continue
            taken = allocation.overwritten.get(memory.serial)
            if taken is not None and taken[0] <= index:
                raise PoolBlockReused(REUSED_IN_CAPTURE.format(
                    op=func, index=index, graph=memory.name, what=f"a weak reference ({weak._what})",
                    other=taken[1], fix=FIX_WEAK_READ))


def _tensors(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)):
            yield from (item for item in value if type(item) is torch.Tensor)
        elif type(value) is torch.Tensor:
            yield value


def _weak_tensors(value: Any) -> Iterator["PoolWeakTensor"]:
    weak = weak_view(value)
    if weak is not None:
        yield weak
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _weak_tensors(item)
