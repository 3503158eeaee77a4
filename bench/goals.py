"""Bench's goals table: issue 26's figures beside their goals, met or NOT met."""

from __future__ import annotations

from typing import Any, Optional

MIB = 2**20
NOT_MEASURED = "not measured"


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


GOALS = {
    "run": ("ascendgraph run default, wall / peak RSS", "<= 5 s / <= 600 MB"),
    "second": ("second ascendgraph run (warm caches), wall", "<= 3 s"),
    "capture": ("capture of the 210 graphs incl. compile (warm cache)", "<= 1.5 s"),
    "plan": ("ascendgraph plan README example", "<= 2 s"),
    "facade": ("first facade test (pytest -m npu --npu-facade, one capture)", "<= 4 s"),
    "suite": ("default suite, make test", "<= 150 s"),
    "ci": (".ci/run, all steps", "<= 12 min"),
    "api": ("API vs CLI run, loaded / idle (API/CLI wall)", "<= 1.10 both"),
    "ranks": ("64 ranks x 100 steps of vLLM's coordinate_batch_across_dp, wall", "<= 15 s"),
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
            first["wall_s"] <= 5 and rss <= 600e6)
    else:
        add("run", None, None)
    add("second", proc(second), second["wall_s"] <= 3 if second else None)
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
            total(warm) <= 1.5)
    else:
        add("capture", None, None)
    plan = sections.get("plan")
    plan_text = proc(plan)
    if plan_text and plan.get("first"):
        plan_text += f"; first with empty caches {proc(plan['first'])}"
    # A user's first plan finds no plan cache: the goal is met only when that one is too.
    add("plan", plan_text, (plan["wall_s"] <= 2 and plan.get("first", plan)["wall_s"] <= 2) if plan else None)
    facade = sections.get("facade")
    if facade and facade.get("exit_code") == 0:
        add("facade", proc(facade), facade["wall_s"] <= 4)
    else:
        add("facade", "failed" if facade else None, False if facade else None)
    for key, limit in (("suite", 150.0), ("ci", 12 * 60.0)):
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
            loaded is not None and idle is not None and loaded <= 1.1 and idle <= 1.1)
    else:
        add("api", None, None)
    ranks = sections.get("ranks")
    if ranks and "wall_s" in ranks:
        full = (ranks.get("dp"), ranks.get("steps")) == (64, 100)
        size = "" if full else f" ({ranks.get('dp')} ranks x {ranks.get('steps')} steps)"
        add("ranks", f"{ranks['wall_s']:.1f} s{size}", ranks["wall_s"] <= 15 if full else None)
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
        print("   where the time goes and what stands in the way of the goals not met: docs/bench.md "
              "(\"Where the time goes\", \"What stands in the way\")")


def print_side_by_side(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> None:
    print("\nbefore / after (--before), one run, each measurement right after the other")
    width = max(len(r["figure"]) for r in after)
    for old, new in zip(before, after):
        if old["now"] == NOT_MEASURED and new["now"] == NOT_MEASURED:
            continue
        print(f"   {new['figure']:<{width}}  before {old['now']:<44}  after {new['now']}")
