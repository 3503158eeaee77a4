"""Bench's goals table: the contributor's loop's figures beside their goals, met or NOT met
(issue 26's table; issue 37 tightened the run, suite and facade rows)."""

from __future__ import annotations

from typing import Any, Optional

MIB = 2**20
NOT_MEASURED = "not measured"


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# The limits, each once: the goals table's text and its met / NOT met verdicts read them.
RUN_WALL_S = 6.0  # the first `ascendgraph run`, idle, 2 cores
RUN_RSS_BYTES = 600e6
SECOND_RUN_WALL_S = 3.0
CAPTURE_WARM_S = 1.5
PLAN_WALL_S = 2.0
FACADE_WALL_S = 3.5
SUITE_S = 150.0  # make test's pytest from a fresh clone (no bytecode caches)
CI_S = 12 * 60.0
API_OVER_CLI = 1.10
RANKS_WALL_S = 15.0

GOALS = {
    "run": ("ascendgraph run default, wall / peak RSS", f"<= {RUN_WALL_S:g} s / <= {RUN_RSS_BYTES / 1e6:.0f} MB"),
    "second": ("second ascendgraph run (warm caches), wall", f"<= {SECOND_RUN_WALL_S:g} s"),
    "capture": ("capture of the 210 graphs incl. compile (warm cache)", f"<= {CAPTURE_WARM_S:g} s"),
    "plan": ("ascendgraph plan README example", f"<= {PLAN_WALL_S:g} s"),
    "facade": ("first facade test (pytest -m npu --npu-facade, one capture)", f"<= {FACADE_WALL_S:g} s"),
    "suite": ("default suite, make test", f"<= {SUITE_S:g} s"),
    "ci": (".ci/run, all steps", f"<= {CI_S / 60:g} min"),
    "api": ("API vs CLI run, loaded / idle (API/CLI wall)", f"<= {API_OVER_CLI:.2f} both"),
    "ranks": ("64 ranks x 100 steps of vLLM's coordinate_batch_across_dp, wall", f"<= {RANKS_WALL_S:g} s"),
}


def goals(sections: dict[str, Any], recorded: Optional[dict[str, Any]] = None) -> list[dict[str, Any]]:
    """The issue's table: (figure, now, goal, met) per row; the suite and .ci/run rows read the
    recorded figures (``--record``) unless the suite was measured in this run."""
    recorded = recorded if recorded is not None else {}
    rows: list[dict[str, Any]] = []

    def add(key: str, now: Optional[str], met: Optional[bool]) -> None:
        figure, goal = GOALS[key]
        rows.append({"figure": figure, "now": now if now is not None else NOT_MEASURED, "goal": goal, "met": met})

    def proc(row: Optional[dict[str, Any]]) -> Optional[str]:
        return None if not row else f"{row['wall_s']:.1f} s (CPU {row['cpu_s']:.1f} s)"

    run = sections.get("run") or {}
    first, second = run.get("first"), run.get("second")
    if first:
        rss = first["peak_rss_bytes"]
        add("run", f"{first['wall_s']:.1f} s / {rss / MIB:.0f} MiB (CPU {first['cpu_s']:.1f} s)",
            first["wall_s"] <= RUN_WALL_S and rss <= RUN_RSS_BYTES)
    else:
        add("run", None, None)
    add("second", proc(second), second["wall_s"] <= SECOND_RUN_WALL_S if second else None)
    capture = sections.get("capture")
    if capture and "capture_seconds" in capture.get("warm", {}):
        def total(row: dict[str, Any]) -> float:
            return row["capture_seconds"] + row["compile_seconds"]

        def cpu(row: dict[str, Any]) -> float:
            return row.get("capture_cpu_seconds", 0.0) + row.get("compile_cpu_seconds", 0.0)

        warm, cold = capture["warm"], capture["cold"]
        per = total(warm) / max(warm["graphs"], 1) * 1e3
        cold_text = f"{total(cold):.2f} s cold" if "capture_seconds" in cold else "cold failed"
        add("capture", f"{total(warm):.2f} s ({per:.1f} ms/graph, CPU {cpu(warm):.2f} s); {cold_text}",
            total(warm) <= CAPTURE_WARM_S)
    else:
        add("capture", None, None)
    plan = sections.get("plan")
    plan_text = proc(plan)
    if plan_text and plan.get("first"):
        plan_text += f"; first with empty caches {proc(plan['first'])}"
    # A user's first plan finds no plan cache: the goal is met only when that one is too.
    add("plan", plan_text, (plan["wall_s"] <= PLAN_WALL_S and plan.get("first", plan)["wall_s"] <= PLAN_WALL_S) if plan else None)
    facade = sections.get("facade")
    if facade and facade.get("exit_code") == 0:
        add("facade", proc(facade), facade["wall_s"] <= FACADE_WALL_S)
    else:
        add("facade", "failed" if facade else None, False if facade else None)
    for key, limit in (("suite", SUITE_S), ("ci", CI_S)):
        measured = sections.get(key)
        if measured and not measured.get("skipped"):
            row, source = measured, "this run"
        else:
            row, source = recorded.get(key), "recorded"
        if row and row.get("seconds") is not None:
            cpu_text = f", CPU {row['cpu_seconds']:.0f} s" if row.get("cpu_seconds") is not None else ""
            origin = row.get("source") or f"{source} {str(row.get('recorded', ''))[:10]}"
            add(key, f"{row['seconds']:.0f} s ({origin}{cpu_text}; load {row.get('load_average', '?')})",
                row["seconds"] <= limit and row.get("exit_code", 0) == 0)
        else:
            add(key, None, None)
    api = sections.get("api")
    if api:
        loaded, idle = api["loaded"]["api_over_cli"], api["idle"]["api_over_cli"]
        add("api", f"{_fmt(loaded)} / {_fmt(idle)}",
            loaded is not None and idle is not None and loaded <= API_OVER_CLI and idle <= API_OVER_CLI)
    else:
        add("api", None, None)
    ranks = sections.get("ranks")
    if ranks and "wall_s" in ranks:
        full = (ranks.get("dp"), ranks.get("steps")) == (64, 100)
        size = "" if full else f" ({ranks.get('dp')} ranks x {ranks.get('steps')} steps)"
        add("ranks", f"{ranks['wall_s']:.1f} s{size}", ranks["wall_s"] <= RANKS_WALL_S if full else None)
    else:
        add("ranks", "failed" if ranks and not ranks.get("skipped") else None,
            False if ranks and not ranks.get("skipped") else None)
    return rows


def print_goals(rows: list[dict[str, Any]]) -> None:
    print("\nfigure vs goal")
    width = max(len(r["figure"]) for r in rows)
    for row in rows:
        verdict = {True: "met", False: "NOT met", None: ""}[row["met"]]
        print(f"   {row['figure']:<{width}}  {row['now']:<52}  goal {row['goal']:<24} {verdict}")
    if any(row["met"] is False for row in rows):
        print("   what each row measures: docs/bench.md (\"Sections\"); profile a row's command to see where its "
              "time goes (python -X importtime, cProfile); what changed so far: CHANGELOG.md")


def print_side_by_side(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    print("\nbefore / after (--before), one run, each measurement right after the other")
    width = max(len(r["figure"]) for r in after)
    for old, new in zip(before, after):
        if old["now"] == NOT_MEASURED and new["now"] == NOT_MEASURED:
            continue
        print(f"   {new['figure']:<{width}}  before {old['now']:<44}  after {new['now']}")
