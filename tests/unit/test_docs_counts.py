"""Counts the README states are the catalogue's (a stale "Forty fault scenarios" read 42 files)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_UNITS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}
_TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90}
_WORDS = {**_UNITS, "ten": 10, "eleven": 11, "twelve": 12, **_TENS,
          **{f"{t}-{u}": tv + uv for t, tv in _TENS.items() for u, uv in _UNITS.items()}}


def _stated(text: str, noun: str) -> int:
    found = re.search(rf"\b([A-Za-z-]+|\d+) {re.escape(noun)}", text)
    assert found, f"the README no longer states how many {noun}"
    word = found.group(1).lower()
    return int(word) if word.isdigit() else _WORDS[word]


def test_the_readme_states_the_number_of_fault_scenarios_and_rank_scenarios():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert _stated(readme, "fault scenarios") == len(list((REPO / "tests" / "scenarios").glob("*.toml")))
    rank_files = [p for p in (REPO / "tests" / "ranks" / "scenario_files").iterdir() if p.suffix == ".toml"]
    assert _stated(readme, "more under `tests/ranks/scenario_files`") == len(rank_files)


def test_the_readme_stays_under_220_lines_and_points_to_the_cli_rules():
    # Issue 37: the README is a tour; the command-line rules (bounds, exit codes) live in docs/cli.md.
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < 220
    assert "[docs/cli.md](docs/cli.md)" in readme


def test_the_simulators_rules_table_has_a_row_for_every_kernel_contract_rule():
    # docs/simulator.md's kernel-contract table once listed 65 of the 104 rules.
    from ascendgraph.kernel_contracts import RULES

    lines = (REPO / "docs" / "simulator.md").read_text(encoding="utf-8").splitlines()
    header = lines.index("| kernel | rule | source | enforced where (sim) |")
    rows = set()
    for line in lines[header + 2:]:
        if not line.startswith("| "):
            break
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        rows.add((cells[0], cells[1]))
    assert {(rule.kernel, rule.name) for rule in RULES} <= rows
