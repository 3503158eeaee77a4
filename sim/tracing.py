"""The simulator's kernel log and trace (what a profiler turns into CSV rows and a timeline),
and the static / super kernel hooks that change what the log shows.

`TracingMixin` is part of `sim.device.SimDevice`: it keeps a `KernelRecord` per executed
task and a `TraceSpan` per capture, replay, wait and task update while profiling (or when
``record_kernels`` is on), and prices eager ops on the virtual clock.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Iterator, Mapping, NamedTuple, Optional, cast

import torch

from ascendgraph.errors import CaptureConstraintError, ConfigError
from sim.graph import CAPTURED, ReplayRun, SimGraph
from sim.recorder import EagerTracker

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice
    from sim.streams import SimStream

__all__ = ["KernelRecord", "TraceSpan", "SimProfileSession", "TracingMixin", "SUPER_KERNEL_OPTION_KEYS"]

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
    """What ``device.profile(...)`` yields: the kernel records of the profiled region."""

    def __init__(self, device: "SimDevice", output_dir: str, start: int, options: dict[str, Any]) -> None:
        self.device = device
        self.output_dir = output_dir
        self.options = options
        self._start = start
        self._stop: Optional[int] = None

    @property
    def records(self) -> list[KernelRecord]:
        return self.device.kernel_records[self._start : self._stop]



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


if TYPE_CHECKING:  # the type checker reads the mixin as a part of SimDevice (sim.device_parts)
    from sim.device_parts import DeviceParts as _Parts
else:
    _Parts = object


class TracingMixin(_Parts):
    """Kernel log, trace spans, eager pricing, profiling sessions, static and super kernels."""

    def _mark_replay(self, run: ReplayRun, stream: SimStream, start: float) -> None:
        """Trace: note a replay's first kernel; close the wait a resumed replay sat in."""
        mark = self._replay_marks.get(id(run))
        if mark is None:
            self._replay_marks[id(run)] = (start, None, "")
        elif mark[1] is not None:
            self.trace_spans.append(
                TraceSpan("wait", f"wait {mark[2]}", stream.stream_id, mark[1], start - mark[1], run.graph.name)
            )
            self._replay_marks[id(run)] = (mark[0], None, "")

    def _end_replay_part(self, run: ReplayRun, stream: SimStream, finished: bool) -> None:
        mark = self._replay_marks.get(id(run))
        if mark is None:
            return
        if finished:
            del self._replay_marks[id(run)]
            self.trace_spans.append(
                TraceSpan("replay", f"replay {run.graph.name}", stream.stream_id, mark[0], self._device_us - mark[0],
                          run.graph.name)
            )
        else:
            self._replay_marks[id(run)] = (mark[0], self._device_us, str(run.waiting_on))

    def _log_tasks(self, tasks: list, start: float, stream_id: int, graph: Optional[str]) -> None:
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

    def _charge_eager(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        outputs = out if isinstance(out, (tuple, list)) else [out]
        task = self.cost.task(func, args, kwargs, [o for o in outputs if isinstance(o, torch.Tensor)])
        self._host_us += self.cost.params.host_launch_us
        start = max(self._device_us, self._host_us)
        self._device_us = start + task.duration_us
        if self._profiling:
            self._log_tasks([task], start, self._current().stream_id, None)

    @contextmanager
    def track_eager(self) -> Iterator[None]:
        """Charge the eager ops issued in the block to the virtual clock (and the kernel
        log while profiling). Outside it eager ops are free: nothing intercepts them."""
        self._check_alive()
        with self.kernel_policy(), EagerTracker(cast("SimDevice", self)):  # a part of SimDevice (sim.device_parts)
            yield

    @contextmanager
    def profiling(self, output_dir: str, **options: Any) -> Iterator[SimProfileSession]:
        """Keep a KernelRecord per task executed in the block (replayed or tracked eager).
        Writing op_statistic.csv / kernel_details.csv from them is the profiler's job.

        (The Device protocol names this ``profile(...)``, which the ``profile`` attribute —
        the DeviceProfile — shadows on every device; hence the different name.)"""
        session = SimProfileSession(cast("SimDevice", self), output_dir, len(self.kernel_records), options)
        previous = self._profiling
        self._profiling = True
        self._sessions += 1
        try:
            yield session
        finally:
            self._sessions -= 1
            self._profiling = previous
            session._stop = len(self.kernel_records)
    def stream_names(self) -> dict[int, str]:
        """Stream id -> name of every stream of the device (profile track names)."""
        return {stream.stream_id: stream.name for stream in self._streams}

    @property
    def records_kernels(self) -> bool:
        """Whether executed tasks are kept as KernelRecords right now."""
        return self._profiling

    def set_record_kernels(self, enabled: bool = True) -> None:
        """Keep (or stop keeping) a KernelRecord per executed task outside profiling() too."""
        self._profiling = bool(enabled) or self._sessions > 0

    def discard_kernel_records(self) -> bool:
        """Drop the kernel records and trace spans kept so far — unless a profiling() session
        is open (its records are indexes into them). Returns whether they were dropped."""
        if self._sessions:
            return False
        del self.kernel_records[:]
        del self.trace_spans[:]
        self._replay_marks.clear()
        return True

    # ------------------------------------------------------------------ static and super kernels
    def install_static_kernels(self, kernels: Mapping[tuple, str]) -> None:
        """Make fixed-shape kernels available (a static-kernel build: signature -> kernel id,
        see `sim.cost.task_signature`). Graphs captured from now on run a task whose signature
        is installed as that static kernel; earlier captures keep the kernels they had."""
        self.cost.static_kernels.update(kernels)

    @property
    def static_kernels(self) -> dict[tuple, str]:
        return dict(self.cost.static_kernels)

    @contextmanager
    def super_kernel_scope(self, scope_name: Optional[str] = None) -> Iterator[None]:
        """torch_npu's ``super_kernel_scope_begin/end`` around a captured region. The
        simulator notes the scope on the capture (``graph.info()["super_kernel_scopes"]``);
        `super_kernel_optimize` merges runs of static kernels whether or not a scope was open."""
        if scope_name is not None and (not isinstance(scope_name, str) or not scope_name.strip()):
            raise RuntimeError("scope_name should be None or a non-empty string.")
        capture = self._capture
        if capture is not None:
            capture.super_kernel_scopes.append(scope_name or "")
        yield

    def super_kernel_optimize(self, graph: SimGraph, optimize_options: Optional[dict[str, Any]] = None) -> int:
        """Merge each run of two or more consecutive static kernels of a captured graph into one
        super kernel (torch_npu's ``NPUGraph.super_kernel_optimize``; only fixed-shape binaries
        can be fused, and a graph event wait ends a run). Returns how many super kernels."""
        self._check_alive()
        if not isinstance(graph, SimGraph) or graph.device is not self:
            raise ConfigError(f"{graph!r} is not a graph of this device; use device.new_graph()", key="graph")
        if optimize_options is not None:
            if not isinstance(optimize_options, dict):
                raise TypeError("optimize_options param must be dict or None.")
            for key in optimize_options:
                if key not in SUPER_KERNEL_OPTION_KEYS:
                    raise ValueError(f"Invalid optimize_options param key: '{key}'.")
        if graph.state != CAPTURED or graph.program is None:
            raise CaptureConstraintError(
                f"super_kernel_optimize needs a captured graph; {graph.name} is {graph.state} (optimise after capture_end)"
            )
        from sim.cost import STATIC_KERNEL_TAG

        return graph.program.merge_runs(
            lambda task: task.op_type.endswith(STATIC_KERNEL_TAG), f"super_kernel_{graph.name.replace('#', '')}"
        )

