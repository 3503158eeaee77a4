"""Ascend-format profiles of a run: op_statistic.csv, kernel_details.csv, trace_view.json.

Theory of operation. `profile_run(engine, output_dir)` wraps an engine's capture and
serving. On the simulator it opens ``device.profiling(dir)`` (every executed kernel becomes
a `KernelRecord` on the virtual clock, and captures, replays, external-event waits and
task updates become trace spans) and marks where each served step's kernels start; on
exit it writes the three files into a torch_npu-shaped directory,

    <output_dir>/<host>_<pid>_<YYYYmmddHHMMSSmmm>_ascend_pt/ASCEND_PROFILER_OUTPUT/
        op_statistic.csv    one row per (OP Type, Core Type): count, total/avg/min/max, ratio
                            (kernels merged into a super kernel keep their type's row; the
                            launch adds a SuperKernel row)
        kernel_details.csv  one row per kernel launch, in launch order, each super kernel
                            followed by its merged kernels under the super kernel's name
        trace_view.json     Chrome trace events: one track per stream (Perfetto, chrome://tracing)

with exactly the columns of docs/semantics.md §13. Only the *served* path is profiled: the eager
reference the engine checks every step against runs on the same device but is left out
(``include_reference=True`` keeps it). The run directory is written under a temporary
name and renamed when complete, so a failure leaves no partial profile. On a real NPU the
engine's device delegates to torch_npu's profiler (`hw.profiler.npu_profile`), which writes
the same file names itself (its kernel_details.csv says "Block Num" where docs/semantics.md §13 says
"Block Dim"; `hw.profiler.KERNEL_DETAILS_ALIASES`).

`KernelCounter` is the engine observer behind the report's ``kernels_per_step``.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from ascendgraph.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.runtime.engine import Engine
    from ascendgraph.runtime.stages.records import StepRecord

__all__ = [
    "OP_STATISTIC_COLUMNS",
    "KERNEL_DETAILS_COLUMNS",
    "OUTPUT_SUBDIR",
    "RUN_DIR_SUFFIX",
    "accelerator_core",
    "ProfileOutput",
    "ProfileSession",
    "write_profile",
    "profile_run",
    "KernelCounter",
]

log = logging.getLogger(__name__)

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


# --------------------------------------------------------------------------- profiling a run


@dataclass
class _StepMarks:
    """Engine observer: which kernel records belong to which served step."""

    device: Any
    begin: int
    include_reference: bool
    marks: list[tuple[int, int, int, int]] = field(default_factory=list)  # (begin, served end, end, step)

    def on_step(self, engine: "Engine", record: "StepRecord") -> None:
        end = len(self.device.kernel_records)
        served_end = min(end, self.begin + record.graph_kernels)
        self.marks.append((self.begin, served_end, end, record.step))
        self.begin = end


@dataclass
class ProfileSession:
    """What `profile_run` yields; ``output`` is set when the profile was written (sim), and
    ``npu`` is torch_npu's profile handle on hardware."""

    output_dir: Path
    output: Optional[ProfileOutput] = None
    npu: Any = None
    write_error: Optional[str] = None  # the files could not be written (disk full, ...): the run failed

    def summary(self) -> dict[str, Any]:
        if self.write_error is not None:
            return {"dir": str(self.output_dir), "kernels": 0, "error": self.write_error}
        if self.output is not None:
            return self.output.as_dict()
        if self.npu is not None:
            return {"dir": str(self.output_dir), "torch_npu": self.npu.summary()}
        return {"dir": str(self.output_dir), "kernels": 0}


class _NpuStepper:
    def __init__(self, handle: Any) -> None:
        self.handle = handle

    def on_step(self, engine: "Engine", record: "StepRecord") -> None:
        self.handle.step()


@contextmanager
def profile_run(
    engine: "Engine", output_dir: Optional[Path | str], *, include_reference: bool = False
) -> Iterator[Optional[ProfileSession]]:
    """Profile what runs inside the block (capture and serving) into ``output_dir``; yields
    None (and does nothing) when ``output_dir`` is None."""
    if output_dir is None:
        yield None
        return
    device = engine.device
    session = ProfileSession(Path(output_dir))
    try:
        session.output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the profile directory {output_dir}: {exc.strerror or exc}; choose a writable --profile-dir",
            key="profile_dir",
        ) from None
    if getattr(device, "kernel_records", None) is None:  # a real NPU: torch_npu writes the files
        with device.profiling(str(output_dir)) as handle:
            session.npu = handle
            stepper = _NpuStepper(handle)
            engine.observers.append(stepper)
            try:
                yield session
            finally:
                engine.observers.remove(stepper)
        return
    marks = _StepMarks(device, len(device.kernel_records), include_reference)
    spans_begin = len(device.trace_spans)
    with device.profiling(str(output_dir)) as sim_session:
        engine.observers.append(marks)
        try:
            yield session
        finally:
            engine.observers.remove(marks)
    del sim_session  # its records are device.kernel_records[begin:], which the step marks index
    records: list[Any] = []
    steps: list[Optional[int]] = []
    for begin, served_end, end, step in marks.marks:
        chunk = device.kernel_records[begin : end if include_reference else served_end]
        records.extend(chunk)
        steps.extend([step] * len(chunk))
    names = getattr(device, "stream_names", None)
    streams = names() if names is not None else {}
    try:
        session.output = write_profile(
            output_dir, records, step_ids=steps, spans=device.trace_spans[spans_begin:], stream_names=streams,
            device_label=f"Ascend Hardware (ascendgraph simulator, {device.profile.name})",
        )
    except OSError as exc:  # a full or read-only disk after the run: the run's report stands, the run fails
        session.write_error = f"cannot write the profile to {output_dir}: {exc.strerror or exc}; nothing was written"
        log.error("%s", session.write_error)
        return
    log.info("profile written to %s (%d kernels, %d steps)", session.output.output_dir, len(records),
             session.output.steps)


# --------------------------------------------------------------------------- kernels per step


@dataclass
class KernelCounter:
    """Engine observer counting kernels per served step on each path (the report's
    ``kernels_per_step``: the mean over uniform-decode steps, or over all steps when there
    were none). The simulator keeps kernel records only while something reads them; this
    observer turns recording on and, when it was off before (the records are nobody
    else's), drops the records of finished steps unless a profile is being taken."""

    device: Any
    steps: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, graph kernels, eager kernels)
    check_eager: bool = True
    owns_records: bool = False  # recording was off before: the records are ours to drop

    @classmethod
    def attach(cls, engine: "Engine") -> Optional["KernelCounter"]:
        device = engine.device
        enable = getattr(device, "set_record_kernels", None)
        if enable is None:
            return None
        counter = cls(device, check_eager=engine.options.check_eager,
                      owns_records=not getattr(device, "records_kernels", False))
        enable(True)
        engine.observers.append(counter)
        return counter

    def on_step(self, engine: "Engine", record: "StepRecord") -> None:
        self.steps.append((record.kind, record.graph_kernels, record.eager_kernels))
        discard = getattr(self.device, "discard_kernel_records", None)
        if self.owns_records and discard is not None:
            discard()  # refused while a profiling session reads them

    def per_step(self) -> dict[str, Optional[float]]:
        if not self.steps:
            return {"graph": None, "eager": None}
        decode = [s for s in self.steps if s[0] == "decode"] or self.steps
        graph = sum(s[1] for s in decode) / len(decode)
        eager = sum(s[2] for s in decode) / len(decode) if self.check_eager else None
        return {"graph": round(graph, 2), "eager": None if eager is None else round(eager, 2)}
