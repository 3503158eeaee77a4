"""The `diagnose` report: text and the `--json` document."""

from __future__ import annotations

import textwrap
from typing import Any, Sequence

from ascendgraph.tools.diagnose.classes import EMPTY_LOG_NOTE, SCHEMA_VERSION, WRAP
from ascendgraph.tools.diagnose.diagnosis import Diagnosis
from ascendgraph.tools.diagnose.logconfig import LogConfig


# --------------------------------------------------------------------------- output


def diagnosis_to_json(diagnosis: Diagnosis) -> dict[str, Any]:
    """The `diagnose --json` document."""
    plan = diagnosis.stream_plan
    return {
        "schema_version": SCHEMA_VERSION,
        "source": diagnosis.source,
        "lines_read": diagnosis.lines_read,
        "failures": [f.as_dict() for f in diagnosis.failures],
        "config": diagnosis.config.as_dict(),
        "stream_plan": plan.as_dict() if plan else None,
        "aiv_stream_plan": diagnosis.aiv_plan.as_dict() if diagnosis.aiv_plan else None,
        "suggested_capture_sizes": diagnosis.suggested_sizes,
        "notes": list(diagnosis.notes),
    }


def _sizes_text(sizes: Sequence[int], limit: int = 24) -> str:
    from ascendgraph.explanation import format_sizes

    return format_sizes(list(sizes), limit=limit)


def _wrap(text: str, indent: str) -> list[str]:
    lines: list[str] = []
    for paragraph in text.split("\n"):
        lines.append(textwrap.fill(paragraph, WRAP, initial_indent=indent, subsequent_indent=indent))
    return lines


def _config_lines(config: LogConfig) -> list[str]:
    mode, mode_source = config.mode()
    src = config.sources

    def at(name: str) -> str:
        return f" (line {src[name]})" if name in src else ""

    rows = []
    if mode is not None:
        origin = at("cudagraph_mode") if mode_source == "log" else f" (from the {mode_source})"
        rows.append(("cudagraph_mode", f"{mode.name}{origin}"))
    sizes = config.sizes
    if sizes:
        origin = at("capture_sizes") if config.capture_sizes else f" (captured{at('captured_cases')})"
        rows.append(("capture sizes", f"{len(sizes)}: {_sizes_text(sizes)}{origin}"))
    for name, label in (("num_hidden_layers", "layers"), ("tensor_parallel_size", "tensor_parallel_size"),
                        ("data_parallel_size", "data_parallel_size"),
                        ("prefill_context_parallel_size", "prefill_context_parallel_size"),
                        ("decode_context_parallel_size", "decode_context_parallel_size"),
                        ("enable_expert_parallel", "enable_expert_parallel"), ("enforce_eager", "enforce_eager"),
                        ("hccl_op_expansion_mode", "HCCL_OP_EXPANSION_MODE"), ("architecture", "architecture")):
        value = getattr(config, name)
        if value is not None:
            rows.append((label, f"{value}{at(name)}"))
    return [f"  {label:<30}{value}" for label, value in rows]


def format_diagnosis(diagnosis: Diagnosis) -> str:
    """The human report: each failure with its line, class and guidance; then config, plan, suggestion."""
    count = len(diagnosis.failures)
    noun = "capture failure" if count == 1 else "capture failures"
    if diagnosis.lines_read == 0:
        return f"{diagnosis.source}: {EMPTY_LOG_NOTE}"
    lines = [f"{diagnosis.source}: {count or 'no'} {noun} in {diagnosis.lines_read} lines"]
    for index, failure in enumerate(diagnosis.failures, 1):
        error = f" ({failure.error_class})" if failure.error_class else ""
        lines += ["", f"{index}. line {failure.line}: {failure.classification}{error}"]
        lines.append(f"   seen: {failure.excerpt}")
        if failure.occurrences > 1 or len(failure.processes) > 1:
            where = f" on {', '.join(failure.processes)}" if len(failure.processes) > 1 else ""
            lines.append(f"   the same failure is reported {failure.occurrences} times{where}, "
                         f"up to line {failure.last_line} (one failure, collapsed)")
        lines.append("   guidance:")
        lines += _wrap(failure.guidance, "     ")
    config_rows = _config_lines(diagnosis.config)
    if config_rows:
        lines += ["", "configuration in the log"] + config_rows
    plan = diagnosis.stream_plan
    if plan is not None:
        verdict = "fits" if plan.fits else f"DOES NOT FIT: at most {plan.max_num_sizes} sizes fit"
        lines += ["", (
            f"stream plan: {plan.graphs_per_size} graph(s) and {plan.streams_per_size} streams per size "
            f"({plan.expansion_mode}), {plan.reserved_streams + plan.full_graph_reserve} reserved, budget "
            f"{plan.max_streams}; {len(plan.requested_sizes)} sizes configured: {verdict}"
        )]
        aiv = diagnosis.aiv_plan
        if aiv is not None and aiv.max_num_sizes > plan.max_num_sizes:
            lines.append(f"  with HCCL_OP_EXPANSION_MODE=AIV: up to {aiv.max_num_sizes} sizes fit "
                         f"({'all' if aiv.fits else 'not all'} {len(aiv.requested_sizes)})")
    if diagnosis.suggested_sizes:
        sizes = diagnosis.suggested_sizes
        lines += ["", f"suggested capture sizes ({len(sizes)}): {_sizes_text(sizes, limit=40)}"]
        lines.append(f"  --compilation-config '{{\"cudagraph_capture_sizes\": [{', '.join(map(str, sizes))}]}}'")
    if diagnosis.notes:
        lines += ["", "notes:"] + [f"  - {note}" for note in diagnosis.notes]
    return "\n".join(lines)
