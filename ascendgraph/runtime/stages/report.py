"""Report stage: what an engine did, as a `Report` (ascendgraph.runtime.report).

`Engine.report()` reads the resolution, the device's stats, the served steps' counters, the
capture outcome and the first failure; the extensions add routing (batches per route, the
xlite settings) and the npugraph_ex stages (fused ops, kernels per step, static and super
kernels). The notes say what the planner knew when a capture failed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

import torch

from ascendgraph.compile.backend import CompiledModel
from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.compile.pass_manager import PassManager
from ascendgraph.compile.passes import fused_ops
from ascendgraph.config import GraphConfig
from ascendgraph.device import Device, KernelFallbacks
from ascendgraph.errors import CaptureError
from ascendgraph.models.presets import ModelSpec
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Resolution
from ascendgraph.runtime.options import EngineOptions
from ascendgraph.runtime.profiler import KernelCounter
from ascendgraph.runtime.report import Report, failure_notes
from ascendgraph.runtime.stages.serve import XliteSetup
from ascendgraph.runtime.stages.state import EngineState
from ascendgraph.runtime.workload import Scheduler

if TYPE_CHECKING:
    from ascendgraph.compile.static_kernel import StaticKernelStage
    from ascendgraph.compile.super_kernel import SuperKernelStage

__all__ = ["ReportStage", "KernelStages"]


@dataclass(frozen=True)
class KernelStages:
    """npugraph_ex's kernel stages of an engine (None when a stage is off or has no device support)."""

    static_kernels: Optional["StaticKernelStage"]
    super_kernel: Optional["SuperKernelStage"]
    kernel_counter: Optional[KernelCounter]


class ReportStage:
    """The run's report.

    Needs: the engine's state (reads all of it), the configuration, options, resolution and
    device, the model's spec, dtype and default gate, the number of requests and the scheduler,
    the capture state, the compiled model (compile time), the pass manager (fused ops),
    npugraph_ex's kernel stages, XliteGraph's setup (None when off) and whether the device has
    a virtual clock. Offers: `report`.
    """

    def __init__(
        self,
        *,
        state: EngineState,
        config: GraphConfig,
        options: EngineOptions,
        resolution: Resolution,
        device: Device,
        spec: ModelSpec,
        dtype: torch.dtype,
        atol: float,
        requests_total: int,
        scheduler: Scheduler,
        capture_state: CaptureState,
        compiled: CompiledModel,
        pass_manager: PassManager,
        kernel_stages: KernelStages,
        xlite: Optional[XliteSetup],
        has_clock: bool,
    ) -> None:
        self.state = state
        self.config = config
        self.options = options
        self.resolution = resolution
        self.device = device
        self.spec = spec
        self.dtype = dtype
        self.atol = atol
        self.requests_total = requests_total
        self.scheduler = scheduler
        self.capture_state = capture_state
        self.compiled = compiled
        self.pass_manager = pass_manager
        self.kernel_stages = kernel_stages
        self.xlite = xlite
        self.has_clock = has_clock

    def report(self) -> Report:
        """What the engine did so far, as a `Report`."""
        state, resolution = self.state, self.resolution
        stats = self.device.stats()
        counters = state.counters
        completed = len(self.scheduler.finished)
        failed = len(self.scheduler.failed)
        error_exc: Optional[BaseException] = state.error or state.first_mismatch
        error = {"type": type(error_exc).__name__, "message": str(error_exc)} if error_exc else None
        if error is None and failed:
            error = {"type": "RequestsFailed", "message": f"{failed} request(s) failed"}
        real, padded = counters.graphed_real_tokens, counters.graphed_padded_tokens
        has_clock = self.has_clock
        fallback = state.capture_fallback
        plan = resolution.stream_plan
        report = Report(
            requested_mode=resolution.requested_mode.name,
            effective_mode=state.mode.name,
            decisions=[d.as_dict() for d in state.decisions],
            capture_sizes=list(resolution.capture_sizes) if state.mode is not GraphMode.NONE else [],
            graphs_captured=self.capture_state.graphs_captured if fallback is None else 0,
            streams_used=stats.streams_in_use,
            stream_limit=plan.max_streams if plan is not None else stats.stream_limit,
            pool_bytes=stats.pool_bytes,
            capture_seconds=state.capture_seconds,
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
            device=self.device.name,
            model=self.spec.name,
            architecture=self.spec.architecture,
            num_layers=self.spec.num_hidden_layers,
            attention_backend=resolution.attention_backend,
            dtype=str(self.dtype).replace("torch.", ""),
            atol=self.atol,
            compile_seconds=self.compiled.compile_seconds,
            steps=counters.steps,
            requests_total=self.requests_total,
            warnings=list(resolution.warnings),
            capture_fallback={"type": type(fallback).__name__, "message": str(fallback)} if fallback else None,
            graphs_captured_before_failure=state.graphs_captured_before_failure,
            eager_checked_steps=counters.checked_steps,
            requested_mode_is_default=self.config.cudagraph_mode is None,
            notes=self._notes(error_exc or fallback),
            exception=error_exc,
        )
        report.extensions.update(self._route_extensions())
        report.extensions.update(self._npugraph_ex_extensions())
        if state.lenient:  # declared leniencies of the device (docs/simulator.md "Kernel contracts")
            report.extensions["lenient"] = "; ".join(state.lenient)
        # Kernel fallbacks of the device (npu: an op whose torch_npu kernel is missing ran its
        # reference formula or a composition): never silent, in the text and the JSON.
        device = self.device
        taken = dict(device.kernel_fallbacks()) if isinstance(device, KernelFallbacks) else {}
        report.extensions["kernel_fallbacks"] = taken
        report.warnings += [f"kernel fallback: ascendgraph::{op} ran without its torch_npu kernel ({why})"
                            for op, why in taken.items()]
        report.notes += failure_notes(report)
        return report

    def _npugraph_ex_extensions(self) -> dict[str, Any]:
        """Report.extensions of the passes and kernel stages: fused_ops, kernels_per_step,
        and the static / super kernel summaries when those stages ran."""
        stages = self.kernel_stages
        counter = stages.kernel_counter
        extensions: dict[str, Any] = {
            "fused_ops": fused_ops(self.pass_manager),
            "kernels_per_step": counter.per_step() if counter is not None else {"graph": None, "eager": None},
        }
        build = stages.static_kernels.build if stages.static_kernels is not None else None
        if build is not None:
            extensions["static_kernel"] = {
                "build_dir": str(build.directory), "kernels": len(build.kernels), "sizes": list(build.sizes),
                "reused": build.reused,
            }
        if stages.super_kernel is not None:
            extensions["super_kernel"] = {
                "graphs": stages.super_kernel.graphs_optimized, "super_kernels": stages.super_kernel.super_kernels,
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
        if self.xlite is not None:
            router, profile_run = self.xlite.router, self.xlite.profile_run
            extensions["xlite"] = {
                "enabled": True,
                "full_mode": router.full_mode,
                "budget": router.budget,
                "data_parallel_size": router.data_parallel_size,
                "profile_run": profile_run.as_dict() if profile_run else None,
            }
        extensions["batches_by_route"] = dict(self.state.batches_by_route)
        return extensions
