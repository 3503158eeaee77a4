"""`ascendgraph scenario run / list`: the table, --json, and the exit codes 0 / 1 / 2."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from ascendgraph.cli.app import main

SCENARIOS = Path(__file__).resolve().parents[2] / "tests" / "scenarios"
REFUSED = str(SCENARIOS / "replay_before_capture.toml")
HOST_SYNC = str(SCENARIOS / "host_sync_in_capture.toml")


def wrong_expectation(tmp_path: Path) -> str:
    path = tmp_path / "expects_ok.toml"
    path.write_text(textwrap.dedent("""
        kind = "device"
        description = "expects ok from a refused replay"
        [action]
        name = "replay_before_capture"
        [expect]
        outcome = "ok"
    """))
    return str(path)


def test_run_prints_a_table_and_exits_0_when_every_scenario_meets_its_expectation(capsys):
    assert main(["scenario", "run", REFUSED, HOST_SYNC]) == 0
    out, err = capsys.readouterr()
    assert "PASS" not in err  # the table is the result: stdout
    lines = out.splitlines()
    assert lines[0].split() == ["scenario", "outcome", "expected", "time", "result"]
    assert lines[2].split()[:5] == ["replay_before_capture", "error", "error", "(CaptureConstraintError)", lines[2].split()[4]]
    assert lines[2].split()[-1] == "PASS"
    assert "2 scenarios: 2 passed, 0 failed (ok 0, error 2, fallback 0)" in out


def test_run_exits_1_and_explains_when_a_scenario_misses(tmp_path, capsys):
    assert main(["scenario", "run", wrong_expectation(tmp_path), REFUSED]) == 1
    out = capsys.readouterr().out
    assert "expects_ok" in out and "FAIL" in out
    assert "- outcome: expected ok, got error (CaptureConstraintError: Called NPUGraph::replay" in out
    assert "1 passed, 1 failed" in out


def test_run_json_is_alone_on_stdout(tmp_path, capsys):
    assert main(["scenario", "run", "--json", wrong_expectation(tmp_path), REFUSED]) == 1
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["schema_version"] == 1
    assert document["summary"]["passed"] == 1 and document["summary"]["failed"] == 1
    assert document["summary"]["outcomes"] == {"ok": 0, "error": 2, "fallback": 0}
    first = document["scenarios"][0]
    assert first["name"] == "expects_ok" and first["passed"] is False and first["outcome"] == "error"
    assert first["error"]["type"] == "CaptureConstraintError"
    assert first["invariants"]["resources"] == "held"
    assert "scenario" not in err.split("\n")[0]  # no table on stderr with --json


def test_run_a_folder_with_a_name_filter(capsys):
    assert main(["scenario", "run", str(SCENARIOS), "-k", "capture_on_default"]) == 0
    assert "1 scenarios: 1 passed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["scenario", "run", "no/such/path"], "no/such/path: (path): no such file or folder"),
        (["scenario", "run"], "the following arguments are required: PATH"),
        (["scenario"], "give an action: run PATH... or list PATH..."),
        (["scenario", "run", REFUSED, "-k", "zzz"], "no scenario name contains 'zzz'"),
    ],
    ids=["missing path", "no path", "no action", "filter matches nothing"],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_a_bad_file_exits_2_before_anything_runs(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("description = 'x'\n[run]\nreqests = 2\n[expect]\noutcome = 'ok'\n")
    assert main(["scenario", "run", REFUSED, str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"ascendgraph scenario: error: {bad}: [run] reqests: unknown key (did you mean 'requests'?); " \
                  "expected one of requests, seed, prompt_words, output_tokens, burst_size, burst_gap, " \
                  "on_capture_error, dtype, atol, debug, num_threads, skip_param_update, record_update_events"


def test_list_prints_the_catalogue(capsys):
    assert main(["scenario", "list", str(SCENARIOS), "--json"]) == 0
    names = [s["name"] for s in json.loads(capsys.readouterr().out)["scenarios"]]
    assert "task_queue_enable_2" in names and len(names) >= 24
    assert main(["scenario", "list", REFUSED, "--markdown"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| scenario | kind | what happens | expected |")
    assert "| `replay_before_capture` | device |" in out
