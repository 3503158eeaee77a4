"""The virtual clock's cost model: what host launches, graph launches and device tasks cost.

Theory of operation. The simulator keeps two clocks, in microseconds: the *host* clock
(time the Python thread spends launching work) and the *device* clock (when the device
finishes the work queued so far). Launching an eager op costs ``host_launch_us`` on the
host; its task starts on the device when both the device is free and the launch is done,
and runs for its task time. Replaying a graph costs one ``graph_launch_us`` (plus a small
per-task term) on the host, then its tasks run back to back on the device. Virtual time
is the later of the two clocks. Small batches are host-bound eagerly and device-bound in
graphs, which is the effect graph mode exists for.

A task's device time is a roofline: ``task_overhead_us + max(flops / peak, bytes /
bandwidth)``. FLOPs are counted for matmuls (2·M·N·K) and attention (4·heads·head_dim per
visible (query, key) pair); other ops count one FLOP per output element. Bytes are the
tensor inputs and outputs the op touches (for the paged KV cache only the blocks read or
written). The numbers in `CostParams` are rough public figures, not calibrations; a JSON
profile can replace them (see `sim.profiles.load_profile`).

Hook: ``CostModel.task_adjust`` (None by default) may rescale a graph task's device time.

Static and super kernels (docs/semantics.md §10). ``CostModel.static_kernels`` maps a kernel
signature — (op name, input shapes, input dtypes), `task_signature` — to the id of a
fixed-shape kernel a static-kernel build produced (`SimDevice.install_static_kernels`). A
graph task whose signature was built runs as that static kernel: named
``<op>_static_kernel_<id>``, with its fixed per-task cost scaled by
``static_kernel_overhead_factor`` (no shape-dependent tiling at launch). A super kernel
(`super_kernel_task`) is a run of static kernels merged into one launch: one fixed cost,
a small sync per merged boundary, and the largest block dim of its parts. A task's block
dim is its output elements over ``elements_per_block``, between 1 and ``ai_cores``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch

from ascendgraph.ops import argument_tensors
from sim.recorder import NoSignature, call_signature, signature_of

__all__ = [
    "CostParams",
    "TaskInfo",
    "CostModel",
    "describe_task",
    "task_signature",
    "static_kernel_task",
    "super_kernel_task",
    "STATIC_KERNEL_TAG",
    "SUPER_KERNEL_TYPE",
]

STATIC_KERNEL_TAG = "static_kernel"  # in the name and op type of a static kernel (op_statistic.csv)
SUPER_KERNEL_TYPE = "SuperKernel"


@dataclass(frozen=True)
class CostParams:
    host_launch_us: float = 12.0  # one eager op launch (aclnn + task queue)
    graph_launch_us: float = 20.0  # one aclmdlRIExecuteAsync
    graph_launch_per_task_us: float = 0.05
    task_overhead_us: float = 1.5  # fixed device cost per task
    peak_tflops: float = 280.0  # fp16/bf16 cube throughput
    bandwidth_gbps: float = 1600.0  # HBM
    capture_base_us: float = 800.0  # capture begin/end + model instantiation
    capture_per_task_us: float = 25.0  # recording one task during capture
    ai_cores: int = 24  # cores a kernel can launch on (the Block Dim ceiling)
    elements_per_block: int = 8192  # output elements one core takes (block dim estimate)
    static_kernel_overhead_factor: float = 0.5  # fixed per-task cost of a static kernel / of a dynamic one
    super_kernel_sync_us: float = 0.1  # per merged boundary inside a super kernel

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


class TaskInfo(NamedTuple):
    """What the clock and the profiler know about one task (one executed op)."""

    name: str  # "aten.mm.default", "ascendgraph.paged_attention.default"
    op_type: str  # "mm", "paged_attention"
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    flops: float
    bytes: float
    duration_us: float
    block_dim: int = 0  # cores the kernel launches on
    parts: tuple[str, ...] = ()  # a super kernel: the names of the kernels merged into it
    members: tuple["TaskInfo", ...] = ()  # a super kernel: the merged kernels themselves (profiles)


def task_signature(info: TaskInfo) -> tuple:
    """What identifies a fixed-shape kernel: (op name, input shapes, input dtypes)."""
    return (info.name, info.input_shapes, info.input_dtypes)


def _block_dim(outputs: list[torch.Tensor], params: CostParams) -> int:
    elements = sum(t.numel() for t in outputs)
    blocks = -(-elements // max(1, params.elements_per_block))
    return int(min(max(1, blocks), max(1, params.ai_cores)))


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


TASK_MEMO_LIMIT = 20_000  # memoised TaskInfos per CostModel (cleared when full)

_MATMULS = {"mm": 0, "bmm": 0, "matmul": 0, "linear": 0, "_int_mm": 0, "addmm": 1, "baddbmm": 1, "addbmm": 1}


def _matmul_flops(op_type: str, args: Sequence[Any], outputs: list[torch.Tensor]) -> Optional[float]:
    index = _MATMULS.get(op_type)
    if index is None or not outputs or len(args) <= index or not isinstance(args[index], torch.Tensor):
        return None
    k = args[index].shape[-1]
    return 2.0 * outputs[0].numel() * k


def _attention_cost(args: Sequence[Any]) -> tuple[float, float]:
    query, key_cache, _value_cache, _table, ends, seq_lens = args[:6]
    heads, head_dim = query.shape[1], query.shape[2]
    kv_heads = key_cache.shape[2]
    pairs = 0
    kv_tokens = 0
    start = 0
    for end, kv_len in zip(ends, seq_lens):
        q_len = end - start
        pairs += max(0, q_len * kv_len - q_len * (q_len - 1) // 2)
        kv_tokens += kv_len
        start = end
    flops = 4.0 * heads * head_dim * pairs
    size = query.element_size()
    moved = 2 * kv_tokens * kv_heads * head_dim * size + 2 * _nbytes(query)
    return flops, float(moved)


def describe_task(func: Any, args: Sequence[Any], kwargs: dict[str, Any], outputs: Sequence[Any], params: CostParams) -> TaskInfo:
    """Shapes, dtypes, FLOPs, bytes and roofline duration of one op call."""
    name = str(func)
    op_type = name.split(".")[1] if name.count(".") >= 2 else name
    inputs = argument_tensors(list(args) + list(kwargs.values()))
    outs = argument_tensors(outputs)
    if op_type == "paged_attention":
        flops, moved = _attention_cost(args)
    elif op_type == "reshape_and_cache":
        moved = 4.0 * (_nbytes(inputs[0]) + _nbytes(inputs[1]))
        flops = 0.0
    else:
        matmul = _matmul_flops(op_type, args, outs)
        flops = matmul if matmul is not None else float(sum(t.numel() for t in outs))
        moved = float(sum(_nbytes(t) for t in inputs) + sum(_nbytes(t) for t in outs))
    compute_us = flops / (params.peak_tflops * 1e6)
    memory_us = moved / (params.bandwidth_gbps * 1e3)
    duration = params.task_overhead_us + max(compute_us, memory_us)
    return TaskInfo(
        name=name,
        op_type=op_type,
        input_shapes=tuple(tuple(t.shape) for t in inputs),
        input_dtypes=tuple(str(t.dtype).replace("torch.", "") for t in inputs),
        output_shapes=tuple(tuple(t.shape) for t in outs),
        output_dtypes=tuple(str(t.dtype).replace("torch.", "") for t in outs),
        flops=flops,
        bytes=moved,
        duration_us=duration,
        block_dim=_block_dim(outs, params),
    )


def static_kernel_task(info: TaskInfo, kernel_id: str, params: CostParams) -> TaskInfo:
    """``info`` run as the static kernel ``kernel_id``: renamed, cheaper fixed cost."""
    saved = params.task_overhead_us * (1.0 - params.static_kernel_overhead_factor)
    return info._replace(
        name=f"{info.op_type}_{STATIC_KERNEL_TAG}_{kernel_id}",
        op_type=f"{info.op_type}_{STATIC_KERNEL_TAG}",
        duration_us=max(0.0, info.duration_us - saved),
    )


def super_kernel_task(parts: Sequence[TaskInfo], name: str, params: CostParams) -> TaskInfo:
    """One kernel for a run of static kernels: one fixed cost, a sync per merged boundary,
    inputs of the first part, outputs of the last, the largest block dim."""
    fixed = params.task_overhead_us * params.static_kernel_overhead_factor
    merged = len(parts) - 1
    duration = sum(p.duration_us for p in parts) - merged * fixed + merged * params.super_kernel_sync_us
    return TaskInfo(
        name=name,
        op_type=SUPER_KERNEL_TYPE,
        input_shapes=parts[0].input_shapes,
        input_dtypes=parts[0].input_dtypes,
        output_shapes=parts[-1].output_shapes,
        output_dtypes=parts[-1].output_dtypes,
        flops=sum(p.flops for p in parts),
        bytes=sum(p.bytes for p in parts),
        duration_us=max(0.0, duration),
        block_dim=max(p.block_dim for p in parts),
        parts=tuple(p.name for p in parts),
        members=tuple(parts),
    )


class CostModel:
    """Turns ops into virtual time (see the module docstring)."""

    def __init__(
        self,
        params: Optional[CostParams] = None,
        *,
        task_adjust: Optional[Callable[[TaskInfo], float]] = None,
    ) -> None:
        self.params = params or CostParams()
        # Returns the adjusted device time (us) of a graph task; None keeps the roofline.
        self.task_adjust = task_adjust
        # task_signature -> static kernel id (SimDevice.install_static_kernels fills it).
        self.static_kernels: dict[tuple, str] = {}
        # describe_task memoised on the call's signature (`sim.recorder.call_signature`) and the
        # outputs': a TaskInfo reads only sizes, dtypes and host values (attention's lists), so
        # one computed for a signature is the one a fresh call computes. Per object, keyed on
        # the params it was computed with.
        self._tasks: dict[tuple, TaskInfo] = {}
        self._tasks_params = self.params

    def task(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], outputs: Sequence[Any]) -> TaskInfo:
        call = call_signature(func, args, kwargs)
        if call is None:
            return describe_task(func, args, kwargs, outputs, self.params)
        if self._tasks_params is not self.params:
            self._tasks.clear()
            self._tasks_params = self.params
        try:
            key = (call, tuple(kwargs), signature_of(outputs))  # kwargs' order: input_shapes' order
            info = self._tasks.get(key)
        except (NoSignature, TypeError):  # an output without a signature, a symbolic size
            return describe_task(func, args, kwargs, outputs, self.params)
        if info is None:
            info = describe_task(func, args, kwargs, outputs, self.params)
            if len(self._tasks) >= TASK_MEMO_LIMIT:
                self._tasks.clear()
            self._tasks[key] = info
        return info

    def graph_task(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], outputs: Sequence[Any]) -> TaskInfo:
        info = self.task(func, args, kwargs, outputs)
        if self.static_kernels:
            kernel_id = self.static_kernels.get(task_signature(info))
            if kernel_id is not None:
                info = static_kernel_task(info, kernel_id, self.params)
        if self.task_adjust is not None:
            info = info._replace(duration_us=float(self.task_adjust(info)))
        return info

    def graph_launch_us(self, num_tasks: int) -> float:
        return self.params.graph_launch_us + self.params.graph_launch_per_task_us * num_tasks

    def capture_us(self, num_tasks: int) -> float:
        return self.params.capture_base_us + self.params.capture_per_task_us * num_tasks
