"""One capture in progress, one task update in progress, and the replay program.

Theory of operation. A `Capture` turns the ops its recorder hands it into `OpRecord`s
(call, captured arguments, the tensors that receive fresh outputs) and the graph-level
events of the capturing stream into `ControlRecord`s (ExternalEvent wait / reset /
record). At capture end the records become a `sim.program.Program`: segments of plain calls
separated by control nodes, with everything the hot path needs precomputed, so a replay
is a tight loop of ``call(*args)`` plus a ``copy_`` into each captured output.

A task group names a run of records. A task `Update` collects the ops re-issued between
task_update_begin and task_update_end (they do not run) and, if they match the group op
for op, the group's program entries take their arguments.

Memory. Capture outputs are blocks of the capture's pool (`sim.pool_memory`); every record
is kept on the blocks' program aliases (`Capture._append`), so a block the captured code
drops goes back to the pool at once and a later allocation of this capture, or of a later
capture into the pool, may be handed it. Each record's pool reads and writes are checked as
it is recorded ("no one else wrote it in between").

Kernels. A segment's ``tasks`` are one per recorded op (aliases, host-side checks and
allocations are never recorded: they launch no kernel, see `sim.recorder`; an allocation
still takes its bytes from the graph pool); its ``kernels`` are what the
device launches and the profiler sees — the tasks themselves, unless a super-kernel
optimisation merged runs of them (`sim.program.Program.merge_runs`): the calls still run one by one
(the results are the same), the clock and the kernel log see one kernel per run.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import time
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
from torch.utils._python_dispatch import _disable_current_modes

from ascendgraph.ops import collective_group
from ascendgraph.errors import (
    HOST_SYNC_DURING_CAPTURE,
    TASK_GROUP_NOT_A_KERNEL,
    TASK_UPDATE_MISMATCH,
    CaptureConstraintError,
)
from sim import kernels
from sim import pool_checks
from sim.pool_memory import GraphMemory
from sim.npu_device.device_type import HOST_WORK
from sim.static_addresses import tensors_in as _tensors_in
from sim.mode_stack import withdraw
from sim.recorder import (
    ALIAS,
    ALLOC,
    HOST,
    HOST_SYNC,
    NO_KERNEL_OPS,
    NO_META,
    OP,
    RNG,
    CaptureRecorder,
    HostSyncGuard,
    OpInfo,
    UpdateCollector,
    draws_random,
    integer_index_info,
    meta_outputs,
    reject,
)

if TYPE_CHECKING:  # pragma: no cover
    from sim.budget import StreamCharge
    from sim.device import SimDevice
    from sim.pools import SimPool
    from sim.graph import SimGraph
    from sim.streams import SimExternalEvent, SimStream

__all__ = ["OpRecord", "ControlRecord", "TaskGroup", "Capture", "Update"]

Tensor = torch.Tensor
_dispatch_stack_len = torch._C._len_torch_dispatch_stack
NO_COPY, COPY_ONE, COPY_MANY = 0, 1, 2
_UNBOUND = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format})


# What may not sit between task_group_begin and task_group_end (only single-operator kernel
# tasks may: torch_npu's handler contract runs ``prepare_capture``, which queries workspaces
# and allocates outputs, *before* graph_task_group_begin; vLLM Ascend does the same).
# Kind of refusal -> the fix the message gives.
TASK_GROUP_REFUSALS: dict[str, str] = {
    "allocation": "Allocate outputs and scratch (out, softmax_lse) before graph_task_group_begin and pass them "
    "with out= / as arguments.",
    "workspace query": "Query the workspace before graph_task_group_begin (torch_npu's prepare_capture does) and "
    "pass it to the kernel.",
    "output allocation": "Call the op's out= form with an output allocated before graph_task_group_begin.",
    "host synchronization": "Read host values before the capture; a graph cannot synchronize with the host.",
    "ExternalEvent": "Wait on and reset the event before graph_task_group_begin; record it after the task update.",
    "graph replay": "Replay other graphs outside the task group.",
}


def task_group_refusal(kind: str, what: str, group: str, graph: str) -> CaptureConstraintError:
    """The error for something other than a kernel task inside an open task group."""
    return CaptureConstraintError(
        TASK_GROUP_NOT_A_KERNEL.format(what=f"{kind} ({what})", group=group, graph=graph, fix=TASK_GROUP_REFUSALS[kind])
    )


def _alloc_kind(func: Any) -> str:
    reason = NO_KERNEL_OPS.get(func._schema.name, (ALLOC, ""))[1]
    return "workspace query" if reason.startswith("a workspace query") else "allocation"


class OpRecord:
    __slots__ = ("func", "args", "kwargs", "dests", "stream_id")

    def __init__(self, func: Any, args: tuple, kwargs: dict, dests: Any, stream_id: int) -> None:
        self.func = func
        self.args = args
        self.kwargs = kwargs
        self.dests = dests  # per return: None | Tensor | list[Tensor]
        self.stream_id = stream_id

    def __repr__(self) -> str:
        return f"OpRecord({self.func})"


class ControlRecord:
    __slots__ = ("kind", "event")

    def __init__(self, kind: str, event: "SimExternalEvent") -> None:
        self.kind = kind  # "wait" | "reset" | "record"
        self.event = event

    def __repr__(self) -> str:
        return f"ControlRecord({self.kind} {self.event})"


class TaskGroup:
    """The handle task_group_end returns: a run of records of one graph capture."""

    __slots__ = ("graph", "generation", "index", "record_indices", "name", "updated_stamp", "issued_stamp")

    def __init__(self, graph: "SimGraph", generation: int, index: int, record_indices: list[int]) -> None:
        self.graph = graph
        self.generation = generation
        self.index = index
        self.record_indices = record_indices
        self.name = f"task group {index} of {graph.name}"
        self.updated_stamp = 0  # the device's event counter at its last applied task update
        self.issued_stamp = 0  # the same for the last update the host issued (it may not have run yet)

    def __repr__(self) -> str:
        return f"<{self.name}: {len(self.record_indices)} ops>"


def modes_off() -> Any:
    """Hide the dispatch modes below the current one (another device's capture, an eager
    tracker) from the simulator's own work; free when there are none."""
    return _disable_current_modes() if _dispatch_stack_len() else contextlib.nullcontext()


def materialize(
    info: OpInfo, args: tuple, kwargs: dict, allocate: Callable[[Tensor], Tensor]
) -> Optional[tuple[Any, list]]:
    """Outputs of an op without running it: meta shapes, real tensors from ``allocate``.

    Returns (value to hand back, per-return destinations) or None when the op has no meta
    kernel. Returns that alias an argument (in-place / out= ops) hand back that argument.
    """
    func = info.func
    with torch._C.DisableTorchFunction(), modes_off():
        meta_out = meta_outputs(func, args, kwargs)
        if meta_out is NO_META:
            return None
        if info.return_count == 1 and type(meta_out) is Tensor and info.return_alias[0] is None:
            real = allocate(meta_out)  # the common case: one fresh tensor
            return real, [real]
        metas = info.flatten_returns(meta_out)
        values: list[Any] = []
        dests: list[Any] = []
        for index, meta in enumerate(metas):
            alias = info.return_alias[index]
            if alias is not None:
                values.append(info.argument(alias, args, kwargs))
                dests.append(None)
            elif isinstance(meta, Tensor):
                real = allocate(meta)
                values.append(real)
                dests.append(real)
            elif isinstance(meta, (list, tuple)) and meta and all(isinstance(m, Tensor) for m in meta):
                reals = [allocate(m) for m in meta]
                values.append(reals)
                dests.append(reals)
            else:
                values.append(meta)  # None or a host scalar
                dests.append(None)
    return info.pack_returns(values), dests


class Capture:
    """State of the capture under way on one device (at most one at a time)."""

    def __init__(
        self,
        device: "SimDevice",
        graph: "SimGraph",
        stream: "SimStream",
        *,
        charge: "StreamCharge",
        pool: "SimPool",
        poison: bool,
        allow_rng: bool,
    ) -> None:
        self.device = device
        self.graph = graph
        self.stream = stream
        self.charge = charge  # streams held while capturing (returned if the capture fails)
        self.pool = pool  # the pool the capture allocates from
        self.started = time.perf_counter()
        self.poison = poison
        self.allow_rng = allow_rng
        self.records: list[Any] = []
        self.groups: list[TaskGroup] = []
        self.open_group: Optional[tuple["SimStream", int]] = None
        self.super_kernel_scopes: list[str] = []  # names of the super_kernel_scope()s opened
        self.fresh_bytes = 0
        self.pool_blocks: list[Any] = []  # storages made outside the pool arena (held by the graph: sim.graph)
        self.memory = GraphMemory(graph.name, device.virtual_clock.next_stamp)  # the pool blocks this capture is handed
        self.on_arena = device.torch_device.type != "meta"
        self.live: dict[int, Any] = {}  # the pool's handed-out blocks by address (its arena's), for rebinding
        if self.on_arena:
            arena = pool.arena
            arena.sweep()  # blocks freed since the last capture into the pool are handed out again
            self.memory.arena = arena
            self.live = arena.live
        self.fallback_ops = 0
        self.recorder = CaptureRecorder(self)
        self.guard = HostSyncGuard(self.host_sync_error, self.device.host_memory)
        self._active = False

    # -- mode stack
    def start(self) -> None:
        self.guard.__enter__()
        try:
            self.recorder.__enter__()
        except BaseException:
            self.guard.__exit__(None, None, None)
            raise
        self._active = True

    def stop(self) -> None:
        """Take the capture's modes off torch's stacks (wherever they sit: `sim.mode_stack`)."""
        if self._active:
            self._active = False
            withdraw(self.recorder, self.guard)

    def host_sync_error(self, what: str) -> CaptureConstraintError:
        if self.open_group is not None:
            return self.refuse_in_group("host synchronization", what)
        return CaptureConstraintError(HOST_SYNC_DURING_CAPTURE.format(what=what, graph=self.graph.name))

    def refuse_in_group(self, kind: str, what: str) -> CaptureConstraintError:
        return task_group_refusal(kind, what, f"task group {len(self.groups)} (open)", self.graph.name)

    # -- ops
    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        device = self.device
        info = integer_index_info(device.op_info(func), args)
        kind = info.kind
        device_type = device.device_type
        route = device_type.route(func, args, kwargs) if device_type is not None else None
        if route is not None:  # host work runs now; a copy the host waits for cannot be captured
            if route == HOST_WORK:
                return func(*args, **kwargs)
            raise self.host_sync_error(route)
        if self.open_group is not None:
            return self._dispatch_in_group(info, args, kwargs)
        if kind == OP:
            return self._record(info, args, kwargs)
        if kind == ALIAS or kind == HOST:
            return func(*args, **kwargs)
        if kind == ALLOC:
            return self._allocate_only(info, args, kwargs)
        if kind == RNG and (self.allow_rng or not draws_random(info, args, kwargs)):
            return self._record(info, args, kwargs)
        if kind == HOST_SYNC and self._reads_host_memory_only(args, kwargs):
            return func(*args, **kwargs)
        raise reject(kind, func, self.graph.name)

    def _reads_host_memory_only(self, args: tuple, kwargs: dict) -> bool:
        return reads_host_memory_only(self.device, args, kwargs)

    def _dispatch_in_group(self, info: OpInfo, args: tuple, kwargs: dict) -> Any:
        """Inside a task group: kernel tasks writing into existing tensors, and aliases."""
        kind = info.kind
        if kind == ALIAS or kind == HOST:
            return info.func(*args, **kwargs)
        if kind == ALLOC:
            raise self.refuse_in_group(_alloc_kind(info.func), str(info.func))
        if kind == OP or (kind == RNG and (self.allow_rng or not draws_random(info, args, kwargs))):
            func = info.func

            def refuse(meta: Tensor) -> Tensor:
                raise self.refuse_in_group("output allocation", f"{func} returns a new tensor")

            made = materialize(info, args, kwargs, refuse)
            if made is None:
                return self._record_executed(info, args, kwargs)
            self._append(func, args, kwargs, made[1])
            return made[0]
        if kind == HOST_SYNC:
            if self._reads_host_memory_only(args, kwargs):
                return info.func(*args, **kwargs)
            raise self.refuse_in_group("host synchronization", str(info.func))
        raise reject(kind, info.func, self.graph.name)

    def _allocate(self, meta: Tensor) -> Tensor:
        device = self.device
        if device.device_type is not None:  # its allocator takes a raw block of this pool (allocate_raw)
            return device.device_type.allocate_like(meta)
        nbytes = meta.untyped_storage().nbytes() if meta.numel() else 0
        device.captures.malloc(self, nbytes)
        if self.on_arena and nbytes:
            real = self.pool.arena.allocate(meta, self.memory, device.virtual_clock.next_stamp(), self.stream.stream_id,
                                            index=len(self.records), nbytes=nbytes)
        else:
            real = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=device.torch_device)
            self.pool_blocks.append(real.untyped_storage())
        if self.poison and (real.is_floating_point() or real.is_complex()):
            real.fill_(math.nan)
        self.fresh_bytes += nbytes
        return real

    def allocate_raw(self, nbytes: int) -> int:
        """A raw block of the capture's pool (``device.memory.allocate`` on the capturing stream):
        counted, consulted by the malloc failpoint, poisoned (all bits set: NaN in every float
        dtype) like a tensor's fresh block; freed by address."""
        self.device.captures.malloc(self, nbytes)
        allocation = self.pool.arena.take(nbytes, self.memory, self.device.virtual_clock.next_stamp(), self.stream.stream_id,
                                          raw=True, index=len(self.records))
        if self.poison:
            ctypes.memset(allocation.address, 0xFF, nbytes)
        self.fresh_bytes += nbytes
        return allocation.address

    def _append(self, func: Any, args: tuple, kwargs: dict, dests: Any) -> None:
        """Record one op: check its pool reads and writes (`sim.pool_checks.check_op`),
        then keep it on the blocks' program aliases, so the recording holds no block allocated and
        a block the captured code frees is handed out again inside this capture."""
        if self.live:
            pool_checks.check_op(self.memory, func, args, kwargs, len(self.records))
            bind = self._bind
            args = bind(args)
            kwargs = {key: bind(value) for key, value in kwargs.items()} if kwargs else {}
            dests = [bind(dest) for dest in dests]
        else:
            kwargs = dict(kwargs)
        self.records.append(OpRecord(func, args, kwargs, dests, self.device.current_stream().stream_id))

    def _bind(self, value: Any) -> Any:
        """``value`` with every tensor on a live block of the pool replaced by the block's program alias."""
        cls = type(value)
        if cls in _UNBOUND:  # host values: nothing to bind (most arguments)
            return value
        if cls is Tensor:
            storage = value.untyped_storage()
            allocation = self.live.get(storage.data_ptr())
            if allocation is None:
                return value
            if allocation.user_storage is None:  # a raw block: the device type's tensor (sim.npu_device)
                device_type = self.device.device_type
                return value if device_type is None else device_type.program_alias(value)
            if allocation.user_storage() is not storage:
                return value
            return allocation.program_alias(value)
        if (cls is tuple or cls is list) and all(type(v) in _UNBOUND for v in value):
            return value if cls is tuple else list(value)  # sizes, host lengths: nothing to bind
        if isinstance(value, tuple):
            return tuple([self._bind(v) for v in value])
        if isinstance(value, list):
            return [self._bind(v) for v in value]
        return value

    def _allocate_only(self, info: OpInfo, args: tuple, kwargs: dict) -> Any:
        """An allocation: fresh pool memory (counted, poisoned), no task recorded."""
        made = materialize(info, args, kwargs, self._allocate)
        if made is None:
            return self._record_executed(info, args, kwargs)
        return made[0]

    def _record(self, info: OpInfo, args: tuple, kwargs: dict) -> Any:
        kernels.on_capture(self.device.contracts, self.graph.name, info.func, args, kwargs)
        collective = collective_group(info.func, args, kwargs) if info.collective else None
        if collective is not None:  # the graph holds the group's streams (sim.budget)
            self.device.captures.collective(self, info.func, collective[0])
        made = materialize(info, args, kwargs, self._allocate)
        if made is None:
            return self._record_executed(info, args, kwargs)
        value, dests = made
        self._append(info.func, args, kwargs, dests)
        return value

    def _record_executed(self, info: OpInfo, args: tuple, kwargs: dict) -> Any:
        """No meta kernel: run the op now and treat outputs on new storage as fresh."""
        func = info.func
        self.fallback_ops += 1
        inputs = {t.untyped_storage().data_ptr() for t in _tensors_in((args, kwargs))}
        with torch._C.DisableTorchFunction(), modes_off():
            out = func(*args, **kwargs)
        dests: list[Any] = []
        for value in info.flatten_returns(out):
            if isinstance(value, Tensor) and value.untyped_storage().data_ptr() not in inputs:
                self.fresh_bytes += value.untyped_storage().nbytes()
                self.pool_blocks.append(value.untyped_storage())
                dests.append(value)
            else:
                dests.append(None)
        self._append(func, args, kwargs, dests)
        return out

    def control(self, kind: str, event: "SimExternalEvent") -> None:
        if self.open_group is not None:
            raise self.refuse_in_group("ExternalEvent", f"{kind} of {event}")
        self.records.append(ControlRecord(kind, event))

    # -- task groups
    def group_begin(self, stream: "SimStream") -> None:
        self.open_group = (stream, len(self.records))

    def group_end(self, generation: int) -> TaskGroup:
        assert self.open_group is not None
        _, start = self.open_group
        self.open_group = None
        indices = [i for i in range(start, len(self.records)) if isinstance(self.records[i], OpRecord)]
        group = TaskGroup(self.graph, generation, len(self.groups), indices)
        self.groups.append(group)
        return group


def reads_host_memory_only(device: "SimDevice", args: tuple, kwargs: dict) -> bool:
    """A value read whose tensors all live in host memory (`SimDevice.host_memory`): the host
    reads its own memory and nothing waits for the device, so neither a capture nor a task
    update is broken by it. Without a ``host_memory`` answer every tensor is device memory."""
    host_memory = device.host_memory
    if host_memory is None:
        return False
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, Tensor)]
    return bool(tensors) and all(host_memory(t) for t in tensors)


class Update:
    """A task update under way: re-issued ops are collected, not run."""

    def __init__(self, device: "SimDevice", group: TaskGroup, stream: "SimStream") -> None:
        self.device = device
        self.group = group
        self.stream = stream
        self.calls: list[tuple[Any, tuple, dict]] = []
        self.collector = UpdateCollector(self)
        self.in_graph: Any = None  # the token of `sim.pool_memory.enter_graph` while the update is open

    def dispatch(self, func: Any, args: tuple, kwargs: dict) -> Any:
        info = self.device.op_info(func)
        route = self.device.device_type.route(func, args, kwargs) if self.device.device_type is not None else None
        if route is not None:  # host work runs now; a copy the host waits for is no task
            if route == HOST_WORK:
                return func(*args, **kwargs)
            raise CaptureConstraintError(HOST_SYNC_DURING_CAPTURE.format(what=route, graph=self.group.graph.name))
        if info.kind == ALIAS or info.kind == HOST:
            return func(*args, **kwargs)
        if info.kind == ALLOC:  # scratch memory of the update: not a re-issued task
            made = materialize(info, args, kwargs, self._allocate)
            return func(*args, **kwargs) if made is None else made[0]
        if info.kind == HOST_SYNC and reads_host_memory_only(self.device, args, kwargs):
            return func(*args, **kwargs)
        if info.kind not in (OP, RNG):
            raise reject(info.kind, func, self.group.graph.name)
        kernels.on_update(self.device.contracts, func, args, kwargs)
        self.calls.append((func, args, dict(kwargs)))
        made = materialize(info, args, kwargs, self._allocate)
        if made is None:
            raise CaptureConstraintError(
                TASK_UPDATE_MISMATCH.format(
                    group=self.group.name,
                    detail=f"{func} cannot be re-issued in a task update (it has no meta kernel)",
                )
            )
        return made[0]

    def _allocate(self, meta: Tensor) -> Tensor:
        return torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=self.device.torch_device)

    def mismatch(self, records: list[Any]) -> Optional[str]:
        expected = [records[i].func for i in self.group.record_indices]
        got = [call[0] for call in self.calls]
        if len(expected) != len(got):
            return (
                f"it captured {len(expected)} op(s) ({', '.join(map(str, expected)) or 'none'}) but the "
                f"update issued {len(got)} ({', '.join(map(str, got)) or 'none'})"
            )
        for position, (want, have) in enumerate(zip(expected, got)):
            if want is not have:
                return f"op {position} was captured as {want} but the update issued {have}"
        return None
