"""The plan as text (`format_plan`, stdout) and as the ``--json`` document (`plan_to_json`)."""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ascendgraph.explanation import count_noun
from ascendgraph.tools.plan.model import PlanResult

__all__ = ["SCHEMA_VERSION", "format_plan", "plan_to_json"]

SCHEMA_VERSION = 1


# --------------------------------------------------------------------------- rendering


def plan_to_json(result: PlanResult) -> dict[str, Any]:
    """The `plan --json` document."""
    resolution = result.resolution
    config = resolution.config
    plan = result.plan
    stream_plan: Optional[dict[str, Any]] = None
    if plan is not None:
        failure = result.failure
        stream_plan = {
            **plan.as_dict(),
            "streams_per_piecewise_graph": plan.streams_per_piecewise_graph,
            "streams_needed": plan.streams_needed(len(plan.requested_sizes)),
            "first_failing_index": failure.index if failure else None,
            "first_failing_size": failure.size if failure else None,
            "largest_fitting_selection": (
                {"even": result.fitting_even, "workload_aware": result.fitting_aware} if failure else None
            ),
            "warnings": list(plan.warnings),
        }
    workload = result.workload
    selections = {
        s.name: s.as_dict() for s in (result.configured, result.even, result.aware) if s is not None
    }
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {"name": config.model.name, "architecture": config.model.architecture,
                  "num_hidden_layers": config.model.num_hidden_layers},
        "requested_mode": resolution.requested_mode.name,
        "effective_mode": resolution.mode.name,
        "soc": config.soc,
        "capture_sizes": list(resolution.capture_sizes),
        "max_capture_size": resolution.max_capture_size,
        "stream_plan": stream_plan,
        "workload": {
            "source": workload.source,
            "description": workload.description,
            "batches": len(workload.batch_sizes),
            "counted_batches": len(workload.counted),
            "tokens": workload.summary(),
            **workload.details,
        },
        "budget": {
            "sizes": result.budget,
            "graphs_per_size": result.graphs_per_size,
            "streams": plan.streams_needed(result.budget) if plan else 0,
            "source": result.budget_source,
        },
        "selections": selections,
        "padding_waste_ratio": result.waste_ratio,
        "measurement": result.measurement.as_dict() if result.measurement else None,
        "measure_error": result.measure_error,
        "plot": result.plot,
        "warnings": list(result.warnings),
    }


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _count(sizes: Optional[Sequence[int]]) -> str:
    n = len(sizes or ())
    return f"{n:>2} size{'s' if n != 1 else ' '}:"


def sizes_text(sizes: Sequence[int], limit: int = 12) -> str:
    if len(sizes) <= limit:
        return "[" + ", ".join(map(str, sizes)) + "]"
    head = ", ".join(map(str, sizes[: limit - 3]))
    return f"[{head}, ..., {sizes[-2]}, {sizes[-1]}]"


def percent(value: float) -> str:
    return f"{value * 100:.1f}%"


def format_plan(result: PlanResult) -> str:
    """The readable plan (stderr)."""
    resolution = result.resolution
    config = resolution.config
    model = config.model
    plan = result.plan
    lines = [
        f"plan: model {model.name} ({model.architecture}, {count_noun(model.num_hidden_layers, 'layer')}) · "
        f"{resolution.mode.name} · SoC {config.soc} · {len(resolution.capture_sizes)} capture sizes"
        + (f" (max {resolution.max_capture_size})" if resolution.capture_sizes else ""),
    ]
    workload = result.workload
    summary = workload.summary()
    lines += [
        "",
        f"workload: {workload.description}: {len(workload.batch_sizes)} batches of {summary['min']}..{summary['max']} "
        f"tokens (median {summary['median']:g}); padding counts {workload.details.get('counted', 'all batches')} "
        f"({len(workload.counted)})",
    ]
    if plan is None:
        lines += ["", "graphs are off: nothing to capture."]
        return "\n".join(lines + _warning_lines(result))

    spg = plan.streams_per_piecewise_graph
    per_size = (
        f"{plan.graphs_per_size} piecewise graphs x {spg} stream{'s' if spg != 1 else ''}"
        if spg else "1 FULL graph x 1 stream"
    )
    reserve = plan.reserved_streams + plan.full_graph_reserve
    lines += [
        "",
        f"stream plan ({plan.expansion_mode}, {plan.max_streams} streams):",
        f"  per size            {plan.streams_per_size} streams ({per_size})"
        + (f"; FULL graphs use the {plan.full_graph_reserve}-stream FULL reserve" if plan.full_graph_reserve else ""),
        f"  reserved up front   {reserve} streams",
        f"  sizes that fit      {plan.max_num_sizes}",
    ]
    needed = plan.streams_needed(len(plan.requested_sizes))
    if plan.fits:
        lines.append(f"  configured          {len(plan.requested_sizes)} sizes need {needed} streams: fits")
    else:
        failure = result.failure
        assert failure is not None
        lines += [
            f"  configured          {len(plan.requested_sizes)} sizes need {needed} streams: DOES NOT FIT",
            f"  first size to fail  {failure.size} (capture #{failure.index + 1} of {len(plan.requested_sizes)}, "
            f"largest first): {failure.index} sizes hold {failure.streams_before} streams, one more needs "
            f"{failure.streams_needed} > {plan.max_streams}",
        ]
        if plan.max_num_sizes == 0:
            lines.append(f"  no size fits: even the largest alone needs {plan.streams_needed(1)} streams")
        else:
            n = plan.max_num_sizes
            lines += [
                f"  largest fitting selection (at most {n} size{'s' if n != 1 else ''}; workload-aware may "
                "need fewer):",
                f"    even sampling     {_count(result.fitting_even)} {sizes_text(result.fitting_even)}",
                f"    workload-aware    {_count(result.fitting_aware)} {sizes_text(result.fitting_aware)}",
            ]
    lines += [
        "",
        f"size selections at a budget of {result.budget} sizes ({result.budget_source}; "
        f"{plan.streams_needed(result.budget)} streams):",
    ]
    rows = [("even sampling", result.even), ("workload-aware", result.aware),
            (f"all {len(plan.requested_sizes)} configured", result.configured)]
    for label, selection in rows:
        assert selection is not None
        lines.append(
            f"  {label:<22} padding waste {percent(selection.padding_waste):>7}  {selection.graphs:>5} graphs  "
            f"{sizes_text(selection.sizes)}"
        )
    ratio = result.waste_ratio
    if ratio is not None:
        lines.append(f"  workload-aware / even sampling padding waste: {ratio:.2f}")
    if result.budget >= len(plan.requested_sizes):
        lines.append("  (the budget keeps every configured size; pass --budget N to compare smaller selections)")

    lines.append("")
    measurement = result.measurement
    if result.measure_error:
        lines.append(f"capture measurement failed: {result.measure_error}")
    elif measurement is None:
        lines.append("capture cost: not measured (--measure off)")
    else:
        how = (
            "every size captured" if measurement.method == "all"
            else f"{len(measurement.sizes)} of {len(resolution.capture_sizes)} sizes captured, others interpolated"
        )
        lines.append(
            f"predicted capture cost (simulator profile {measurement.profile}, meta tensors; {how}):"
        )
        lines.append(f"  {'':<22} {'graphs':>7} {'streams':>8} {'pool memory':>12} {'capture time':>13}")
        for label, selection in rows:
            assert selection is not None and selection.prediction is not None
            p = selection.prediction
            lines.append(
                f"  {label:<22} {p.graphs:>7} {selection.streams:>8} {_mib(p.pool_bytes):>12} "
                f"{p.capture_seconds:>11.2f} s"
                + ("" if selection.fits else "  (does not fit the streams)")
            )
        lines.append(
            "  capture time = warm-ups + captures on the simulator's virtual clock; host compile "
            + (f"{measurement.compile_seconds:.1f} s, measurement {measurement.wall_seconds:.1f} s (when measured; "
               "read from the plan cache now: same model, sizes, profile, source and torch)"
               if measurement.cached else
               f"{measurement.compile_seconds:.1f} s (measured here); measurement took "
               f"{measurement.wall_seconds:.1f} s")
        )
    if result.plot:
        lines.append(f"plot: {result.plot}")
    return "\n".join(lines + _warning_lines(result))


def _warning_lines(result: PlanResult) -> list[str]:
    warnings = list(result.warnings)
    if result.plan is not None:
        warnings += [w for w in result.plan.warnings if w not in warnings]
    if not warnings:
        return []
    return ["", "warnings:"] + [f"  - {w}" for w in warnings]
