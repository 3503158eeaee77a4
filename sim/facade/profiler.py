"""``torch_npu.profiler`` on the simulator: the slice hw/ and vLLM Ascend use.

``profile(activities=, on_trace_ready=tensorboard_trace_handler(dir_name, ...),
experimental_config=_ExperimentalConfig(profiler_level=...), ...)`` records the kernels
the facade's SimDevice runs in the block (replays and eager kernels) and, on exit, writes
one ``*_ascend_pt/ASCEND_PROFILER_OUTPUT`` directory with the simulator's
op_statistic.csv / kernel_details.csv / trace_view.json (`ascendgraph.profile_formats`),
like torch_npu's analysis with ``analyse_flag=True``. Level0 writes no op_statistic.csv,
as torch_npu. Everything else in torch_npu's profiler is absent.
"""

from __future__ import annotations

import contextlib
import enum
import os
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Optional

from sim.facade.runtime import runtime

__all__ = ["ProfilerActivity", "ProfilerLevel", "AiCMetrics", "ExportType", "_ExperimentalConfig",
           "tensorboard_trace_handler", "profile", "module"]


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


class ProfilerLevel(enum.Enum):
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"


class AiCMetrics(enum.Enum):
    AiCoreNone = "AiCoreNone"
    PipeUtilization = "PipeUtilization"


class ExportType(enum.Enum):
    Text = "text"


class _ExperimentalConfig:
    def __init__(self, profiler_level: ProfilerLevel = ProfilerLevel.Level0, aic_metrics: Any = None,
                 export_type: Any = None, record_op_args: bool = False, **kwargs: Any) -> None:
        self.profiler_level = profiler_level


class _TraceHandler:
    def __init__(self, dir_name: str, worker_name: Optional[str], analyse_flag: bool) -> None:
        self.dir_name = dir_name
        self.worker_name = worker_name
        self.analyse_flag = analyse_flag


def tensorboard_trace_handler(dir_name: Optional[str] = None, worker_name: Optional[str] = None,
                              analyse_flag: bool = True, async_mode: bool = False) -> _TraceHandler:
    return _TraceHandler(dir_name or "./", worker_name, analyse_flag)


class profile:
    """Records the simulated kernels of the block; writes the Ascend-format files on exit."""

    def __init__(self, activities: Any = None, schedule: Any = None, on_trace_ready: Any = None,
                 record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
                 experimental_config: Optional[_ExperimentalConfig] = None, **kwargs: Any) -> None:
        self.on_trace_ready = on_trace_ready
        self.level = (experimental_config or _ExperimentalConfig()).profiler_level
        self._stack = contextlib.ExitStack()
        self._steps: list[int] = []
        self._session: Any = None
        self._step = 0

    def __enter__(self) -> "profile":
        device = runtime().device
        self._session = self._stack.enter_context(device.profiling(tempfile.gettempdir()))
        self._stack.enter_context(device.track_eager())
        return self

    def step(self) -> None:
        self._steps.append(len(self._session.records))
        self._step += 1

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
        handler = self.on_trace_ready
        if not isinstance(handler, _TraceHandler) or not handler.analyse_flag:
            return
        from ascendgraph.profile_formats import OP_STATISTIC, write_profile

        records = list(self._session.records)
        step_ids: list[Optional[int]] = []
        marks = self._steps
        for index in range(len(records)):
            step_ids.append(next((i for i, mark in enumerate(marks) if index < mark), None))
        device = runtime().device
        output = write_profile(handler.dir_name, records, step_ids=step_ids, stream_names=device.stream_names(),
                               worker=handler.worker_name)
        if self.level == ProfilerLevel.Level0:
            statistic = Path(output.run_dir) / "ASCEND_PROFILER_OUTPUT" / OP_STATISTIC
            if statistic.exists():
                os.remove(statistic)


def module() -> ModuleType:
    built = ModuleType("torch_npu.profiler", "torch_npu.profiler on the simulator (sim.facade)")
    for name in __all__[:-1]:
        setattr(built, name, globals()[name])
    return built
