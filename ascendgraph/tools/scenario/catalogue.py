"""The Markdown catalogue of scenarios (docs/faults.md)."""

from __future__ import annotations

from typing import Sequence

from ascendgraph.tools.scenario.model import Scenario


# --------------------------------------------------------------------------- catalogue


def catalogue_table(scenarios: Sequence[Scenario]) -> str:
    """The Markdown catalogue table (docs/faults.md keeps it in sync; a test checks)."""
    lines = [
        "| scenario | kind | what happens | expected |",
        "|---|---|---|---|",
    ]
    for scenario in sorted(scenarios, key=lambda s: s.name):
        expected = scenario.expect.outcome
        if scenario.expect.error_type:
            expected += f" `{scenario.expect.error_type}`"
        if scenario.expect.effective_mode and scenario.expect.outcome == "fallback":
            expected += f" → {scenario.expect.effective_mode}"
        description = scenario.description.replace("|", "\\|")
        lines.append(f"| `{scenario.name}` | {scenario.kind} | {description} | {expected} |")
    return "\n".join(lines)
