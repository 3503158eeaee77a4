"""The Ascend profile formats: op_statistic.csv, kernel_details.csv, trace_view.json.

Theory of operation. `write_profile(output_dir, records, ...)` turns kernel records (objects
with the fields of the simulator's `KernelRecord`: name, op type, stream, start and duration on
the device's clock, shapes, dtypes, graph, block dim) and trace spans (captures, replays,
external-event waits, task updates) into a torch_npu-shaped directory,

    <output_dir>/<host>_<pid>_<YYYYmmddHHMMSSmmm>_ascend_pt/ASCEND_PROFILER_OUTPUT/
        op_statistic.csv    one row per (OP Type, Core Type): count, total/avg/min/max, ratio
                            (kernels merged into a super kernel keep their type's row; the
                            launch adds a SuperKernel row)
        kernel_details.csv  one row per kernel launch, in launch order, each super kernel
                            followed by its merged kernels under the super kernel's name
        trace_view.json     Chrome trace events: one track per stream (Perfetto, chrome://tracing)

with exactly the columns of docs/semantics.md §13. The run directory is written under a
temporary name and renamed when complete, so a failure leaves no partial profile. On a real NPU
torch_npu's profiler writes the same file names itself (its kernel_details.csv says "Block Num"
where docs/semantics.md §13 says "Block Dim"; `hw.profiler.KERNEL_DETAILS_ALIASES`).

This module sits below both the runtime (`ascendgraph.runtime.profiler.profile_run` profiles an
engine's run with it) and the backends (the torch_npu facade's profiler writes its files with
it): it imports nothing of either.
"""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

__all__ = [
    "OP_STATISTIC_COLUMNS",
    "KERNEL_DETAILS_COLUMNS",
    "OP_STATISTIC",
    "KERNEL_DETAILS",
    "TRACE_VIEW",
    "OUTPUT_SUBDIR",
    "RUN_DIR_SUFFIX",
    "accelerator_core",
    "ProfileOutput",
    "write_profile",
]


OP_STATISTIC_COLUMNS = (
    "Device_id", "OP Type", "Core Type", "Count", "Total Time(us)", "Avg Time(us)", "Min Time(us)",
    "Max Time(us)", "Ratio(%)",
)
KERNEL_DETAILS_COLUMNS = (
    "Step Id", "Device_id", "Name", "Type", "Accelerator Core", "Start Time(us)", "Duration(us)",
    "Wait Time(us)", "Block Dim", "Mix Block Dim", "Input Shapes", "Input Data Types", "Input Formats",
    "Output Shapes", "Output Data Types", "Output Formats",
)
OP_STATISTIC, KERNEL_DETAILS, TRACE_VIEW = "op_statistic.csv", "kernel_details.csv", "trace_view.json"
OUTPUT_SUBDIR = "ASCEND_PROFILER_OUTPUT"
RUN_DIR_SUFFIX = "_ascend_pt"

# Which cores a kernel type runs on (Accelerator Core / Core Type), first match wins.
_CORE_RULES: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (("SuperKernel",), "MIX_AIC", "a super kernel merges cube and vector kernels"),
    (("paged_attention", "attention"), "MIX_AIC", "attention: cube matmuls with vector softmax"),
    (("mm", "bmm", "matmul", "addmm", "baddbmm", "linear", "_int_mm", "einsum"), "AI_CORE", "matmuls run on the cube"),
)
_DEFAULT_CORE = "AI_VECTOR_CORE"
_MIX_VECTOR_PER_CUBE = 2  # vector cores paired with each cube core in a MIX kernel (A2/A3)
_DTYPE_NAMES = {
    "float32": "FLOAT", "float16": "FLOAT16", "bfloat16": "DT_BF16", "int8": "INT8", "uint8": "UINT8",
    "int32": "INT32", "int64": "INT64", "bool": "BOOL", "float64": "DOUBLE",
}
_STATIC_SUFFIX = "_static_kernel"


def accelerator_core(op_type: str) -> str:
    """AI_CORE (cube), AI_VECTOR_CORE or MIX_AIC for a kernel type (static kernels as their op)."""
    base = op_type[: -len(_STATIC_SUFFIX)] if op_type.endswith(_STATIC_SUFFIX) else op_type
    for types, core, _why in _CORE_RULES:
        if base in types:
            return core
    return _DEFAULT_CORE


def _shapes(shapes: Sequence[Sequence[int]]) -> str:
    return ";".join(",".join(str(d) for d in shape) for shape in shapes)


def _dtypes(dtypes: Sequence[str]) -> str:
    return ";".join(_DTYPE_NAMES.get(d, d.upper()) for d in dtypes)


def _us(value: float) -> str:
    return f"{value:.3f}"


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class ProfileOutput:
    """A written profile: its run directory and files, and what it holds."""

    run_dir: Path
    kernels: int
    steps: int
    spans: int

    @property
    def output_dir(self) -> Path:
        return self.run_dir / OUTPUT_SUBDIR

    @property
    def op_statistic(self) -> Path:
        return self.output_dir / OP_STATISTIC

    @property
    def kernel_details(self) -> Path:
        return self.output_dir / KERNEL_DETAILS

    @property
    def trace_view(self) -> Path:
        return self.output_dir / TRACE_VIEW

    def as_dict(self) -> dict[str, Any]:
        return {
            "dir": str(self.output_dir),
            "files": [str(p) for p in (self.op_statistic, self.kernel_details, self.trace_view)],
            "kernels": self.kernels,
            "steps": self.steps,
        }


def _op_statistic_rows(records: Sequence[Any], device_id: int) -> list[list[str]]:
    """One row per (OP Type, Core Type). A super-kernel launch counts in the SuperKernel row
    *and* each kernel merged into it in its own type's row (with its slice of the launch), so
    static kernels stay findable when merged; Ratio is over launched time, so the SuperKernel
    rows repeat time already in their members' rows."""
    groups: dict[tuple[str, str], list[float]] = {}
    grand_total = 0.0
    for record in records:
        groups.setdefault((record.op_type, accelerator_core(record.op_type)), []).append(record.duration_us)
        grand_total += record.duration_us
        for member in getattr(record, "members", ()):
            groups.setdefault((member.op_type, accelerator_core(member.op_type)), []).append(member.duration_us)
    grand_total = grand_total or 1.0
    rows = []
    for (op_type, core), durations in sorted(groups.items(), key=lambda item: (-sum(item[1]), item[0])):
        total = sum(durations)
        rows.append([
            str(device_id), op_type, core, str(len(durations)), _us(total), _us(total / len(durations)),
            _us(min(durations)), _us(max(durations)), f"{100.0 * total / grand_total:.2f}",
        ])
    return rows


def _kernel_details_rows(records: Sequence[Any], step_ids: Sequence[Optional[int]], device_id: int) -> list[list[str]]:
    rows = []
    last_end: dict[int, float] = {}
    expanded: list[tuple[Any, Optional[int]]] = []
    for record, step in zip(records, step_ids):
        expanded.append((record, step))
        expanded.extend((member, step) for member in getattr(record, "members", ()))
    for record, step in expanded:
        core = accelerator_core(record.op_type)
        block_dim = max(1, int(getattr(record, "block_dim", 0) or 1))
        previous = last_end.get(record.stream_id)
        wait = max(0.0, record.start_us - previous) if previous is not None else 0.0
        last_end[record.stream_id] = max(previous or 0.0, record.start_us + record.duration_us)
        rows.append([
            "" if step is None else str(step), str(device_id), record.name, record.op_type, core,
            _us(record.start_us), _us(record.duration_us), _us(wait), str(block_dim),
            str(block_dim * _MIX_VECTOR_PER_CUBE if core == "MIX_AIC" else 0),
            _shapes(record.input_shapes), _dtypes(record.input_dtypes), ";".join("ND" for _ in record.input_shapes),
            _shapes(record.output_shapes), _dtypes(record.output_dtypes), ";".join("ND" for _ in record.output_shapes),
        ])
    return rows


def _ns(value_us: float) -> int:
    return int(round(value_us * 1000.0))


def _event(name: str, cat: str, pid: int, tid: int, start_ns: int, end_ns: int, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid,
        "ts": start_ns / 1000.0, "dur": max(0, end_ns - start_ns) / 1000.0, "args": args,
    }


def _trace_events(
    records: Sequence[Any],
    step_ids: Sequence[Optional[int]],
    spans: Sequence[Any],
    stream_names: dict[int, str],
    device_label: str,
) -> list[dict[str, Any]]:
    device_pid, host_pid = 1, 2
    kernels = [(record, _ns(record.start_us), _ns(record.start_us + record.duration_us)) for record in records]
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": device_pid, "tid": 0, "args": {"name": device_label}},
        {"name": "process_sort_index", "ph": "M", "pid": device_pid, "tid": 0, "args": {"sort_index": 0}},
        {"name": "process_name", "ph": "M", "pid": host_pid, "tid": 0, "args": {"name": "Engine steps (host)"}},
        {"name": "process_sort_index", "ph": "M", "pid": host_pid, "tid": 0, "args": {"sort_index": 1}},
    ]
    streams = sorted({r.stream_id for r in records} | {s.stream_id for s in spans})
    for stream in streams:
        events.append({"name": "thread_name", "ph": "M", "pid": device_pid, "tid": stream,
                       "args": {"name": stream_names.get(stream, f"stream {stream}")}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": device_pid, "tid": stream,
                       "args": {"sort_index": stream}})
    for span in spans:
        start, end = _ns(span.start_us), _ns(span.start_us + span.duration_us)
        if span.kind == "replay":  # contain its kernels exactly, whatever the rounding
            inside = [(s, e) for r, s, e in kernels
                      if r.graph == span.graph and r.stream_id == span.stream_id and start <= s <= end]
            if inside:
                start, end = min(start, min(s for s, _ in inside)), max(end, max(e for _, e in inside))
        events.append(_event(span.name, span.kind, device_pid, span.stream_id, start, end,
                             {"graph": span.graph, "kind": span.kind}))
    for (record, start, end), step in zip(kernels, step_ids):
        args: dict[str, Any] = {
            "Type": record.op_type, "Accelerator Core": accelerator_core(record.op_type),
            "Block Dim": max(1, int(getattr(record, "block_dim", 0) or 1)),
            "Input Shapes": _shapes(record.input_shapes), "Output Shapes": _shapes(record.output_shapes),
            "graph": record.graph, "Step Id": step,
        }
        parts = getattr(record, "parts", ())
        if parts:
            args["merged kernels"] = list(parts)
        events.append(_event(record.name, "kernel", device_pid, record.stream_id, start, end, args))
    by_step: dict[int, list[tuple[int, int]]] = {}
    for (_record, start, end), step in zip(kernels, step_ids):
        if step is not None:
            by_step.setdefault(step, []).append((start, end))
    for step, bounds in sorted(by_step.items()):
        events.append(_event(f"step {step}", "step", host_pid, 0, min(s for s, _ in bounds), max(e for _, e in bounds),
                             {"kernels": len(bounds)}))
    return events


def _csv_text(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows(rows)
    return buffer.getvalue()


def _run_dir_name(worker: Optional[str]) -> str:
    now = time.time()
    stamp = time.strftime("%Y%m%d%H%M%S", time.localtime(now)) + f"{int(now * 1000) % 1000:03d}"
    return f"{worker or socket.gethostname()}_{os.getpid()}_{stamp}{RUN_DIR_SUFFIX}"


def write_profile(
    output_dir: Path | str,
    records: Sequence[Any],
    *,
    step_ids: Optional[Sequence[Optional[int]]] = None,
    spans: Sequence[Any] = (),
    stream_names: Optional[dict[int, str]] = None,
    device_id: int = 0,
    device_label: str = "Ascend Hardware (ascendgraph simulator)",
    worker: Optional[str] = None,
) -> ProfileOutput:
    """Write op_statistic.csv, kernel_details.csv and trace_view.json for ``records`` (objects
    with KernelRecord's fields) into a new run directory under ``output_dir``; all or nothing."""
    steps = list(step_ids) if step_ids is not None else [None] * len(records)
    if len(steps) != len(records):
        raise ValueError(f"step_ids has {len(steps)} entries for {len(records)} kernel records")
    root = Path(output_dir)
    root.mkdir(parents=True, exist_ok=True)
    run_dir = root / _run_dir_name(worker)
    staging = Path(tempfile.mkdtemp(prefix=".ascendgraph-profile-", dir=root))
    try:
        out = staging / OUTPUT_SUBDIR
        out.mkdir()
        (out / OP_STATISTIC).write_text(_csv_text(OP_STATISTIC_COLUMNS, _op_statistic_rows(records, device_id)))
        (out / KERNEL_DETAILS).write_text(
            _csv_text(KERNEL_DETAILS_COLUMNS, _kernel_details_rows(records, steps, device_id))
        )
        trace = {
            "traceEvents": _trace_events(records, steps, spans, stream_names or {}, device_label),
            "displayTimeUnit": "ns",
            "otherData": {"clock": "ascendgraph simulator virtual clock (us)", "kernels": len(records)},
        }
        (out / TRACE_VIEW).write_text(json.dumps(trace))
        os.replace(staging, run_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    distinct_steps = len({s for s in steps if s is not None})
    return ProfileOutput(run_dir=run_dir, kernels=len(records), steps=distinct_steps, spans=len(spans))
