"""`ascendgraph scenario`: run fault-scenario files and list the catalogue.

Its `COMMAND` is listed in `ascendgraph.cli.app.commands()`:

    ascendgraph scenario run PATH... [--json] [-k TEXT] [--shard i/n] [--ray ADDRESS|auto]
    ascendgraph scenario list PATH... [--json | --markdown]   check them and show the catalogue

``run`` runs single-rank files (one row each) and multi-rank files (``kind = "ranks"``, a
row per side: `ascendgraph.tools.scenario.items`) and prints a table (scenario, outcome,
expected, time, result) on stdout — or the ``--json`` document alone on stdout — and exits 1
when any scenario missed its expectation. ``--shard i/n`` keeps the rows whose index is i
modulo n; ``--ray`` runs each row as a task on a Ray cluster and prints the same report
(`ascendgraph.tools.scenario.ray_items`). A missing path, a bad scenario file, a bad shard or
a Ray address nothing answers at is bad input: one line, exit 2, before anything runs; a Ray
task that fails mid-run is exit 1. Nothing heavy is imported at module top.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from ascendgraph.cli.app import CliUsageError, Command, emit_json, emit_result, emit_text

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.tools.scenario.items import ItemResult, ScenarioItem

__all__ = ["add_scenario_arguments", "scenario_command", "format_row", "summary_counts"]

RUN_FAILED = 1


def add_scenario_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="scenario_action", metavar="ACTION", parser_class=type(parser))
    run = actions.add_parser(
        "run", help="run scenario files (or folders of them) and check each against its expectation",
        description="Run fault scenarios on the simulator. Exit 0 when every scenario met its expectation, "
        "1 when any missed it, 2 for a missing path or a bad scenario file.",
    )
    run.add_argument("paths", nargs="+", metavar="PATH", help="a scenario .toml file or a folder of them")
    run.add_argument("--json", action="store_true", help="print the results as JSON on stdout, instead of the text (nothing else on stdout)")
    run.add_argument("-k", dest="select", default=None, metavar="TEXT",
                     help="run only scenarios whose name contains TEXT")
    run.add_argument("--shard", default=None, metavar="i/n",
                     help="run only the rows whose index is i modulo n (0 <= i < n): n machines cover every row once")
    run.add_argument("--ray", default=None, metavar="ADDRESS",
                     help="run each row as a task on the Ray cluster at ADDRESS (HOST:PORT, ray://HOST:PORT or "
                     "auto; needs pip install 'ascendgraph[ray]'); the report is the serial run's")
    listing = actions.add_parser(
        "list", help="check scenario files and list them (name, kind, expected outcome, description)",
        description="Load and check scenario files without running them; print the catalogue.",
    )
    listing.add_argument("paths", nargs="+", metavar="PATH", help="a scenario .toml file or a folder of them")
    style = listing.add_mutually_exclusive_group()
    style.add_argument("--json", action="store_true", help="print the catalogue as JSON on stdout, instead of the text (nothing else on stdout)")
    style.add_argument("--markdown", action="store_true", help="print the Markdown table of docs/faults.md on stdout")


def _load_items(args: argparse.Namespace) -> list["ScenarioItem"]:
    from ascendgraph.tools.scenario.items import load_items, select_shard
    from ascendgraph.tools.scenario.sweep import parse_shard

    shard = parse_shard(args.shard) if args.shard is not None else None  # before any file is read
    items = load_items(args.paths)
    if args.select:
        items = [item for item in items if args.select in item.name]
        if not items:
            raise CliUsageError(f"ascendgraph scenario run: error: no scenario name contains {args.select!r}")
    return select_shard(items, shard) if shard is not None else items


def format_row(values: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(value.ljust(width) for value, width in zip(values, widths)).rstrip()


def summary_counts(results: Sequence[Any]) -> dict[str, Any]:
    """Counts over results that have ``passed``, ``outcome`` and ``seconds`` (ScenarioResult, ItemResult)."""
    from ascendgraph.tools.scenario import OUTCOMES

    return {
        "scenarios": len(results),
        "passed": sum(r.passed for r in results),
        "failed": sum(not r.passed for r in results),
        "outcomes": {o: sum(r.outcome == o for r in results) for o in OUTCOMES},
        "seconds": round(sum(r.seconds for r in results), 3),
    }


def _results(items: Sequence["ScenarioItem"], args: argparse.Namespace) -> Iterator["ItemResult"]:
    """Each item's result in order: here, one after the other, or as Ray tasks (``--ray``: the
    cluster is joined now, so an address nothing answers at is exit 2 before the table)."""
    quiet = not bool(getattr(args, "verbose", False))
    if args.ray is not None:
        from ascendgraph.tools.scenario.ray_items import run_on_ray

        return run_on_ray(items, args.ray, quiet=quiet)
    from ascendgraph.tools.scenario.items import run_item

    return (run_item(item, quiet) for item in items)


def _run(args: argparse.Namespace) -> int:
    items = _load_items(args)
    outcomes = _results(items, args)
    task_failed: tuple[type[BaseException], ...] = ()  # exit 1: a Ray task that did not come back
    if args.ray is not None:
        from ascendgraph.tools.scenario.ray_items import RayTaskFailed

        task_failed = (RayTaskFailed,)
    width = max([len("scenario")] + [len(item.name) for item in items])
    widths = (width, 8, max([len("expected")] + [len(item.expected_text) for item in items]), 7, 6)
    header = ("scenario", "outcome", "expected", "time", "result")
    if not args.json:
        emit_result(format_row(header, widths))
        emit_result(format_row(tuple("-" * w for w in widths), widths))
    results: list["ItemResult"] = []
    try:
        for item, result in zip(items, outcomes):
            results.append(result)
            if not args.json:
                emit_result(format_row(
                    (item.name, result.outcome, item.expected_text, f"{result.seconds:.1f}s",
                     "PASS" if result.passed else "FAIL"),
                    widths,
                ))
    except task_failed as exc:
        emit_text(f"ascendgraph scenario run: error: {exc}")
        if args.json:
            emit_json({"schema_version": 1, "exit_code": RUN_FAILED,
                       "error": {"type": "RayTaskFailed", "message": str(exc)}})
        return RUN_FAILED
    summary = summary_counts(results)
    if args.json:
        emit_json({"schema_version": 1, "summary": summary, "scenarios": [dict(r.row) for r in results]})
    else:
        for result in results:
            if not result.passed:
                emit_result("\n" + result.explanation)
        counts = ", ".join(f"{name} {count}" for name, count in summary["outcomes"].items())
        emit_result(
            f"\n{summary['scenarios']} scenarios: {summary['passed']} passed, {summary['failed']} failed "
            f"({counts}) in {summary['seconds']:.1f} s"
        )
    return RUN_FAILED if summary["failed"] else 0


def _list(args: argparse.Namespace) -> int:
    """The catalogue: a row per single-rank file and, like ``run``, a row per side of a
    multi-rank file (``NAME[buggy]`` / ``NAME[fixed]``, kind ``ranks``)."""
    from ascendgraph.tools.scenario import catalogue_table
    from ascendgraph.tools.scenario.items import load_items

    items = load_items(args.paths)
    if args.markdown:
        emit_result(catalogue_table([item.scenario for item in items if item.side is None],
                                    [item for item in items if item.side is not None]))
    elif args.json:
        emit_json({"schema_version": 1, "scenarios": [_listed(item) for item in items]})
    else:
        width = max(len(item.name) for item in items)
        for item in items:
            emit_result(f"{item.name.ljust(width)}  {item.kind:<6}  {item.expected_text:<34}  "
                        f"{item.scenario.description}")
        emit_result(f"{len(items)} scenarios")
    return 0


def _listed(item: "ScenarioItem") -> dict[str, Any]:
    """One ``--json`` entry of ``list``: name, path, kind, expected, error_type, description
    (and, for a side of a multi-rank file, its side and issue)."""
    scenario = item.scenario
    if item.side is None:
        return {"name": item.name, "path": item.path, "kind": item.kind, "expected": scenario.expect.outcome,
                "error_type": scenario.expect.error_type, "description": scenario.description}
    expect = scenario.expect[item.side]
    return {"name": item.name, "path": item.path, "kind": item.kind, "expected": expect["outcome"],
            "error_type": expect.get("error_type"), "description": scenario.description, "side": item.side,
            "issue": scenario.issue}


def scenario_command(args: argparse.Namespace) -> int:
    action = getattr(args, "scenario_action", None)
    if action == "run":
        return _run(args)
    if action == "list":
        return _list(args)
    raise CliUsageError("ascendgraph scenario: error: give an action: run PATH... or list PATH... "
                        "(see ascendgraph scenario --help)")


COMMAND = Command(
    "scenario",
    "run fault scenarios (tests/scenarios/*.toml) on the simulator and check their outcome",
    "Fault scenarios reproduce the ways graph mode fails on real stacks (stream exhaustion, old HDKs, "
    "pool memory, hangs, lost devices, bad environments and configurations) and check the answer: "
    "a clear error, or a documented fallback, with nothing lost and nothing leaked. See docs/faults.md."
    "\n\nexamples:\n  ascendgraph scenario run tests/scenarios\n  ascendgraph scenario run "
    "tests/scenarios/task_queue_enable_2.toml --json\n  ascendgraph scenario list tests/scenarios --markdown",
    add_scenario_arguments,
    scenario_command,
)
