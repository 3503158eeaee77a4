"""Multi-rank scenario files (``kind = "ranks"``): one named issue, run under its buggy and
its fixed policy, with an expectation for each and per-rank expectations (docs/ranks.md).

    kind = "ranks"
    issue = "vLLM Ascend #13826"
    description = "what the scenario catches"
    [config]            vLLM engine arguments (GraphConfig.from_vllm_args): model, data_parallel_size, ...
    [ranks]             RankOptions fields common to both runs (mc2_skip, faults, env, ...)
    [ranks.steps]       per DP rank: a list of [tokens, uniform_decode, draft_steps]
    [buggy] / [fixed]   RankOptions fields of each run
    [buggy.expect]      outcome = "ok" | "error"; error_type; rule; straggler; message
    [fixed.expect.ranks.R]  per-rank expectations: RankSummary fields (replays, capture_fallback, ...)

`load_rank_scenario` checks a file completely (ScenarioError naming the file and key);
`run_rank_scenario` runs one side and returns the report and every missed expectation.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Union

from ascendgraph.errors import ConfigError
from ascendgraph.readers import load_toml, read_int, read_text_file
from ascendgraph.tools.scenario.model import ScenarioError

__all__ = ["RankScenario", "RANK_SIDES", "load_rank_scenario", "run_rank_scenario", "discover_rank_scenarios"]

RANK_SIDES = ("buggy", "fixed")
_TOP = ("kind", "issue", "description", "config", "ranks", "buggy", "fixed")
_EXPECT = ("outcome", "error_type", "rule", "straggler", "message", "ranks")
_INT_KEYED = ("dp_sync_policy_by_rank", "stream_limits", "capture_sizes_by_rank")


@dataclass(frozen=True)
class RankScenario:
    name: str
    path: Path
    issue: str
    description: str
    config: Mapping[str, Any]
    common: Mapping[str, Any]
    steps: Mapping[int, tuple[tuple[int, bool, int], ...]]
    sides: Mapping[str, Mapping[str, Any]]  # side -> RankOptions fields
    expect: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # side -> expectation


def _option_fields() -> set[str]:
    from ascendgraph.runtime.ranks import RankOptions

    return {f.name for f in dataclasses.fields(RankOptions)} - {"steps"}


def _summary_fields() -> set[str]:
    from ascendgraph.runtime.ranks import RankSummary

    return {f.name for f in dataclasses.fields(RankSummary)}


def _rank_key(path: Path, where: str, key: Any) -> int:
    try:
        return read_int(key, "", key=where)
    except ConfigError:
        raise ScenarioError(path, where, f"expected a rank number in ASCII digits, got {str(key)[:20]!r}") from None


def _options(path: Path, where: str, table: Any) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ScenarioError(path, where, f"expected a table, got {str(table)[:40]!r}")
    allowed = _option_fields()
    out: dict[str, Any] = {}
    for key, value in table.items():
        if key in ("steps", "expect"):
            continue
        if key not in allowed:
            raise ScenarioError(path, f"{where}.{key}", f"unknown run option; expected one of {', '.join(sorted(allowed))}")
        if key in _INT_KEYED:
            if not isinstance(value, dict):
                raise ScenarioError(path, f"{where}.{key}", "expected a table keyed by rank numbers")
            value = {_rank_key(path, f"{where}.{key}", k): (tuple(v) if isinstance(v, list) else v)
                     for k, v in value.items()}
        out[key] = value
    _check_options(path, where, out)
    return out


def _check_options(path: Path, where: str, fields: Mapping[str, Any]) -> None:
    """The fields as RankOptions takes them: types and bounds (ranks.py MAX_*), one line each."""
    from ascendgraph.runtime.ranks import RankOptions

    try:
        RankOptions(**fields)
    except ConfigError as exc:
        raise ScenarioError(path, f"{where}.{exc.key}" if exc.key else where, str(exc)) from None


def _steps(path: Path, table: Any) -> dict[int, tuple[tuple[int, bool, int], ...]]:
    from ascendgraph.runtime.ranks_options import MAX_SCRIPTED_STEPS, Step

    if not isinstance(table, dict) or not table:
        raise ScenarioError(path, "[ranks.steps]", "missing; give each DP rank a list of [tokens, uniform, drafts]")
    steps = {}
    for key, items in table.items():
        rank = _rank_key(path, f"[ranks.steps] {key}", key)
        if not isinstance(items, list) or len(items) > MAX_SCRIPTED_STEPS:
            raise ScenarioError(path, f"[ranks.steps] {key}", "expected `DP_RANK = [[tokens, uniform, drafts], ...]` "
                                f"(at most {MAX_SCRIPTED_STEPS} steps)")
        parsed = []
        for item in items:
            if not (isinstance(item, list) and len(item) == 3):
                raise ScenarioError(path, f"[ranks.steps] {key}", f"bad step {str(item)[:40]}: expected [tokens >= 0, "
                                                                   "true|false, draft steps >= 0]")
            try:
                Step(*item)
            except ConfigError as exc:
                raise ScenarioError(path, f"[ranks.steps] {key}", f"bad step {str(item)[:40]}: {exc}") from None
            parsed.append((item[0], item[1], item[2]))
        steps[rank] = tuple(parsed)
    return steps


def _expect(path: Path, side: str, table: Any) -> dict[str, Any]:
    where = f"[{side}.expect]"
    if not isinstance(table, dict) or "outcome" not in table:
        raise ScenarioError(path, where, "missing; say outcome = \"ok\" or \"error\" (with error_type)")
    for key in table:
        if key not in _EXPECT:
            raise ScenarioError(path, f"{where} {key}", f"unknown key; expected one of {', '.join(_EXPECT)}")
    if table["outcome"] not in ("ok", "error"):
        raise ScenarioError(path, f"{where} outcome", f"expected 'ok' or 'error', got {table['outcome']!r}")
    if table["outcome"] == "error" and not isinstance(table.get("error_type"), str):
        raise ScenarioError(path, f"{where} error_type", "an error outcome names its error class")
    for key in ("error_type", "rule", "message"):
        if key in table and not isinstance(table[key], str):
            raise ScenarioError(path, f"{where} {key}", f"expected a string, got {str(table[key])[:40]!r}")
    if "straggler" in table:
        if isinstance(table["straggler"], bool) or not isinstance(table["straggler"], int) or table["straggler"] < 0:
            raise ScenarioError(path, f"{where} straggler", f"expected a rank number, got {table['straggler']!r}")
    fields = _summary_fields()
    per_rank = table.get("ranks", {})
    if not isinstance(per_rank, dict):
        raise ScenarioError(path, f"{where} ranks", "expected [side.expect.ranks.R] tables")
    checked: dict[int, dict[str, Any]] = {}
    for rank, entry in per_rank.items():
        number = _rank_key(path, f"{where} ranks.{rank}", rank)
        if not isinstance(entry, dict):
            raise ScenarioError(path, f"{where} ranks.{rank}", "expected [side.expect.ranks.R] tables")
        for key in entry:
            if key not in fields:
                raise ScenarioError(path, f"{where} ranks.{rank}.{key}", f"unknown; expected one of {', '.join(sorted(fields))}")
        checked[number] = dict(entry)
    return {**table, "ranks": checked}


def load_rank_scenario(path: Union[str, Path]) -> RankScenario:
    path = Path(path)
    try:
        data = load_toml(read_text_file(path, "", kind="TOML scenario file"), "")
    except ConfigError as exc:
        raise ScenarioError(path, "(file)", str(exc)) from None
    for key in data:
        if key not in _TOP:
            raise ScenarioError(path, key, f"unknown top-level key; expected one of {', '.join(_TOP)}")
    if data.get("kind") != "ranks":
        raise ScenarioError(path, "kind", f"expected \"ranks\", got {data.get('kind')!r}")
    for key in ("issue", "description"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise ScenarioError(path, key, "expected a non-empty string")
    config = data.get("config", {})
    if not isinstance(config, dict):
        raise ScenarioError(path, "[config]", "expected a table of vLLM engine arguments")
    ranks = data.get("ranks", {})
    if not isinstance(ranks, dict):
        raise ScenarioError(path, "[ranks]", "expected a table of run options")
    sides, expect = {}, {}
    for side in RANK_SIDES:
        if side not in data:
            raise ScenarioError(path, f"[{side}]", "missing; a rank scenario runs a buggy and a fixed policy")
        if not isinstance(data[side], dict):
            raise ScenarioError(path, f"[{side}]", "expected a table of run options and [expect]")
        sides[side] = _options(path, f"[{side}]", data[side])
        expect[side] = _expect(path, side, data[side].get("expect"))
    common = _options(path, "[ranks]", ranks)
    steps = _steps(path, ranks.get("steps"))
    layout = _layout(path, config)
    for side in RANK_SIDES:
        _check_options(path, f"[{side}]", {**common, **sides[side]})
        _check_in_layout(path, side, layout, {**common, **sides[side]}, steps, expect[side])
    return RankScenario(path.stem, path, data["issue"], data["description"], dict(config), common, steps, sides,
                        expect)


def _layout(path: Path, config: Mapping[str, Any]) -> Any:
    """The layout the [config] lays out (a bad engine argument or layout: ScenarioError)."""
    from ascendgraph.config import GraphConfig
    from ascendgraph.parallel.layout import check_heads_split
    from ascendgraph.runtime.ranks import layout_of

    try:
        graph_config = GraphConfig.from_vllm_args(**config)
        check_heads_split(graph_config)
        return layout_of(graph_config)
    except ConfigError as exc:
        raise ScenarioError(path, f"[config] {exc.key}" if exc.key else "[config]", str(exc)) from None


def _check_in_layout(path: Path, side: str, layout: Any, fields: Mapping[str, Any],
                     steps: Mapping[int, Any], expect: Mapping[str, Any]) -> None:
    from ascendgraph.parallel.rank_faults import split_rank_faults
    from ascendgraph.runtime.ranks import RankOptions, Step

    try:
        options = RankOptions(**fields, steps={dp: [Step(*s) for s in items] for dp, items in steps.items()})
        options.check_layout(layout)
        split_rank_faults(options.faults, layout.world_size)
    except ConfigError as exc:
        raise ScenarioError(path, f"[{side}] {exc.key}" if exc.key else f"[{side}]", str(exc)) from None
    for rank in expect.get("ranks", {}):
        if rank >= layout.world_size:
            raise ScenarioError(path, f"[{side}.expect] ranks.{rank}",
                                f"rank {rank} is outside the layout ({layout.describe()})")
    straggler = expect.get("straggler")
    if straggler is not None and straggler >= layout.world_size:
        raise ScenarioError(path, f"[{side}.expect] straggler", f"rank {straggler} is outside the layout "
                            f"({layout.describe()})")


def discover_rank_scenarios(folder: Union[str, Path]) -> list[Path]:
    return sorted(Path(folder).glob("*.toml"))


def run_rank_scenario(scenario: RankScenario, side: str) -> tuple[Any, list[str]]:
    """Run one side; return (RanksReport, every way it missed its expectation)."""
    from ascendgraph.config import GraphConfig
    from ascendgraph.runtime.ranks import RankOptions, Step, run_ranks

    options = {**scenario.common, **scenario.sides[side]}
    steps = {dp: [Step(*s) for s in items] for dp, items in scenario.steps.items()}
    report = run_ranks(GraphConfig.from_vllm_args(**scenario.config), RankOptions(steps=steps, **options))
    expect, misses = scenario.expect[side], []
    error = report.error
    if expect["outcome"] == "ok" and error is not None:
        misses.append(f"expected ok, got {type(error).__name__}: {str(error).splitlines()[0]}")
    if expect["outcome"] == "error":
        if error is None:
            misses.append(f"expected {expect['error_type']}, the run passed")
        elif type(error).__name__ != expect["error_type"]:
            misses.append(f"expected {expect['error_type']}, got {type(error).__name__}: {str(error).splitlines()[0]}")
        else:
            if "rule" in expect and expect["rule"] not in getattr(error, "rules", ()):
                misses.append(f"expected rule {expect['rule']}, got {getattr(error, 'rules', ())}")
            if "straggler" in expect and getattr(error, "straggler", None) != expect["straggler"]:
                misses.append(f"expected straggler {expect['straggler']}, got {getattr(error, 'straggler', None)}")
            if "message" in expect and expect["message"] not in str(error):
                misses.append(f"message lacks {expect['message']!r}")
    by_rank = {r.rank: r for r in report.ranks}
    for rank, entry in expect.get("ranks", {}).items():
        summary = by_rank[rank].to_json()
        for key, want in entry.items():
            if summary[key] != want:
                misses.append(f"rank {rank}: {key} = {summary[key]!r}, expected {want!r}")
    return report, misses
