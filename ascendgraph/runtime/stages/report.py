"""Report stage: what an engine did, as a `Report` (ascendgraph.runtime.report).

`Engine.report()` reads the resolution, the device's stats, the served steps' counters, the
capture outcome and the first failure; the extensions add routing (batches per route, the
xlite settings) and the npugraph_ex stages (fused ops, kernels per step, static and super
kernels). The notes say what the planner knew when a capture failed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from ascendgraph.compile.backend import CompiledModel
from ascendgraph.compile.pass_manager import PassManager
from ascendgraph.compile.passes import fused_ops
from ascendgraph.config import GraphConfig
from ascendgraph.device import Device
from ascendgraph.errors import CaptureError, NumericalMismatch
from ascendgraph.models.presets import ModelSpec
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Decision, Resolution
from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.runtime.report import Report, failure_notes
from ascendgraph.runtime.stages.records import Counters
from ascendgraph.runtime.workload import Request, Scheduler
from ascendgraph.xlite import XliteProfileRun, XliteRouter

if TYPE_CHECKING:
    from ascendgraph.compile.static_kernel import StaticKernelStage
    from ascendgraph.compile.super_kernel import SuperKernelStage
    from ascendgraph.runtime.engine import EngineOptions
    from ascendgraph.runtime.profiler import KernelCounter

__all__ = ["ReportStage"]


class ReportStage:
    """The run's report (a part of `Engine`, readable on its own)."""

    config: GraphConfig
    options: "EngineOptions"
    resolution: Resolution
    decisions: list[Decision]
    device: Device
    mode: GraphMode
    spec: ModelSpec
    dtype: torch.dtype
    atol: float
    requests: list[Request]
    scheduler: Scheduler
    capture_state: CaptureState
    compiled: CompiledModel
    pass_manager: PassManager
    capture_seconds: float
    capture_fallback: Optional[BaseException]
    graphs_captured_before_failure: Optional[int]
    error: Optional[BaseException]
    first_mismatch: Optional[NumericalMismatch]
    batches_by_route: dict[str, int]
    lenient: list[str]
    xlite_router: Optional[XliteRouter]
    xlite_profile_run: Optional[XliteProfileRun]
    static_kernels: Optional["StaticKernelStage"]
    super_kernel: Optional["SuperKernelStage"]
    kernel_counter: Optional["KernelCounter"]
    _counters: Counters
    _has_clock: bool

    def report(self) -> Report:
        resolution = self.resolution
        stats = self.device.stats()
        counters = self._counters
        completed = len(self.scheduler.finished)
        failed = len(self.scheduler.failed)
        error_exc: Optional[BaseException] = self.error or self.first_mismatch
        error = {"type": type(error_exc).__name__, "message": str(error_exc)} if error_exc else None
        if error is None and failed:
            error = {"type": "RequestsFailed", "message": f"{failed} request(s) failed"}
        real, padded = counters.graphed_real_tokens, counters.graphed_padded_tokens
        has_clock = self._has_clock
        fallback = self.capture_fallback
        plan = resolution.stream_plan
        report = Report(
            requested_mode=resolution.requested_mode.name,
            effective_mode=self.mode.name,
            decisions=[d.as_dict() for d in self.decisions],
            capture_sizes=list(resolution.capture_sizes) if self.mode is not GraphMode.NONE else [],
            graphs_captured=self.capture_state.graphs_captured if fallback is None else 0,
            streams_used=stats.streams_in_use,
            stream_limit=plan.max_streams if plan is not None else stats.stream_limit,
            pool_bytes=stats.pool_bytes,
            capture_seconds=self.capture_seconds,
            requests_completed=completed,
            requests_failed=failed,
            batches_by_mode=dict(counters.batches_by_mode),
            padding_waste=(padded / real - 1) if real else 0.0,
            max_abs_diff_vs_eager=counters.max_abs_diff,
            simulated_time_us={
                "graph": counters.graph_time_us if has_clock else None,
                "eager": counters.eager_time_us if has_clock and self.options.check_eager else None,
            },
            error=error,
            device=getattr(self.device, "name", str(self.device)),
            model=self.spec.name,
            architecture=self.spec.architecture,
            num_layers=self.spec.num_hidden_layers,
            attention_backend=resolution.attention_backend,
            dtype=str(self.dtype).replace("torch.", ""),
            atol=self.atol,
            compile_seconds=self.compiled.compile_seconds,
            steps=counters.steps,
            requests_total=len(self.requests),
            warnings=list(resolution.warnings),
            capture_fallback={"type": type(fallback).__name__, "message": str(fallback)} if fallback else None,
            graphs_captured_before_failure=self.graphs_captured_before_failure,
            eager_checked_steps=counters.checked_steps,
            requested_mode_is_default=self.config.cudagraph_mode is None,
            notes=self._notes(error_exc or fallback),
            exception=error_exc,
        )
        report.extensions.update(self._route_extensions())
        report.extensions.update(self._npugraph_ex_extensions())
        if self.lenient:  # declared leniencies of the device (docs/simulator.md "Kernel contracts")
            report.extensions["lenient"] = "; ".join(self.lenient)
        # Kernel fallbacks of the device (npu: an op whose torch_npu kernel is missing ran its
        # reference formula or a composition): never silent, in the text and the JSON.
        fallbacks = getattr(self.device, "kernel_fallbacks", None)
        taken = dict(fallbacks()) if callable(fallbacks) else {}
        report.extensions["kernel_fallbacks"] = taken
        report.warnings += [f"kernel fallback: ascendgraph::{op} ran without its torch_npu kernel ({why})"
                            for op, why in taken.items()]
        report.notes += failure_notes(report)
        return report

    def _npugraph_ex_extensions(self) -> dict[str, Any]:
        """Report.extensions of the passes and kernel stages: fused_ops, kernels_per_step,
        and the static / super kernel summaries when those stages ran."""
        counter = self.kernel_counter
        extensions: dict[str, Any] = {
            "fused_ops": fused_ops(self.pass_manager),
            "kernels_per_step": counter.per_step() if counter is not None else {"graph": None, "eager": None},
        }
        build = self.static_kernels.build if self.static_kernels is not None else None
        if build is not None:
            extensions["static_kernel"] = {
                "build_dir": str(build.directory), "kernels": len(build.kernels), "sizes": list(build.sizes),
                "reused": build.reused,
            }
        if self.super_kernel is not None:
            extensions["super_kernel"] = {
                "graphs": self.super_kernel.graphs_optimized, "super_kernels": self.super_kernel.super_kernels,
            }
        return extensions

    def _notes(self, failure: Optional[BaseException]) -> list[str]:
        """What the planner knew when a capture failed (docs/semantics.md §8: beyond vLLM Ascend)."""
        notes = []
        if isinstance(failure, CaptureError):
            parts = []
            if failure.graphs_captured is not None:
                parts.append(f"{failure.graphs_captured} graphs were captured before the failure")
            if failure.streams_in_use is not None and failure.stream_budget is not None:
                parts.append(f"streams in use {failure.streams_in_use}/{failure.stream_budget}")
            if parts:
                notes.append("; ".join(parts))
            plan = self.resolution.stream_plan
            if plan is not None and not plan.fits and plan.max_num_sizes == 0:
                notes.append(plan.warnings[-1] if plan.warnings else "not even one capture size fits the stream budget")
            elif plan is not None and not plan.fits:
                notes.append(
                    f"the stream plan fits at most {plan.max_num_sizes} of the {len(plan.requested_sizes)} capture sizes "
                    f"({plan.streams_per_size} streams per size, budget {plan.max_streams}); largest fitting "
                    f"selection: {plan.sizes} — see `ascendgraph explain` with the same flags"
                )
        return notes

    def _route_extensions(self) -> dict[str, Any]:
        """Report.extensions of routing: batches_by_route always; the xlite settings when on."""
        extensions: dict[str, Any] = {}
        router = self.xlite_router
        if router is not None:
            extensions["xlite"] = {
                "enabled": True,
                "full_mode": router.full_mode,
                "budget": router.budget,
                "data_parallel_size": router.data_parallel_size,
                "profile_run": self.xlite_profile_run.as_dict() if self.xlite_profile_run else None,
            }
        extensions["batches_by_route"] = dict(self.batches_by_route)
        return extensions
