"""The simulator's kernel log and trace (what a profiler turns into CSV rows and a timeline),
and the super-kernel optimisation that changes what the log shows.

Theory of operation. `Trace` (``device.trace``) keeps, while recording is on (a profiling
session is open, or ``record_kernels``), a `KernelRecord` per task the device executes — each
replayed task, each eager kernel the device prices under ``track_eager`` — on the virtual clock
(`sim.clock`), and a `TraceSpan` per capture, replay, wait and task update. A replay's span runs
from its first kernel to its last; a replay suspended at an ExternalEvent gets a "wait" span
until the event's record released it. Recording is off by default, so long runs keep nothing.

`merge_super_kernels` is torch_npu's ``NPUGraph.super_kernel_optimize`` on the simulator: runs
of consecutive static kernels of a captured graph become one launch in the log and on the
clock (the calls still run one by one).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, NamedTuple, Optional

from ascendgraph.errors import CaptureConstraintError
from sim.clock import VirtualClock
from sim.graph import CAPTURED, ReplayRun, SimGraph

if TYPE_CHECKING:  # pragma: no cover
    from sim.streams import SimStream

__all__ = [
    "KernelRecord",
    "TraceSpan",
    "SimProfileSession",
    "Trace",
    "SUPER_KERNEL_OPTION_KEYS",
    "check_super_kernel_options",
    "merge_super_kernels",
]

# torch_npu's NPUGraph.super_kernel_optimize(optimize_options=...) keys (2.13); accepted, not modelled.
SUPER_KERNEL_OPTION_KEYS = frozenset({
    "preload_code", "split_mode", "stream_fusion", "constant_codegen", "auto_op_parallel", "opt_extend",
    "dcci_before_kernel_start", "dcci_after_kernel_end", "dcci_disable_on_kernel", "aggressive_opt_strategies",
    "ubuf_lock_ignore_kernel", "early_start",
})


class KernelRecord(NamedTuple):
    """One executed task on the virtual clock (what a profiler turns into CSV rows).

    ``graph`` is the graph's name for replayed tasks and None for eager ops.
    """

    name: str
    op_type: str
    stream_id: int
    start_us: float
    duration_us: float
    input_shapes: tuple
    input_dtypes: tuple
    output_shapes: tuple
    output_dtypes: tuple
    graph: Optional[str]
    flops: float
    bytes: float
    block_dim: int = 0  # cores the kernel launched on (a super kernel: the largest of its parts)
    parts: tuple = ()  # a super kernel: names of the kernels merged into it
    # A super kernel: a KernelRecord per merged kernel, each named after the super kernel and
    # given its slice of the launch (in proportion to what it would take alone).
    members: tuple = ()


class TraceSpan(NamedTuple):
    """A device activity that is not a kernel, on the virtual clock (kept while profiling).

    ``kind``: "capture" (a graph recorded on its capture stream), "replay" (a graph's
    launch to its last kernel, on the replaying stream — its kernels lie inside), "wait"
    (a replay suspended at an ExternalEvent until the event was recorded) or
    "task_update" (a task group's kernels re-issued on the update stream).
    """

    kind: str
    name: str
    stream_id: int
    start_us: float
    duration_us: float
    graph: Optional[str]



class SimProfileSession:
    """What ``device.profiling(...)`` yields: the kernel records of the profiled region."""

    def __init__(self, trace: "Trace", output_dir: str, start: int, options: dict[str, Any]) -> None:
        self.trace = trace
        self.output_dir = output_dir
        self.options = options
        self._start = start
        self._stop: Optional[int] = None

    @property
    def records(self) -> list[KernelRecord]:
        return self.trace.kernel_records[self._start : self._stop]



def _member_records(task: Any, start: float, stream_id: int, graph: Optional[str]) -> tuple[KernelRecord, ...]:
    """The merged kernels of a super-kernel launch, named after it, sharing its duration."""
    alone = sum(member.duration_us for member in task.members) or 1.0
    records = []
    clock = start
    for member in task.members:
        share = task.duration_us * member.duration_us / alone
        records.append(
            KernelRecord(
                task.name, member.op_type, stream_id, clock, share, member.input_shapes, member.input_dtypes,
                member.output_shapes, member.output_dtypes, graph, member.flops, member.bytes, member.block_dim,
            )
        )
        clock += share
    return tuple(records)


class Trace:
    """``device.trace``: the kernel log and trace spans (module docstring)."""

    def __init__(self, clock: VirtualClock, *, record: bool = False) -> None:
        self.clock = clock
        self.kernel_records: list[KernelRecord] = []
        self.trace_spans: list[TraceSpan] = []
        self._sessions = 0  # open profiling() sessions
        self.recording = bool(record)
        self._replay_marks: dict[int, tuple[float, Optional[float], str]] = {}  # id(run) -> (start, wait start, event)

    # -- switches
    def set_recording(self, enabled: bool = True) -> None:
        """Keep (or stop keeping) a KernelRecord per executed task outside profiling() too."""
        self.recording = bool(enabled) or self._sessions > 0

    def discard(self) -> bool:
        """Drop the kernel records and trace spans kept so far — unless a profiling() session
        is open (its records are indexes into them). Returns whether they were dropped."""
        if self._sessions:
            return False
        del self.kernel_records[:]
        del self.trace_spans[:]
        self._replay_marks.clear()
        return True

    @contextmanager
    def profiling(self, output_dir: str, **options: Any) -> Iterator[SimProfileSession]:
        """Keep a KernelRecord per task executed in the block."""
        session = SimProfileSession(self, output_dir, len(self.kernel_records), options)
        previous = self.recording
        self.recording = True
        self._sessions += 1
        try:
            yield session
        finally:
            self._sessions -= 1
            self.recording = previous
            session._stop = len(self.kernel_records)

    # -- what the device reports
    def span(self, kind: str, name: str, stream_id: int, start_us: float, duration_us: float,
             graph: Optional[str]) -> None:
        if self.recording:
            self.trace_spans.append(TraceSpan(kind, name, stream_id, start_us, duration_us, graph))

    def log_tasks(self, tasks: list, start: float, stream_id: int, graph: Optional[str]) -> None:
        clock = start
        append = self.kernel_records.append
        for task in tasks:
            members = _member_records(task, clock, stream_id, graph) if task.members else ()
            append(
                KernelRecord(
                    task.name, task.op_type, stream_id, clock, task.duration_us, task.input_shapes,
                    task.input_dtypes, task.output_shapes, task.output_dtypes, graph, task.flops, task.bytes,
                    task.block_dim, task.parts, members,
                )
            )
            clock += task.duration_us

    def mark_replay(self, run: ReplayRun, stream: "SimStream", start: float) -> None:
        """Note a replay's first kernel; close the wait a resumed replay sat in."""
        mark = self._replay_marks.get(id(run))
        if mark is None:
            self._replay_marks[id(run)] = (start, None, "")
        elif mark[1] is not None:
            self.trace_spans.append(
                TraceSpan("wait", f"wait {mark[2]}", stream.stream_id, mark[1], start - mark[1], run.graph.name)
            )
            self._replay_marks[id(run)] = (mark[0], None, "")

    def end_replay_part(self, run: ReplayRun, stream: "SimStream", finished: bool) -> None:
        mark = self._replay_marks.get(id(run))
        if mark is None:
            return
        device_us = self.clock.device_us
        if finished:
            del self._replay_marks[id(run)]
            self.trace_spans.append(
                TraceSpan("replay", f"replay {run.graph.name}", stream.stream_id, mark[0], device_us - mark[0],
                          run.graph.name)
            )
        else:
            self._replay_marks[id(run)] = (mark[0], device_us, str(run.waiting_on))

    def charge_eager(self, task: Any, host_launch_us: float, stream_id: int) -> None:
        """An eager kernel priced on the clock (``track_eager``), logged while recording."""
        self.clock.host_spends(host_launch_us)
        start = self.clock.device_runs(self.clock.host_us, task.duration_us)
        if self.recording:
            self.log_tasks([task], start, stream_id, None)


def check_super_kernel_options(optimize_options: Optional[dict[str, Any]]) -> None:
    """torch_npu's checks of ``optimize_options`` (its texts)."""
    if optimize_options is None:
        return
    if not isinstance(optimize_options, dict):
        raise TypeError("optimize_options param must be dict or None.")
    for key in optimize_options:
        if key not in SUPER_KERNEL_OPTION_KEYS:
            raise ValueError(f"Invalid optimize_options param key: '{key}'.")


def merge_super_kernels(graph: SimGraph) -> int:
    """Merge each run of two or more consecutive static kernels of a captured graph into one
    super kernel (only fixed-shape binaries can be fused; a graph event wait ends a run).
    Returns how many super kernels."""
    if graph.state != CAPTURED or graph.program is None:
        raise CaptureConstraintError(
            f"super_kernel_optimize needs a captured graph; {graph.name} is {graph.state} (optimise after capture_end)"
        )
    from sim.cost import STATIC_KERNEL_TAG

    return graph.program.merge_runs(
        lambda task: task.op_type.endswith(STATIC_KERNEL_TAG), f"super_kernel_{graph.name.replace('#', '')}"
    )
