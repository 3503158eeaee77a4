"""Profiling on a real NPU: delegate to ``torch_npu.profiler`` and point at what it wrote.

torch_npu writes one run directory per profiled session,

    <output_dir>/<worker>_<pid>_<timestamp>_ascend_pt/ASCEND_PROFILER_OUTPUT/
        op_statistic.csv      (only at profiler level 1 or 2, hence Level1 by default)
        kernel_details.csv
        trace_view.json, ...

the same file names the simulator writes (docs/semantics.md §13). torch_npu 2.13 names two
kernel_details.csv columns "Block Num" / "Mix Block Num" where docs/semantics.md §13 (and the
simulator) say "Block Dim" / "Mix Block Dim": read columns by name, through
`KERNEL_DETAILS_ALIASES`.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

from ascendgraph.errors import ConfigError
from hw import api
from hw.api import TorchNpu

__all__ = ["NpuProfile", "ProfilerOutput", "find_profiler_outputs", "npu_profile", "KERNEL_DETAILS_ALIASES",
           "PROFILER_LEVELS"]

log = logging.getLogger("ascendgraph.hw.profiler")  # under the CLI's "ascendgraph" logger (its handler, its -v levels)

OUTPUT_SUBDIR = "ASCEND_PROFILER_OUTPUT"
RUN_DIR_SUFFIX = "_ascend_pt"
OP_STATISTIC = "op_statistic.csv"
KERNEL_DETAILS = "kernel_details.csv"
TRACE_VIEW = "trace_view.json"
PROFILER_LEVELS = {0: api.PROFILER_LEVEL_0, 1: api.PROFILER_LEVEL_1, 2: api.PROFILER_LEVEL_2}
# torch_npu 2.13 column -> the docs/semantics.md §13 name.
KERNEL_DETAILS_ALIASES = {"Block Num": "Block Dim", "Mix Block Num": "Mix Block Dim"}


@dataclass(frozen=True)
class ProfilerOutput:
    """One ``*_ascend_pt`` run directory torch_npu produced."""

    run_dir: Path

    @property
    def output_dir(self) -> Path:
        return self.run_dir / OUTPUT_SUBDIR

    @property
    def op_statistic(self) -> Optional[Path]:
        path = self.output_dir / OP_STATISTIC
        return path if path.is_file() else None

    @property
    def kernel_details(self) -> Optional[Path]:
        path = self.output_dir / KERNEL_DETAILS
        return path if path.is_file() else None

    @property
    def trace_view(self) -> Optional[Path]:
        path = self.output_dir / TRACE_VIEW
        return path if path.is_file() else None


def find_profiler_outputs(output_dir: Path | str) -> list[ProfilerOutput]:
    """The torch_npu run directories under ``output_dir``, oldest first."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    runs = [p for p in root.iterdir() if p.is_dir() and p.name.endswith(RUN_DIR_SUFFIX)]
    return [ProfilerOutput(run) for run in sorted(runs, key=lambda p: (p.stat().st_mtime, p.name))]


@dataclass
class NpuProfile:
    """What `npu_profile` yields: call ``step()`` once per served step; outputs after exit."""

    output_dir: Path
    profiler: Any = None
    outputs: list[ProfilerOutput] = field(default_factory=list)

    def step(self) -> None:
        if self.profiler is not None:
            self.profiler.step()

    @property
    def op_statistic(self) -> Optional[Path]:
        return next((o.op_statistic for o in reversed(self.outputs) if o.op_statistic), None)

    @property
    def kernel_details(self) -> Optional[Path]:
        return next((o.kernel_details for o in reversed(self.outputs) if o.kernel_details), None)

    def summary(self) -> str:
        if not self.outputs:
            return (
                f"torch_npu wrote no *{RUN_DIR_SUFFIX} directory under {self.output_dir}; check the CANN profiling "
                "tools (msprof) are installed and the output directory is writable"
            )
        latest = self.outputs[-1]
        found = [name for name, path in ((OP_STATISTIC, latest.op_statistic), (KERNEL_DETAILS, latest.kernel_details)) if path]
        missing = [name for name in (OP_STATISTIC, KERNEL_DETAILS) if name not in found]
        text = f"torch_npu profile in {latest.output_dir}: {', '.join(found) or 'no CSV files'}"
        if missing:
            text += f" (missing: {', '.join(missing)}; op_statistic.csv needs profiler level 1 or 2)"
        return text


@contextlib.contextmanager
def npu_profile(
    npu: TorchNpu,
    output_dir: Path | str,
    *,
    level: int = 1,
    record_shapes: bool = True,
    profile_memory: bool = False,
    with_stack: bool = False,
    aic_metrics: bool = False,
    worker_name: Optional[str] = None,
) -> Iterator[NpuProfile]:
    """Profile the enclosed work with torch_npu's profiler, writing Ascend-format files.

    ``level`` 1 (default) or 2 produces op_statistic.csv; 0 only the basic files.
    Analysis runs synchronously when the context exits, then the produced files are logged.
    """
    if level not in PROFILER_LEVELS:
        raise ConfigError(f"profiler level must be 0, 1 or 2, got {level!r}", key="level")
    root = Path(output_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the profile directory {root}: {exc.strerror or exc}", key="profile_dir") from None
    before = {o.run_dir for o in find_profiler_outputs(root)}
    experimental = npu.call(
        api.EXPERIMENTAL_CONFIG,
        profiler_level=npu.get(PROFILER_LEVELS[level]),
        aic_metrics=npu.get(api.AIC_METRICS_PIPE if aic_metrics else api.AIC_METRICS_NONE),
        export_type=npu.get(api.EXPORT_TEXT),
        record_op_args=False,
    )
    profiler = npu.call(
        api.PROFILE,
        activities=[npu.get(api.ACTIVITY_CPU), npu.get(api.ACTIVITY_NPU)],
        on_trace_ready=npu.call(api.TRACE_HANDLER, dir_name=str(root), worker_name=worker_name,
                                analyse_flag=True, async_mode=False),
        record_shapes=record_shapes,
        profile_memory=profile_memory,
        with_stack=with_stack,
        experimental_config=experimental,
    )
    handle = NpuProfile(output_dir=root, profiler=profiler)
    with profiler:
        yield handle
    handle.outputs = [o for o in find_profiler_outputs(root) if o.run_dir not in before]
    log.info("%s", handle.summary())
