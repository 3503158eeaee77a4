"""The replay program of one captured graph (`sim.capture` records; `sim.capturing` builds a
`Program` at capture end; `sim.replay` runs it): segments of plain calls separated by
control nodes, with everything the replay's hot path needs precomputed."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from sim.capture import COPY_MANY, COPY_ONE, NO_COPY, ControlRecord, OpRecord, TaskGroup
from sim.cost import CostModel, TaskInfo, super_kernel_task
from sim.matmul import widened_call
from sim.static_addresses import StaticAddresses

__all__ = ["Segment", "Program", "out_variant"]

Tensor = torch.Tensor


class Segment:
    """Calls run back to back, then an optional control node."""

    __slots__ = ("entries", "tasks", "kernels", "runs", "time_us", "control", "groups")

    def __init__(self) -> None:
        self.entries: list[tuple] = []
        self.tasks: list[TaskInfo] = []
        self.kernels: list[TaskInfo] = self.tasks  # what launches; `merge_runs` makes it its own list
        self.runs: list[tuple[int, int, str]] = []  # merged task ranges [start, end) and the kernel's name
        self.time_us = 0.0
        self.control: Optional[ControlRecord] = None
        self.groups: tuple[TaskGroup, ...] = ()  # task groups whose first task is in this segment

    def retime(self, cost: Optional[CostModel] = None) -> None:
        if self.runs and cost is not None:
            kernels: list[TaskInfo] = []
            position = 0
            for start, end, name in self.runs:
                kernels.extend(self.tasks[position:start])
                kernels.append(super_kernel_task(self.tasks[start:end], name, cost.params))
                position = end
            kernels.extend(self.tasks[position:])
            self.kernels = kernels
        self.time_us = sum(kernel.duration_us for kernel in self.kernels)


_OUT_VARIANTS: dict[Any, Optional[Any]] = {}  # func -> out_variant(func) (a pure function of the op)


def out_variant(func: Any) -> Optional[Any]:
    """The ``.out`` overload of a single-output aten op with the same arguments, or None."""
    if func not in _OUT_VARIANTS:
        _OUT_VARIANTS[func] = _find_out_variant(func)
    return _OUT_VARIANTS[func]


def _find_out_variant(func: Any) -> Optional[Any]:
    schema = func._schema
    if not schema.name.startswith("aten::") or len(schema.returns) != 1 or schema.is_mutable:
        return None
    packet = getattr(torch.ops.aten, schema.name[len("aten::"):], None)
    if packet is None:
        return None
    name = "out" if schema.overload_name in ("", "default") else f"{schema.overload_name}_out"
    if name not in packet.overloads():
        return None
    candidate = getattr(packet, name)
    arguments = candidate._schema.arguments
    outs = [a for a in arguments if a.alias_info is not None and a.alias_info.is_write]
    ins = [a.name for a in arguments if not (a.alias_info is not None and a.alias_info.is_write)]
    if len(outs) != 1 or outs[0].name != "out" or ins != [a.name for a in schema.arguments]:
        return None
    return candidate


def _call(func: Any, args: tuple, kwargs: dict) -> Callable[..., Any]:
    """What a replay calls for ``func``: its C++ handle, or the widened half-precision matmul
    (`sim.matmul`: the same arithmetic as the simulator's eager path)."""
    widened = widened_call(func, args, kwargs)
    return widened if widened is not None else func._op


def _entry(func: Any, args: tuple, kwargs: dict, dests: Sequence[Any]) -> tuple:
    if not any(d is not None for d in dests):
        return (_call(func, args, kwargs), args, kwargs or None, NO_COPY, None)
    if len(dests) == 1 and isinstance(dests[0], Tensor):
        variant = out_variant(func)
        if variant is not None:
            # Write straight into the captured output: no temporary, no copy.
            out_kwargs = {**kwargs, "out": dests[0]}
            return (_call(variant, args, out_kwargs), args, out_kwargs, NO_COPY, None)
        return (_call(func, args, kwargs), args, kwargs or None, COPY_ONE, dests[0])
    if len(dests) == 1 and isinstance(dests[0], (list, tuple)):
        # the op's one return is a Tensor[] (torch_npu's npu_grouped_matmul): its result is that
        # list, copied element by element into the captured list
        return (_call(func, args, kwargs), args, kwargs or None, COPY_MANY, tuple(dests[0]))
    return (_call(func, args, kwargs), args, kwargs or None, COPY_MANY, tuple(dests))


def _task(cost: CostModel, record: OpRecord) -> TaskInfo:
    outputs = [d for d in record.dests if d is not None]
    if not outputs and record.func._schema.is_mutable:
        # A kernel writing into an argument (out=, reshape_and_cache): those are its outputs.
        outputs = [
            value
            for arg, value in zip(record.func._schema.arguments, record.args)
            if arg.alias_info is not None and arg.alias_info.is_write
        ]
    return cost.graph_task(record.func, record.args, record.kwargs, outputs)


class Program:
    """What a replay runs: segments, plus where each recorded op landed (for task updates)."""

    def __init__(self, records: list[Any], cost: CostModel) -> None:
        self.segments: list[Segment] = []
        self.positions: dict[int, tuple[int, int]] = {}
        self.records = records
        self.cost = cost
        segment = Segment()
        for index, record in enumerate(records):
            if isinstance(record, ControlRecord):
                segment.control = record
                self.segments.append(segment)
                segment = Segment()
                continue
            self.positions[index] = (len(self.segments), len(segment.entries))
            segment.entries.append(_entry(record.func, record.args, record.kwargs, record.dests))
            segment.tasks.append(_task(cost, record))
        self.segments.append(segment)
        for seg in self.segments:
            seg.retime()
        self.num_tasks = sum(len(seg.entries) for seg in self.segments)
        self.total_time_us = sum(seg.time_us for seg in self.segments)
        # The captured addresses (a task update replaces one record's), checked at every replay.
        self.addresses = StaticAddresses(
            {index: (r.args, r.kwargs, r.dests) for index, r in enumerate(records) if isinstance(r, OpRecord)}
        )

    def mark_groups(self, groups: Sequence[TaskGroup]) -> None:
        """Note in which segment each task group starts (a replay checks it is up to date there)."""
        for group in groups:
            if group.record_indices:
                segment = self.segments[self.positions[group.record_indices[0]][0]]
                segment.groups = (*segment.groups, group)

    def replace(self, record_index: int, args: tuple, kwargs: dict) -> None:
        """Give one recorded op new arguments (a task update); its outputs stay in place."""
        record = self.records[record_index]
        record.args, record.kwargs = args, kwargs
        seg_index, entry_index = self.positions[record_index]
        segment = self.segments[seg_index]
        segment.entries[entry_index] = _entry(record.func, args, kwargs, record.dests)
        segment.tasks[entry_index] = _task(self.cost, record)
        segment.retime(self.cost)
        self.total_time_us = sum(seg.time_us for seg in self.segments)
        self.addresses.update(record_index, (record.args, record.kwargs, record.dests))

    @property
    def num_kernels(self) -> int:
        """Kernels one replay launches (tasks, with each merged run counted once)."""
        return sum(len(seg.kernels) for seg in self.segments)

    def merge_runs(self, eligible: Callable[[TaskInfo], bool], prefix: str, *, min_length: int = 2) -> int:
        """Merge every run of ``min_length`` or more consecutive eligible tasks of a segment
        into one kernel named ``<prefix>_<n>`` (a super kernel). Returns how many kernels
        were made. Runs never cross a control node (an event wait splits segments)."""
        made = 0
        for segment in self.segments:
            runs: list[tuple[int, int, str]] = []
            start: Optional[int] = None
            for index, task in enumerate([*segment.tasks, None]):
                if task is not None and eligible(task):
                    start = index if start is None else start
                    continue
                if start is not None and index - start >= min_length:
                    runs.append((start, index, f"{prefix}_{made + len(runs)}"))
                start = None
            if runs:
                segment.runs = runs
                segment.retime(self.cost)
                made += len(runs)
        self.total_time_us = sum(seg.time_us for seg in self.segments)
        return made

    def op_names(self) -> list[str]:
        return [str(r.func) for r in self.records if isinstance(r, OpRecord)]
