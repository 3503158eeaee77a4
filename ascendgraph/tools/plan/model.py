"""The plan itself: streams, the two size selections (even vs workload-aware) within a budget,
and their predicted cost (`make_plan` -> `PlanResult`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Resolution, resolve
from ascendgraph.sizes import DEFAULT_MAX_STREAMS, StreamPlan, pad_sorted, sample_sizes, select_sizes
from ascendgraph.tools.plan.measure_cache import cached
from ascendgraph.tools.plan.workload import (
    DEFAULT_REQUESTS,
    Workload,
    check_workload_fits,
    generated_workload,
)
from ascendgraph.tools.plan.measure import (
    DEFAULT_SAMPLE_SIZES,
    Measurement,
    Prediction,
    dispatcher_for,
    measure_capture,
)

__all__ = [
    "MEASURE_METHODS", "PlanResult", "Selection", "StreamFailure", "default_budget", "graphs_for",
    "make_plan", "stream_failure",
]

MEASURE_METHODS = ("sample", "all", "off")


# --------------------------------------------------------------------------- selections


@dataclass(frozen=True)
class Selection:
    """One choice of capture sizes and what it costs on the workload and the stack."""

    name: str
    sizes: list[int]
    padding_waste: float
    real_tokens: int
    padded_tokens: int
    graphed_batches: int
    graphs: int
    streams: int
    fits: bool
    prediction: Optional[Prediction] = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "sizes": list(self.sizes),
            "num_sizes": len(self.sizes),
            "padding_waste": self.padding_waste,
            "real_tokens": self.real_tokens,
            "padded_tokens": self.padded_tokens,
            "graphed_batches": self.graphed_batches,
            "graphs": self.graphs,
            "streams": self.streams,
            "fits": self.fits,
            "predicted": self.prediction.as_dict() if self.prediction else None,
        }


def padding_counts(sizes: Sequence[int], workload: Sequence[int]) -> tuple[int, int, int]:
    """(real tokens, padded tokens, batches) of the workload's batches a graph serves."""
    ordered = sorted(sizes)
    real = padded = batches = 0
    for tokens in workload:
        target = pad_sorted(tokens, ordered) if tokens > 0 else None
        if target is None:
            continue
        real += tokens
        padded += target
        batches += 1
    return real, padded, batches


def graphs_for(resolution: Resolution, sizes: Sequence[int]) -> int:
    """Graphs captured for ``sizes``: every dispatcher key, a piecewise key counting the
    stream plan's graphs per size (layers + 1, + draft layers + 1), a FULL key one."""
    plan = resolution.stream_plan
    if plan is None or not sizes:
        return 0
    per_piecewise_key = plan.graphs_per_size if plan.streams_per_piecewise_graph else 1
    return sum(
        per_piecewise_key if mode is GraphMode.PIECEWISE else 1
        for mode, _ in dispatcher_for(resolution, sizes).capture_order()
    )


def _selection(
    name: str, sizes: Sequence[int], workload: Workload, plan: StreamPlan, resolution: Resolution
) -> Selection:
    real, padded, batches = padding_counts(sizes, workload.counted)
    streams = plan.streams_needed(len(sizes))
    return Selection(
        name=name,
        sizes=sorted(sizes),
        graphs=graphs_for(resolution, sizes),
        padding_waste=padded / real - 1 if real else 0.0,
        real_tokens=real,
        padded_tokens=padded,
        graphed_batches=batches,
        streams=streams,
        fits=len(sizes) <= plan.max_num_sizes,
    )


def default_budget(plan: StreamPlan) -> int:
    """Without ``--budget``: as many sizes as the streams allow (at most the configured ones, at least 1)."""
    return max(1, min(plan.max_num_sizes, len(plan.requested_sizes)))


@dataclass(frozen=True)
class StreamFailure:
    """Where the configured capture runs out of streams."""

    index: int  # 0-based, in capture order (largest first)
    size: int
    streams_before: int  # streams in use once the sizes before it are captured
    streams_needed: int  # ... and once it is captured too


def stream_failure(plan: StreamPlan) -> Optional[StreamFailure]:
    """The first configured size whose capture fails, or None when all fit."""
    index = plan.first_failing_index()
    if index is None:
        return None
    order = sorted(plan.requested_sizes, reverse=True)
    return StreamFailure(index=index, size=order[index], streams_before=plan.streams_needed(index),
                         streams_needed=plan.streams_needed(index + 1))


# --------------------------------------------------------------------------- the plan


@dataclass
class PlanResult:
    """Everything `ascendgraph plan` reports."""

    resolution: Resolution
    plan: Optional[StreamPlan]
    workload: Workload
    budget: int
    budget_source: str
    failure: Optional[StreamFailure] = None
    configured: Optional[Selection] = None
    even: Optional[Selection] = None
    aware: Optional[Selection] = None
    fitting_even: list[int] = field(default_factory=list)
    fitting_aware: list[int] = field(default_factory=list)
    measurement: Optional[Measurement] = None
    measure_error: Optional[str] = None
    warnings: list[str] = field(default_factory=list)
    plot: Optional[str] = None

    @property
    def graphs_per_size(self) -> int:
        return self.plan.graphs_per_size if self.plan else 0

    @property
    def waste_ratio(self) -> Optional[float]:
        if self.even is None or self.aware is None or self.even.padding_waste <= 0:
            return None
        return self.aware.padding_waste / self.even.padding_waste


def make_plan(
    config: GraphConfig,
    workload: Optional[Workload] = None,
    *,
    budget: Optional[int] = None,
    stream_limit: int = DEFAULT_MAX_STREAMS,
    hccl_op_expansion_mode: Optional[str] = None,
    requests: int = DEFAULT_REQUESTS,
    seed: int = 0,
    measure: str = "sample",
    sample: int = DEFAULT_SAMPLE_SIZES,
    sim_profile: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
    before_measure: Optional[Callable[[], None]] = None,
) -> PlanResult:
    """The whole plan as a value (the CLI renders it). ``workload`` None: generated from
    ``requests`` / ``seed``. ``env``: the environment to resolve with (default: this process's;
    a pasted ``VAR=value vllm serve ...`` line adds its assignments). ``before_measure`` runs
    before a measurement that the plan cache does not hold (the CLI imports torch there)."""
    if measure not in MEASURE_METHODS:
        raise ConfigError(f"measure must be one of {', '.join(MEASURE_METHODS)}, got {measure!r}", key="measure")
    if budget is not None and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise ConfigError(f"the budget must be a number of capture sizes >= 1, got {budget!r}", key="budget")
    if sim_profile is not None:  # checked even with --measure off: a broken profile is bad input either way
        from ascendgraph.device import check_device_options

        check_device_options("sim", profile=sim_profile)
    if workload is not None:
        check_workload_fits(workload, config.max_num_batched_tokens)
    resolution = resolve(config, env=env, stream_limit=stream_limit,
                         hccl_op_expansion_mode=hccl_op_expansion_mode)
    if workload is None:
        workload = generated_workload(config, resolution.mode, requests=requests, seed=seed)
    plan = resolution.stream_plan
    result = PlanResult(resolution=resolution, plan=plan, workload=workload, budget=0, budget_source="none",
                        warnings=list(resolution.warnings))
    if plan is None:
        result.warnings.append(
            f"graphs are off (effective mode {resolution.mode.name}): nothing is captured, nothing to plan"
        )
        return result
    candidates = list(plan.requested_sizes)
    if budget is None:
        result.budget, result.budget_source = default_budget(plan), "stream plan"
    else:
        result.budget, result.budget_source = min(budget, len(candidates)), "--budget"
        if budget > len(candidates):
            result.warnings.append(
                f"--budget {budget} is more than the {len(candidates)} configured sizes; using {len(candidates)}"
            )
        if plan.max_num_sizes > 0 and result.budget > plan.max_num_sizes:
            result.warnings.append(
                f"--budget {result.budget} sizes need {plan.streams_needed(result.budget)} streams but only "
                f"{plan.max_num_sizes} sizes fit the {plan.max_streams}-stream budget"
            )
    if plan.max_num_sizes == 0:
        result.warnings.append(
            f"not even one size fits: one size alone needs {plan.streams_needed(1)} streams of {plan.max_streams}"
        )
    result.failure = stream_failure(plan)
    if result.failure is not None:
        fitting = max(plan.max_num_sizes, 1)
        result.fitting_even = sample_sizes(candidates, fitting)
        result.fitting_aware = select_sizes(candidates, fitting, workload.counted)
    result.configured = _selection("configured", candidates, workload, plan, resolution)
    result.even = _selection("even", sample_sizes(candidates, result.budget), workload, plan, resolution)
    result.aware = _selection(
        "workload_aware", select_sizes(candidates, result.budget, workload.counted), workload, plan, resolution
    )
    if measure != "off":
        try:
            measurement = cached(
                resolution,
                lambda: _measure_now(before_measure, resolution, method=measure, sample=sample,
                                     profile=sim_profile, hccl_op_expansion_mode=hccl_op_expansion_mode,
                                     seed=seed, env=env),
                method=measure, sample=sample, profile=sim_profile, hccl_op_expansion_mode=hccl_op_expansion_mode,
                seed=seed, env=env,
            )
        except ConfigError:
            raise  # bad input (e.g. an unknown --sim-profile): exit 2
        except Exception as exc:  # an OOM or a capture error is a finding of the plan: exit 1
            first_line = (str(exc).strip().splitlines() or [""])[0]
            result.measure_error = f"{type(exc).__name__}: {first_line}"
        else:
            result.measurement = measurement
            result.configured = _with_prediction(result.configured, measurement)
            result.even = _with_prediction(result.even, measurement)
            result.aware = _with_prediction(result.aware, measurement)
    return result


def _measure_now(before: Optional[Callable[[], None]], resolution: Resolution, **options: Any) -> Measurement:
    if before is not None:
        before()
    return measure_capture(resolution, **options)


def _with_prediction(selection: Selection, measurement: Measurement) -> Selection:
    from dataclasses import replace

    return replace(selection, prediction=measurement.predict(selection.sizes))
