"""Every command puts its result on stdout and everything else (logs, progress, warnings,
errors) on stderr, as git, cargo, kubectl and pytest do; with ``--json`` stdout holds the
document alone and the human report is not printed at all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascendgraph.cli.app import main

TESTS = Path(__file__).resolve().parents[1]
LOG = str(TESTS / "data" / "logs" / "stream_207008_offline.log")
SCENARIO = str(TESTS / "scenarios" / "planner_n_sizes_fit.toml")
# Where stdout and stderr go does not depend on how many sizes are captured: two sizes
# instead of the default 35 keep the run (and profile) cheap.
SMALL_RUN = ["--num-layers", "1", "--requests", "1", "-cc", '{"cudagraph_capture_sizes":[1,2]}']

# command line -> a line of its human result (which must be on stdout, and absent under --json)
COMMANDS = {
    "explain": (["explain"], "effective"),
    "run": (["run", *SMALL_RUN], "ascendgraph run:"),
    "plan": (["plan", "--measure", "off", "--requests", "2"], "plan: model"),
    "doctor": (["doctor"], "HCCL_OP_EXPANSION_MODE"),
    "diagnose": (["diagnose", LOG], "207008"),
    "scenario list": (["scenario", "list", SCENARIO], "1 scenarios"),
}


def _call(capsys, argv: list[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)


@pytest.mark.parametrize("name", COMMANDS)
def test_the_result_goes_to_stdout_and_only_the_result(capsys, name):
    argv, marker = COMMANDS[name]
    code, out, err = _call(capsys, argv)
    assert code in (0, 1), err
    assert marker in out
    assert marker not in err
    assert not [line for line in out.splitlines() if line.startswith(("INFO ", "WARNING ", "ERROR ", "warning:"))]


@pytest.mark.parametrize("name", [n for n in COMMANDS if n != "scenario list"])
def test_with_json_stdout_is_one_document_and_the_report_is_not_printed(capsys, name):
    argv, marker = COMMANDS[name]
    code, out, err = _call(capsys, [*argv, "--json"])
    assert code in (0, 1), err
    document = json.loads(out)  # the whole of stdout is one JSON document
    assert isinstance(document, dict)
    assert marker not in err, f"the human report went to stderr under --json:\n{err}"


def test_scenario_list_json_is_one_document(capsys):
    code, out, err = _call(capsys, ["scenario", "list", SCENARIO, "--json"])
    assert code == 0, err
    assert json.loads(out)["scenarios"][0]["name"] == "planner_n_sizes_fit"
    assert err == ""


def test_profile_prints_its_summary_on_stdout_and_logs_on_stderr(capsys, tmp_path):
    code, out, err = _call(capsys, ["profile", *SMALL_RUN, "--profile-dir", str(tmp_path / "prof")])
    assert code == 0, err
    assert "ascendgraph run:" in out and "top kernel types by device time" in out
    assert "top kernel types" not in err


def test_errors_go_to_stderr_and_stdout_stays_empty(capsys):
    code, out, err = _call(capsys, ["explain", "--max-num-seqs", "0"])
    assert code == 2
    assert out == ""
    assert "ascendgraph explain: error:" in err


def test_logs_share_one_format(capsys):
    # A warning of the resolution, a log of the CLI and one of the engine: one style for all.
    code, out, err = _call(capsys, ["run", *SMALL_RUN, "-cc", '{"cudagraph_mode": "FULL"}', "--attention-backend",
                                    "mla"])
    assert code == 0, err
    lines = [line for line in err.splitlines() if line.strip()]
    logged = [line for line in lines if line.split(" ", 1)[0] in ("INFO", "WARNING", "ERROR", "DEBUG")]
    assert {line.split(" ", 1)[0] for line in logged} >= {"INFO", "WARNING"}, err
    for line in logged:
        assert line.startswith(("INFO ascendgraph: ", "WARNING ascendgraph: ", "ERROR ascendgraph: ",
                                "DEBUG ascendgraph: ")), line
    assert not any(line.startswith("warning:") for line in lines)
