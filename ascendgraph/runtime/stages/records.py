"""What the engine's stages hand each other: step records, runner results, measures, counters.

`StepRecord` is what observers (`StepObserver`) see for every served step; `RunResult` is what
a runner (`Engine.runners[route]`) returns for one batch; `Comparison` is how far a step was
from eager and the gate it is judged against; `Measure` is the CPU time, device time and kernel
count of one block; `Inputs` are the persistent input buffers the graphs read; `Counters`
accumulate what the report sums up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import torch

from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.report import RUNTIME_MODE_KEYS

__all__ = ["StepRecord", "RunResult", "Comparison", "StepObserver", "Measure", "Inputs", "Counters"]


@dataclass(frozen=True)
class StepRecord:
    """What one served step did (observers receive these)."""

    step: int
    kind: str  # decode | prefill | mixed
    route: str  # native | (xlite, ...)
    runtime_mode: GraphMode
    descriptor: BatchDescriptor
    num_reqs: int
    num_tokens: int
    padded_tokens: int
    max_abs_diff: float
    graph_time_us: Optional[float]  # simulated device time (None on devices without a virtual clock)
    eager_time_us: Optional[float]
    graph_cpu_s: float = 0.0  # host CPU time of the graph path (dispatch, replay, update, sync)
    eager_cpu_s: float = 0.0  # host CPU time of the eager reference
    graph_kernels: int = 0  # device kernel records of the graph path (while the device records them)
    eager_kernels: int = 0
    tolerance: float = 0.0  # the gate max_abs_diff was judged against (0: not checked)


@dataclass
class Measure:
    """Host CPU time, virtual device time and kernel records of one measured block."""

    cpu_s: float = 0.0
    device_us: float = 0.0
    kernels: int = 0


@dataclass
class RunResult:
    """What a runner returns for one batch: the real tokens' hidden states and how it ran."""

    hidden: torch.Tensor  # [num_tokens, hidden], unpadded
    runtime_mode: GraphMode
    descriptor: BatchDescriptor
    padded_tokens: int
    measure: Measure


@dataclass(frozen=True)
class Comparison:
    """A step against the eager reference: the largest absolute difference (infinite for NaN;
    0.0 when not checked), the reference's measure (None when not checked) and the gate."""

    diff: float
    eager: Optional[Measure]
    tolerance: float


class StepObserver(Protocol):
    """Sees every served step (profilers, kernel counters). ``engine`` is the
    `ascendgraph.runtime.engine.Engine` that served it (typed loosely: the stages that call
    observers sit below the engine and do not import it)."""

    def on_step(self, engine: Any, record: StepRecord) -> None: ...


@dataclass
class Inputs:
    """Persistent input buffers: graphs read these addresses at every replay."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor


@dataclass
class Counters:
    """What the served steps add up to (the report's totals)."""

    batches_by_mode: dict[str, int] = field(default_factory=lambda: {k: 0 for k in RUNTIME_MODE_KEYS})
    graphed_real_tokens: int = 0
    graphed_padded_tokens: int = 0
    max_abs_diff: float = 0.0
    graph_time_us: float = 0.0
    eager_time_us: float = 0.0
    steps: int = 0
    checked_steps: int = 0  # steps compared with eager (0: the report says "not checked")

