"""Profiling on npu delegates to torch_npu.profiler and points at the files it wrote.

torch_npu's profiler is replaced by a stand-in with its documented shape (keyword-only
profile(), tensorboard_trace_handler(dir_name=...), run directories named
``*_ascend_pt/ASCEND_PROFILER_OUTPUT``); nothing of the device is faked.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from ascendgraph.errors import ConfigError
from hw.api import TorchNpu
from hw.profiler import KERNEL_DETAILS_ALIASES, find_profiler_outputs, npu_profile


def _write_run(root: Path, name: str, files: tuple[str, ...]) -> Path:
    output = root / name / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    for file in files:
        (output / file).write_text("Device_id,OP Type\n", encoding="utf-8")
    return root / name


def test_outputs_are_the_ascend_pt_run_directories_oldest_first(tmp_path: Path) -> None:
    old = _write_run(tmp_path, "host_1_20260101_ascend_pt", ("kernel_details.csv",))
    new = _write_run(tmp_path, "host_2_20260102_ascend_pt", ("op_statistic.csv", "kernel_details.csv"))
    os.utime(old, (time.time() - 60, time.time() - 60))
    (tmp_path / "not_a_run").mkdir()
    outputs = find_profiler_outputs(tmp_path)
    assert [o.run_dir for o in outputs] == [old, new]
    assert outputs[0].op_statistic is None and outputs[1].op_statistic == new / "ASCEND_PROFILER_OUTPUT" / "op_statistic.csv"
    assert find_profiler_outputs(tmp_path / "missing") == []


def test_torch_npu_column_names_map_to_the_semantics_names() -> None:
    assert KERNEL_DETAILS_ALIASES == {"Block Num": "Block Dim", "Mix Block Num": "Mix Block Dim"}


class StandInProfiler:
    """torch_npu.profiler's public shape; writes a run directory when the trace is ready."""

    ProfilerActivity = SimpleNamespace(CPU="CPU", NPU="NPU")
    ProfilerLevel = SimpleNamespace(Level0="Level0", Level1="Level1", Level2="Level2")
    AiCMetrics = SimpleNamespace(AiCoreNone="ACL_AICORE_NONE", PipeUtilization="ACL_AICORE_PIPE_UTILIZATION")
    ExportType = SimpleNamespace(Text="text")

    def __init__(self, files: tuple[str, ...]) -> None:
        self.files = files
        self.seen: dict[str, Any] = {}

    def _ExperimentalConfig(self, **kwargs: Any) -> dict[str, Any]:
        self.seen["experimental"] = kwargs
        return kwargs

    def tensorboard_trace_handler(self, *, dir_name: str, worker_name: Any, analyse_flag: bool, async_mode: bool) -> Any:
        self.seen["handler"] = dict(dir_name=dir_name, analyse_flag=analyse_flag, async_mode=async_mode)
        return lambda prof: _write_run(Path(dir_name), f"w_{len(self.seen)}_ascend_pt", self.files)

    def profile(self, **kwargs: Any) -> Any:
        self.seen["profile"] = kwargs
        outer = self

        class Session:
            steps = 0

            def __enter__(self) -> "Session":
                return self

            def __exit__(self, *exc: Any) -> None:
                kwargs["on_trace_ready"](self)

            def step(self) -> None:
                Session.steps += 1
                outer.seen["steps"] = Session.steps

        return Session()


def test_npu_profile_asks_for_level_1_text_output_and_reports_the_csv_files(tmp_path: Path) -> None:
    stand_in = StandInProfiler(("op_statistic.csv", "kernel_details.csv"))
    npu = TorchNpu(SimpleNamespace(profiler=stand_in))
    with npu_profile(npu, tmp_path / "prof") as session:
        session.step()
        session.step()
    assert stand_in.seen["experimental"]["profiler_level"] == "Level1"
    assert stand_in.seen["experimental"]["export_type"] == "text"
    assert stand_in.seen["handler"] == dict(dir_name=str(tmp_path / "prof"), analyse_flag=True, async_mode=False)
    assert stand_in.seen["profile"]["activities"] == ["CPU", "NPU"] and stand_in.seen["steps"] == 2
    assert session.op_statistic is not None and session.op_statistic.name == "op_statistic.csv"
    assert session.kernel_details is not None and "op_statistic.csv, kernel_details.csv" in session.summary()


def test_a_level_0_profile_says_why_op_statistic_is_missing(tmp_path: Path) -> None:
    npu = TorchNpu(SimpleNamespace(profiler=StandInProfiler(("kernel_details.csv",))))
    with npu_profile(npu, tmp_path, level=0) as session:
        pass
    assert session.op_statistic is None
    assert "missing: op_statistic.csv" in session.summary() and "level 1 or 2" in session.summary()


def test_a_profile_that_wrote_nothing_says_where_it_looked(tmp_path: Path) -> None:
    npu = TorchNpu(SimpleNamespace(profiler=StandInProfiler(())))
    with npu_profile(npu, tmp_path) as session:
        pass
    assert session.outputs and "no CSV files" in session.summary()


def test_bad_profiler_level_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="profiler level must be 0, 1 or 2"):
        with npu_profile(TorchNpu(SimpleNamespace()), "unused", level=3):
            pass
