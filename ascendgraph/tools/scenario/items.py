"""The items `ascendgraph scenario run` runs, and what each gives back.

A single-rank scenario file (``kind = "engine" | "device"``) is one item; a multi-rank file
(``kind = "ranks"``, `ascendgraph.tools.scenario.ranks`) is one item per side, named
``NAME[buggy]`` and ``NAME[fixed]``. Every file is loaded and checked before anything runs
(a bad one is a `ScenarioError`, exit 2). `run_item` runs one item and returns an
`ItemResult`: plain data (the ``--json`` entry and the explanation of a miss), so an item run
in another process or on another machine (a Ray task, `ascendgraph.tools.scenario.ray_items`)
gives back exactly what it gives in this one.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence, Union

from ascendgraph.errors import ConfigError
from ascendgraph.readers import load_toml, read_text_file

__all__ = ["ScenarioItem", "ItemResult", "load_items", "select_shard", "run_item", "engine_logs_quiet"]


@dataclass(frozen=True)
class ScenarioItem:
    """One thing to run: a loaded scenario (and, for a rank scenario, the side)."""

    name: str
    path: str
    kind: str
    expected_text: str
    scenario: Any  # Scenario | RankScenario (both plain, picklable dataclasses)
    side: Optional[str] = None


@dataclass(frozen=True)
class ItemResult:
    """What running an item showed: its ``--json`` entry and why it missed ("" if it passed)."""

    row: Mapping[str, Any]
    explanation: str

    @property
    def name(self) -> str:
        return str(self.row["name"])

    @property
    def passed(self) -> bool:
        return bool(self.row["passed"])

    @property
    def outcome(self) -> str:
        return str(self.row["outcome"])

    @property
    def seconds(self) -> float:
        return float(self.row["seconds"])


def _kind_of(path: Path) -> Optional[str]:
    """The file's ``kind`` when it reads as TOML (else None: `load_scenario` says what is wrong)."""
    try:
        data = load_toml(read_text_file(path, "", kind="TOML scenario file"), "")
    except ConfigError:
        return None
    kind = data.get("kind")
    return kind if isinstance(kind, str) else None


def load_items(paths: Sequence[Union[str, Path]]) -> list[ScenarioItem]:
    """Every item of the files and folders given, each file checked completely."""
    from ascendgraph.tools.scenario.loading import discover_scenarios, load_scenario
    from ascendgraph.tools.scenario.ranks import RANK_SIDES, load_rank_scenario

    items: list[ScenarioItem] = []
    for path in discover_scenarios(paths):
        if path.is_file() and _kind_of(path) == "ranks":
            rank_scenario = load_rank_scenario(path)
            for side in RANK_SIDES:
                expect = rank_scenario.expect[side]
                expected = expect["outcome"] + (f" ({expect['error_type']})" if expect.get("error_type") else "")
                items.append(ScenarioItem(f"{rank_scenario.name}[{side}]", str(path), "ranks", expected,
                                          rank_scenario, side))
        else:
            scenario = load_scenario(path)
            items.append(ScenarioItem(scenario.name, str(scenario.path), scenario.kind, scenario.expected_text,
                                      scenario))
    return items


def select_shard(items: Sequence[ScenarioItem], shard: tuple[int, int]) -> list[ScenarioItem]:
    """The items whose index is ``i`` modulo ``n`` (``shard = (i, n)``): n machines given
    0/n .. n-1/n run every item exactly once."""
    index, count = shard
    return [item for number, item in enumerate(items) if number % count == index]


@contextlib.contextmanager
def engine_logs_quiet(quiet: bool) -> Iterator[None]:
    """Scenarios fail on purpose: keep the engine's error logs out of the table unless -v."""
    logger = logging.getLogger("ascendgraph")
    previous = logger.level
    if quiet:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(previous)


def run_item(item: ScenarioItem, quiet: bool = True) -> ItemResult:
    """Run one item (in this process) and judge it."""
    with engine_logs_quiet(quiet):
        if item.side is None:
            from ascendgraph.tools.scenario.running import run_scenario

            result = run_scenario(item.scenario)
            return ItemResult(result.as_dict(), result.explain())
        return _run_rank_side(item)


def _run_rank_side(item: ScenarioItem) -> ItemResult:
    from ascendgraph.tools.scenario.ranks import run_rank_scenario

    scenario, side = item.scenario, str(item.side)
    start = time.perf_counter()
    report, misses = run_rank_scenario(scenario, side)
    seconds = time.perf_counter() - start
    error = report.error
    expect = scenario.expect[side]
    row = {
        "name": item.name,
        "path": item.path,
        "kind": "ranks",
        "side": side,
        "issue": scenario.issue,
        "description": scenario.description,
        "expected": expect["outcome"],
        "expected_error_type": expect.get("error_type"),
        "outcome": "ok" if error is None else "error",
        "passed": not misses,
        "seconds": round(seconds, 3),
        "error": None if error is None else {"type": type(error).__name__, "message": str(error)},
        "mismatches": list(misses),
        "invariants": {},
    }
    explanation = ""
    if misses:
        lines = [f"scenario {item.name} ({item.path}): expected {item.expected_text}, observed {row['outcome']}"]
        lines += [f"  - {miss}" for miss in misses]
        if error is not None:
            first = str(error).strip().splitlines()[0] if str(error).strip() else ""
            lines.append(f"  error: {type(error).__name__}: {first}")
        explanation = "\n".join(lines)
    return ItemResult(row, explanation)
