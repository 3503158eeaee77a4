"""`python -m bench`: sections, the goals table, and hygiene (no timing is asserted anywhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest
import torch

from bench import bench_proc
import bench.__main__ as bench_module
from bench.__main__ import (BASELINE, GOALS, NESTED_ENV, NOT_MEASURED, RESULT_KEYS, goals, read_recorded, record,
                            section_ci, section_suite, write_json_atomic)
from bench.__main__ import main as bench_main
from bench.bench_scale import growth_note


def test_quick_bench_writes_every_requested_section_and_the_goals_table(tmp_path, capsys):
    out = tmp_path / "results.json"
    threads = torch.get_num_threads()
    baseline_before = os.stat(BASELINE).st_mtime_ns if os.path.exists(BASELINE) else None
    code = bench_main(["--quick", "--only", "sim", "padding", "--out", str(out)])
    assert torch.get_num_threads() == threads  # the bench gives the process its thread count back
    stdout = capsys.readouterr().out
    assert code == 0
    results = json.loads(out.read_text())
    assert set(RESULT_KEYS) <= set(results)
    assert results["schema_version"] == 2 and results["quick"] is True
    sim = results["sections"]["sim"]
    assert [row["batch"] for row in sim["batches"]] == [1, 8]
    for row in sim["batches"]:
        assert {"eager_us", "replay_us", "floor_us", "ratio", "floor_ratio", "fraction_to_floor"} <= set(row)
        assert row["tasks"] > 0 and row["floor_us"] > 0
    padding = results["sections"]["padding"]
    assert set(padding["workloads"]) == {"decode-heavy", "mixed", "bursty"}
    figures = {row["figure"]: row for row in results["goals"]}
    assert list(figures) == [figure for figure, _ in GOALS.values()]  # every row of the issue's table
    assert figures["ascendgraph run default, wall / peak RSS"]["now"] == NOT_MEASURED  # not run here
    assert figures["first facade test (pytest -m npu --npu-facade, one capture)"]["now"] == NOT_MEASURED
    assert "figure vs goal" in stdout and "11. test suite" not in stdout
    assert not list(tmp_path.glob(".results.*"))  # no temporary file left behind
    # hygiene: the tracked baseline is never written without --update-baseline
    assert (os.stat(BASELINE).st_mtime_ns if os.path.exists(BASELINE) else None) == baseline_before


def test_without_out_the_results_go_to_a_new_temporary_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    assert bench_main(["--quick", "--only", "padding"]) == 0
    written = list(tmp_path.glob("ascendgraph-bench-*.json"))
    assert len(written) == 1
    assert json.loads(written[0].read_text())["sections"]["padding"]["budget"] == 8
    assert str(written[0]) in capsys.readouterr().out


def test_results_are_written_atomically(tmp_path):
    target = tmp_path / "deeper" / "results.json"
    write_json_atomic(str(target), {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        write_json_atomic(str(target), {"not json": object()})
    assert json.loads(target.read_text()) == {"a": 1}  # the old file survives a failed write
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]


def test_the_suite_is_opt_in_and_never_benchmarked_from_inside_itself(monkeypatch, capsys):
    result = section_suite(False)
    assert result["skipped"] is True and result["reason"] == "opt-in: --suite"
    assert NOT_MEASURED in capsys.readouterr().out
    monkeypatch.setenv(NESTED_ENV, "1")
    result = section_suite(True)
    assert result["skipped"] is True and result["reason"] == "running inside the test suite"


def test_ci_is_opt_in_and_never_run_from_inside_the_suite(monkeypatch, capsys):
    result = section_ci(False)
    assert result["skipped"] is True and result["reason"] == "opt-in: --ci"
    assert "12. .ci/run: " + NOT_MEASURED in capsys.readouterr().out
    monkeypatch.setenv(NESTED_ENV, "1")
    assert section_ci(True)["reason"] == "running inside the test suite"


def _fresh_row(name: str, seconds: float) -> dict:
    return {"command": name, "seconds": seconds, "cpu_seconds": 2 * seconds, "exit_code": 0, "summary": "ok",
            "load_average": "0.1", "cpus": 2, "recorded": "2026-12-03T00:00:00+00:00"}


def test_suite_and_ci_measured_in_this_run_are_the_goal_rows_not_the_record(monkeypatch, capsys):
    monkeypatch.delenv(NESTED_ENV, raising=False)
    monkeypatch.setattr(bench_module, "measure_recordable", lambda name: _fresh_row(name, 100.0))
    sections = {"suite": section_suite(True), "ci": section_ci(True)}
    recorded = {"suite": {"seconds": 358.0, "exit_code": 0, "recorded": "2026-11-30"},
                "ci": {"seconds": 900.0, "exit_code": 0, "recorded": "2026-11-30"}}
    rows = {row["figure"]: row for row in goals(sections, recorded)}
    for figure in ("default suite, make test", ".ci/run, all steps"):
        assert rows[figure]["met"] is True and "this run" in rows[figure]["now"] and "CPU 200 s" in rows[figure]["now"]
    assert "12. .ci/run (ci): 100.0 s wall" in capsys.readouterr().out


def test_record_measures_fresh_keeps_the_figures_and_prints_their_goal_rows(tmp_path, monkeypatch, capsys):
    path = tmp_path / "recorded.json"
    path.write_text(json.dumps({"ci": {"seconds": 643, "exit_code": 0}}))
    monkeypatch.setattr(bench_module, "measure_recordable", lambda name: _fresh_row(name, 120.0))
    document = record(["suite"], str(path))
    assert read_recorded(str(path)) == document
    assert document["suite"]["seconds"] == 120.0 and document["ci"] == {"seconds": 643, "exit_code": 0}
    out = capsys.readouterr().out
    assert "recorded suite: suite: 120 s wall" in out
    assert "default suite, make test" in out and "this run" in out and ".ci/run" not in out.split("figure vs goal")[1]


def test_goals_compare_each_figure_with_its_goal():
    def proc(wall: float, rss: float = 0.0) -> dict:
        return {"wall_s": wall, "cpu_s": wall, "peak_rss_bytes": rss, "exit_code": 0}

    sections = {
        "run": {"first": proc(4.0, 700e6), "second": proc(2.5, 500e6)},
        "plan": proc(1.5),
        "facade": proc(5.0),
        "api": {"loaded": {"api_over_cli": 1.05}, "idle": {"api_over_cli": 0.98}},
        "capture": {"warm": {"capture_seconds": 1.0, "compile_seconds": 0.4, "graphs": 210},
                    "cold": {"capture_seconds": 1.0, "compile_seconds": 3.0, "graphs": 210}},
    }
    recorded = {"suite": {"seconds": 140.0, "cpu_seconds": 270.0, "exit_code": 0, "recorded": "2026-12-02"},
                "ci": {"seconds": 800.0, "exit_code": 0}}
    rows = {row["figure"]: row for row in goals(sections, recorded)}
    assert rows["ascendgraph run default, wall / peak RSS"]["met"] is False  # RSS over 600 MB
    assert rows["second ascendgraph run (warm caches), wall"]["met"] is True
    assert rows["capture of the 210 graphs incl. compile (warm cache)"]["met"] is True  # 1.4 s
    assert rows["ascendgraph plan README example"]["met"] is True
    assert rows["first facade test (pytest -m npu --npu-facade, one capture)"]["met"] is False  # over 3.5 s
    assert rows["API vs CLI run, loaded / idle (API/CLI wall)"]["met"] is True
    suite = rows["default suite, make test"]
    assert suite["met"] is True and "recorded 2026-12-02" in suite["now"] and "CPU 270 s" in suite["now"]
    assert rows[".ci/run, all steps"]["met"] is False  # over 12 min
    measured = goals({"suite": {"skipped": False, "seconds": 200.0, "exit_code": 0}}, recorded)
    assert {r["figure"]: r for r in measured}["default suite, make test"]["met"] is False  # this run beats the record
    assert all(row["met"] is None for row in goals({}, {}))  # nothing measured, nothing recorded


def test_recorded_figures_are_read_and_a_broken_file_is_no_figure(tmp_path):
    path = tmp_path / "recorded.json"
    assert read_recorded(str(path)) == {}
    path.write_text("{not json")
    assert read_recorded(str(path)) == {}
    path.write_text(json.dumps({"ci": {"seconds": 600}}))
    assert read_recorded(str(path)) == {"ci": {"seconds": 600}}


def test_growth_note_names_the_factors():
    rows = [
        {"layers": 4, "sizes": 35, "capture_seconds": 1.0, "graphs": 210, "pool_bytes": 100, "peak_rss_bytes": 1000},
        {"layers": 28, "sizes": 35, "capture_seconds": 7.0, "graphs": 1050, "pool_bytes": 100, "peak_rss_bytes": 1500},
        {"layers": 4, "sizes": 67, "capture_seconds": 2.0, "graphs": 402, "pool_bytes": 300, "peak_rss_bytes": 1100},
    ]
    note = growth_note(rows)
    assert "4->28 layers (7.0x) at 35 sizes: capture x7.0, graphs x5.0, pool x1.0, RSS x1.50" in note
    assert "35->67 sizes (1.9x) at 4 layers: capture x2.0, pool x3.0" in note


def test_run_measured_reports_the_child_alone_and_busy_load_stops_its_processes():
    figures = bench_proc.run_measured([sys.executable, "-c", "x = bytearray(64 * 2**20); print('done')"])
    assert figures.exit_code == 0 and figures.stdout_tail == "done"
    assert figures.peak_rss_bytes >= 64 * 2**20
    with bench_proc.busy_load(1) as pids:
        assert len(pids) == 1
        os.kill(pids[0], 0)  # alive while the block runs
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


def test_grid_cells_are_parsed_and_checked():
    import argparse

    from bench.__main__ import parse_cell

    assert parse_cell("28x67") == (28, 67) and parse_cell("4X35") == (4, 35)
    for bad in ("28x50", "0x35", "x35", "28", "ax35"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_cell(bad)


def test_the_plan_goal_is_met_only_when_the_first_plan_with_empty_caches_meets_it_too():
    def plan(second: float, first: float) -> dict:
        row = {"wall_s": second, "cpu_s": second, "exit_code": 0}
        return {**row, "first": {"wall_s": first, "cpu_s": first, "exit_code": 0}}

    def verdict(section: dict) -> object:
        rows = {row["figure"]: row for row in goals({"plan": section}, {})}
        return rows["ascendgraph plan README example"]["met"]

    assert verdict(plan(0.6, 11.7)) is False  # a user's first plan finds no plan cache
    assert verdict(plan(0.6, 1.9)) is True


def test_a_recorded_summary_is_the_last_line_of_stdout_not_a_notice_on_stderr():
    ci_stdout = "ci: main test suite done in 200s\nci: vLLM Ascend suite done in 60s (total 517s)\n\n"
    notice = "sim.facade: torch_npu is the ascendgraph simulator facade\n"
    assert bench_module.summary_line(ci_stdout, notice) == "ci: vLLM Ascend suite done in 60s (total 517s)"
    assert bench_module.summary_line("  \n", "error: something failed\n") == "error: something failed"
    assert bench_module.summary_line("", "") == ""


def test_the_vllm_ranks_row_says_not_measured_without_the_vllm_ascend_environment(tmp_path, capsys, monkeypatch):
    from bench.__main__ import VLLM_ASCEND_PYTHON_ENV, section_ranks
    from bench.goals import goals

    monkeypatch.setenv(VLLM_ASCEND_PYTHON_ENV, str(tmp_path / "no-such-python"))
    row = section_ranks(quick=False, root=str(tmp_path))
    assert row["skipped"] is True and "make vllm-ascend-env" in row["reason"]
    assert "coordinate_batch_across_dp: " + NOT_MEASURED in capsys.readouterr().out
    figure = GOALS["ranks"][0]
    by_figure = {r["figure"]: r for r in goals({"ranks": row}, {})}
    assert by_figure[figure]["now"] == NOT_MEASURED and by_figure[figure]["met"] is None
    measured = {"skipped": False, "dp": 64, "steps": 100, "wall_s": 7.1, "collectives_met": {}}
    assert {r["figure"]: r for r in goals({"ranks": measured}, {})}[figure]["met"] is True


def test_the_run_facade_and_suite_goals_are_the_contributors_loop_of_issue_37():
    def proc(wall: float, rss: float = 500e6) -> dict:
        return {"wall_s": wall, "cpu_s": wall, "peak_rss_bytes": rss, "exit_code": 0}

    def met(sections: dict, figure: str, recorded: Optional[dict] = None) -> Optional[bool]:
        return {row["figure"]: row for row in goals(sections, recorded or {})}[figure]["met"]

    run, facade, suite = (GOALS[key][0] for key in ("run", "facade", "suite"))
    assert met({"run": {"first": proc(5.8)}}, run) is True and met({"run": {"first": proc(6.2)}}, run) is False
    assert met({"facade": proc(3.4)}, facade) is True and met({"facade": proc(3.8)}, facade) is False
    assert met({}, suite, {"suite": {"seconds": 149.0, "exit_code": 0}}) is True
    assert met({}, suite, {"suite": {"seconds": 151.0, "exit_code": 0}}) is False
    assert [GOALS[key][1] for key in ("run", "facade", "suite")] == ["<= 6 s / <= 600 MB", "<= 3.5 s", "<= 150 s"]


def test_the_suite_is_measured_in_a_fresh_clone_without_bytecode(tmp_path):
    from bench.__main__ import fresh_clone

    tree = tmp_path / "tree"
    (tree / "pkg" / "__pycache__").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text("x = 1\n")
    (tree / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"\0")
    (tree / "new.py").write_text("y = 2\n")
    (tree / ".gitignore").write_text("__pycache__/\n")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    subprocess.run(["git", "-C", str(tree), "add", "pkg/mod.py", ".gitignore"], check=True)
    clone = fresh_clone(str(tree), str(tmp_path / "clone"))
    files = sorted(str(p.relative_to(clone)) for p in Path(clone).rglob("*") if p.is_file())
    assert files == [".gitignore", "new.py", "pkg/mod.py"]



def test_the_matmul_bench_times_the_split_and_the_one_piece_product_side_by_side():
    from bench.bench_matmul import measure

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        row = measure(16, 64, 256, repeats=2)
    finally:
        torch.set_num_threads(threads)
    assert {"rows", "inner", "columns", "work", "split_by_default", "split_wall", "whole_wall", "split_cpu", "whole_cpu",
            "ratio"} <= set(row)
    assert (row["rows"], row["inner"], row["columns"]) == (16, 64, 256) and row["work"] == 64 * 256 * (16 + 12)
    assert row["split_by_default"] is False, "a product this small stays in one piece"
    assert row["ratio"] > 0 and row["split_wall"] > 0 and row["whole_wall"] > 0
