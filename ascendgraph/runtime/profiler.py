"""Profiling an engine's run in the Ascend formats, and counting kernels per step.

Theory of operation. `profile_run(engine, output_dir)` wraps an engine's capture and serving.
On a device with a kernel log (`ascendgraph.device.KernelLog`, the simulator) it opens
``device.profiling(dir)`` (every executed kernel becomes a record on the virtual clock, and
captures, replays, external-event waits and task updates become trace spans) and marks where
each served step's kernels start; on exit it writes op_statistic.csv, kernel_details.csv and
trace_view.json with `ascendgraph.profile_formats.write_profile`. Only the *served* path is
profiled: the eager reference the engine checks every step against runs on the same device but
is left out (``include_reference=True`` keeps it). On a real NPU the device delegates to
torch_npu's profiler (`hw.profiler.npu_profile`), which writes the same file names itself.

`KernelCounter` is the engine observer behind the report's ``kernels_per_step``.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional, Protocol

from ascendgraph.device import Device, KernelLog
from ascendgraph.errors import ConfigError
from ascendgraph.profile_formats import (
    KERNEL_DETAILS,
    KERNEL_DETAILS_COLUMNS,
    OP_STATISTIC,
    OP_STATISTIC_COLUMNS,
    OUTPUT_SUBDIR,
    RUN_DIR_SUFFIX,
    TRACE_VIEW,
    ProfileOutput,
    accelerator_core,
    write_profile,
)
from ascendgraph.runtime.stages.records import StepObserver, StepRecord

__all__ = [
    # the formats, re-exported from ascendgraph.profile_formats
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
    # profiling a run
    "ProfiledEngine",
    "ProfileSession",
    "profile_run",
    "KernelCounter",
]

log = logging.getLogger(__name__)


class ProfiledEngine(Protocol):
    """What `profile_run` needs of an engine (`ascendgraph.runtime.engine.Engine` has it)."""

    device: Device
    observers: list[StepObserver]


# --------------------------------------------------------------------------- profiling a run


@dataclass
class _StepMarks:
    """Engine observer: which kernel records belong to which served step."""

    device: KernelLog
    begin: int
    include_reference: bool
    marks: list[tuple[int, int, int, int]] = field(default_factory=list)  # (begin, served end, end, step)

    def on_step(self, engine: Any, record: StepRecord) -> None:
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

    def on_step(self, engine: Any, record: StepRecord) -> None:
        self.handle.step()


@contextmanager
def profile_run(
    engine: ProfiledEngine, output_dir: Optional[Path | str], *, include_reference: bool = False
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
    if not isinstance(device, KernelLog):  # a real NPU: torch_npu writes the files
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
    try:
        session.output = write_profile(
            output_dir, records, step_ids=steps, spans=device.trace_spans[spans_begin:],
            stream_names=device.stream_names(),
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

    device: Optional[KernelLog]
    steps: list[tuple[str, int, int]] = field(default_factory=list)  # (kind, graph kernels, eager kernels)
    check_eager: bool = True
    owns_records: bool = False  # recording was off before: the records are ours to drop

    @classmethod
    def attach(cls, device: Device, observers: list[StepObserver], *, check_eager: bool) -> Optional["KernelCounter"]:
        """A counter observing a run on ``device`` (appended to ``observers``); None when the
        device keeps no kernel log."""
        if not isinstance(device, KernelLog):
            return None
        counter = cls(device, check_eager=check_eager, owns_records=not device.records_kernels)
        device.set_record_kernels(True)
        observers.append(counter)
        return counter

    def on_step(self, engine: Any, record: StepRecord) -> None:
        self.steps.append((record.kind, record.graph_kernels, record.eager_kernels))
        if self.owns_records and self.device is not None:
            self.device.discard_kernel_records()  # refused while a profiling session reads them

    def per_step(self) -> dict[str, Optional[float]]:
        if not self.steps:
            return {"graph": None, "eager": None}
        decode = [s for s in self.steps if s[0] == "decode"] or self.steps
        graph = sum(s[1] for s in decode) / len(decode)
        eager = sum(s[2] for s in decode) / len(decode) if self.check_eager else None
        return {"graph": round(graph, 2), "eager": None if eager is None else round(eager, 2)}
