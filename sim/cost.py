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

Hook: ``CostModel.task_adjust`` (None by default) may rescale a graph task's device time,
e.g. static-kernel or super-kernel discounts decided by another stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional, Sequence

import torch

__all__ = ["CostParams", "TaskInfo", "CostModel", "describe_task"]


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


def _tensors(values: Sequence[Any]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(v for v in value if isinstance(v, torch.Tensor))
    return found


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


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
    inputs = _tensors(list(args) + list(kwargs.values()))
    outs = _tensors(outputs)
    if op_type == "paged_attention":
        flops, moved = _attention_cost(args)
    elif op_type == "reshape_and_cache":
        moved = 4.0 * (_nbytes(inputs[0]) + _nbytes(inputs[1]))
        flops = 0.0
    else:
        flops = _matmul_flops(op_type, args, outs)
        if flops is None:
            flops = float(sum(t.numel() for t in outs))
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

    def task(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], outputs: Sequence[Any]) -> TaskInfo:
        return describe_task(func, args, kwargs, outputs, self.params)

    def graph_task(self, func: Any, args: Sequence[Any], kwargs: dict[str, Any], outputs: Sequence[Any]) -> TaskInfo:
        info = self.task(func, args, kwargs, outputs)
        if self.task_adjust is not None:
            info = info._replace(duration_us=float(self.task_adjust(info)))
        return info

    def graph_launch_us(self, num_tasks: int) -> float:
        return self.params.graph_launch_us + self.params.graph_launch_per_task_us * num_tasks

    def capture_us(self, num_tasks: int) -> float:
        return self.params.capture_base_us + self.params.capture_per_task_us * num_tasks
