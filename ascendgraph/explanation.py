"""How `ascendgraph explain` presents a Resolution: readable text, or JSON.

`resolution_to_json` and `format_resolution` are the two renderings of the object
`ascendgraph.explain()` returns (see `ascendgraph.api`). JSON carries ``"schema_version": 1``.
"""

from __future__ import annotations

from typing import Any

from ascendgraph.modes import AttentionGraphSupport, GraphMode
from ascendgraph.resolve import Resolution
from ascendgraph.xlite import describe_xlite

__all__ = ["SCHEMA_VERSION", "resolution_to_json", "format_resolution", "format_sizes", "count_noun"]

SCHEMA_VERSION = 1


def count_noun(count: int, noun: str, plural: str = "") -> str:
    """``1 layer``, ``2 layers`` (``plural``: when it is not noun + s)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def _stream_plan_json(resolution: Resolution) -> dict[str, Any]:
    plan = resolution.stream_plan
    if plan is None:
        return {"max_num_sizes": 0, "streams_per_size": 0, "fits": True, "sizes": [], "requested_sizes": [],
                "graphs_per_size": 0, "reserved_streams": 0, "max_streams": 0, "expansion_mode": None}
    return plan.as_dict()


def resolution_to_json(resolution: Resolution) -> dict[str, Any]:
    """The `explain --json` document (docs/decisions.md "Results on stdout, one JSON document")."""
    config = resolution.config
    return {
        "schema_version": SCHEMA_VERSION,
        "requested_mode": resolution.requested_mode.name,
        "effective_mode": resolution.mode.name,
        "decisions": [d.as_dict() for d in resolution.decisions],
        "compilation_mode": resolution.compilation_mode.name,
        "capture_sizes": list(resolution.capture_sizes),
        "max_capture_size": resolution.max_capture_size,
        "npugraph_ex": resolution.npugraph_ex,
        "static_kernel": resolution.static_kernel,
        "super_kernel": resolution.super_kernel,
        "stream_plan": _stream_plan_json(resolution),
        "warnings": list(resolution.warnings),
        "model": {
            "name": config.model.name,
            "architecture": config.model.architecture,
            "num_hidden_layers": config.model.num_hidden_layers,
        },
        "attention_backend": resolution.attention_backend,
        "attention_support": resolution.attention_support.name,
        "soc": config.soc,
        "warmups": resolution.warmups,
        "attention_split": resolution.attention_split,
        "enforce_eager": resolution.enforce_eager,
        **({"xlite": xlite} if (xlite := describe_xlite(config)) is not None else {}),
    }


def format_sizes(sizes: list[int], *, limit: int = 24) -> str:
    if not sizes:
        return "(none)"
    if len(sizes) <= limit:
        return " ".join(map(str, sizes))
    head = " ".join(map(str, sizes[: limit - 4]))
    tail = " ".join(map(str, sizes[-3:]))
    return f"{head} ... {tail}"


def _short(value: str) -> str:
    """A long size list shortened for the text view (JSON keeps it whole)."""
    if len(value) > 60 and value.startswith("[") and value.endswith("]"):
        try:
            sizes = [int(part) for part in value[1:-1].split(",")]
        except ValueError:
            return value
        return f"[{format_sizes(sizes, limit=10)}] ({len(sizes)} sizes)"
    return value


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def format_resolution(resolution: Resolution) -> str:
    """A readable explanation: requested vs effective mode, each decision and why, sizes, streams."""
    config = resolution.config
    model = config.model
    support = resolution.attention_support
    lines = [
        f"model {model.name} ({model.architecture}, {count_noun(model.num_hidden_layers, 'layer')}) · "
        f"attention {resolution.attention_backend} ({support.name}) · SoC {config.soc}",
        "",
        f"  requested mode   {resolution.requested_mode.name}",
        f"  effective mode   {resolution.mode.name}" + ("" if resolution.mode is resolution.requested_mode else "   <- changed, see decisions"),
        f"  compilation      {resolution.compilation_mode.name}"
        + (f" · attention split (piecewise)" if resolution.attention_split else ""),
        f"  npugraph_ex {_on(resolution.npugraph_ex)} · static kernel {_on(resolution.static_kernel)} · "
        f"super kernel {_on(resolution.super_kernel)}",
        "",
        "decisions:",
    ]
    if not resolution.decisions:
        lines.append("  (none: the configuration runs as given)")
    for number, decision in enumerate(resolution.decisions, 1):
        lines.append(f"  {number}. [{decision.rule}] {_short(decision.before)} -> {_short(decision.after)}")
        lines.append(f"     {decision.reason}")
    lines.append("")
    if resolution.mode is GraphMode.NONE:
        lines.append("capture sizes: none (eager)")
    else:
        lines.append(
            f"capture sizes ({len(resolution.capture_sizes)}, max {resolution.max_capture_size}): "
            f"{format_sizes(resolution.capture_sizes)}"
        )
        lines.append(f"warm-ups per size: {resolution.warmups}")
    plan = resolution.stream_plan
    if plan is not None:
        verdict = "fits" if plan.fits else f"DOES NOT FIT: only {plan.max_num_sizes} sizes fit"
        lines.append(
            f"stream plan: {plan.graphs_per_size} graph(s) and {plan.streams_per_size} streams per size "
            f"({plan.expansion_mode}), {plan.reserved_streams + plan.full_graph_reserve} reserved, "
            f"budget {plan.max_streams} -> up to {plan.max_num_sizes} sizes; "
            f"{len(plan.requested_sizes)} configured: {verdict}"
        )
        if not plan.fits:
            lines.append(f"  largest fitting selection: {format_sizes(plan.sizes)}")
    xlite = describe_xlite(config)
    if xlite is not None:
        native = "eager" if resolution.mode is GraphMode.NONE else f"ACL graphs ({resolution.mode.name}) or eager"
        lines.append("")
        lines.append(f"xlite: {xlite['mode']} mode, token budget {xlite['budget']} = {xlite['budget_rule']}")
        lines.append(f"  routing per batch (native = {native}):")
        for rule in xlite["routing"]:
            lines.append(f"  - {rule}")
    if resolution.warnings:
        lines.append("")
        lines.append("warnings:")
        for warning in resolution.warnings:
            lines.append(f"  - {warning}")
    if support is AttentionGraphSupport.NEVER:
        lines.append("")
        lines.append("note: this attention backend supports no full graphs")
    return "\n".join(lines)
