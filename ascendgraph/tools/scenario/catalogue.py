"""The Markdown catalogue of scenarios (docs/faults.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from ascendgraph.tools.scenario.model import Scenario

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.tools.scenario.items import ScenarioItem


# --------------------------------------------------------------------------- catalogue


def catalogue_table(scenarios: Sequence[Scenario], rank_sides: Sequence["ScenarioItem"] = ()) -> str:
    """The Markdown catalogue table (docs/faults.md keeps it in sync; a test checks); the
    sides of multi-rank files (``rank_sides``, `ascendgraph.tools.scenario.items`) follow as
    rows of kind ``ranks``."""
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
    for item in sorted(rank_sides, key=lambda i: i.name):
        description = item.scenario.description.replace("|", "\\|")
        expect = item.scenario.expect[item.side]
        expected = expect["outcome"] + (f" `{expect['error_type']}`" if expect.get("error_type") else "")
        lines.append(f"| `{item.name}` | {item.kind} | {description} | {expected} |")
    return "\n".join(lines)
