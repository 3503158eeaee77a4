"""CLI output hygiene: one-line Python warnings, no empty profile folder left behind by a failed run."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ascendgraph.cli import app as cli

from ascendgraph.cli import profile as profile_cli
from ascendgraph.cli.app import format_warning, main
from ascendgraph.compile.static_kernel import STATIC_KERNEL_BUILD_WARNING


def test_format_warning_is_one_line_without_the_source():
    text = format_warning(UserWarning(STATIC_KERNEL_BUILD_WARNING.format(path="/cache/x")), UserWarning,
                          "/work/ascendgraph/compile/static_kernel.py", 325, "warnings.warn(...)")
    assert text == "WARNING ascendgraph: Starting static kernel compilation, the build directory is /cache/x\n"


def test_the_formatter_is_installed_only_while_a_command_runs(monkeypatch, capsys):
    seen: list[str] = []

    def probe(args) -> int:
        seen.append(warnings.formatwarning("hello", UserWarning, "/src/file.py", 7))
        return 0

    before = warnings.formatwarning
    listed = cli.commands()
    monkeypatch.setattr(cli, "commands", lambda: [*listed, cli.Command("probe", "", "", lambda p: None, probe)])
    assert main(["probe"]) == 0
    assert seen == ["WARNING ascendgraph: hello\n"]
    assert warnings.formatwarning is before  # restored: importing or calling main leaves no trace


def test_the_static_kernel_notice_prints_as_one_line(tmp_path):
    env = {**os.environ, "ASCENDGRAPH_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "ascendgraph", "run", "--num-layers", "1", "--requests", "1", "-q",
         "-cc", '{"cudagraph_mode":"FULL_DECODE_ONLY","cudagraph_capture_sizes":[1,2]}',
         "--additional-config", '{"ascend_compilation_config":{"enable_static_kernel":true}}'],
        capture_output=True, text=True, timeout=300, env=env,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "Starting static kernel compilation" in line]
    assert len(lines) == 1
    assert lines[0].startswith("WARNING ascendgraph: Starting static kernel compilation, the build directory is ")
    assert "static_kernel.py" not in done.stderr and "UserWarning" not in done.stderr


# ---------------------------------------------------------------- profile folder


def _failing_run(make: Path | None):
    def run_command(args, on_report=None) -> int:
        if make is not None:
            make.mkdir(parents=True, exist_ok=True)
        return 1

    return run_command


def test_a_failed_profile_removes_the_empty_folder_it_created(tmp_path, monkeypatch, capsys):
    target = tmp_path / "new" / "profile"
    monkeypatch.setattr(profile_cli, "run_command", _failing_run(target / "host_1_ascend_pt" / "OUT"))
    assert main(["profile", "--profile-dir", str(target)]) == 1
    assert not (tmp_path / "new").exists()


def test_a_failed_profile_keeps_a_folder_that_existed(tmp_path, monkeypatch, capsys):
    target = tmp_path / "existing"
    target.mkdir()
    monkeypatch.setattr(profile_cli, "run_command", _failing_run(target / "sub"))
    assert main(["profile", "--profile-dir", str(target)]) == 1
    assert target.is_dir()


def test_a_failed_profile_keeps_written_files(tmp_path, monkeypatch, capsys):
    target = tmp_path / "new"

    def run_command(args, on_report=None) -> int:
        target.mkdir()
        (target / "trace_view.json").write_text("{}")
        return 1

    monkeypatch.setattr(profile_cli, "run_command", run_command)
    assert main(["profile", "--profile-dir", str(target)]) == 1
    assert (target / "trace_view.json").is_file()


def test_a_failed_profile_with_bad_input_cleans_up_too(tmp_path, monkeypatch, capsys):
    from ascendgraph.errors import ConfigError

    target = tmp_path / "new"

    def run_command(args, on_report=None) -> int:
        target.mkdir()
        raise ConfigError("bad")

    monkeypatch.setattr(profile_cli, "run_command", run_command)
    assert main(["profile", "--profile-dir", str(target)]) == 2
    assert not target.exists()


@pytest.mark.parametrize("holds_file", [False, True])
def test_remove_if_empty(tmp_path, holds_file):
    (tmp_path / "a" / "b").mkdir(parents=True)
    if holds_file:
        (tmp_path / "a" / "b" / "f").write_text("x")
    assert profile_cli.remove_if_empty(tmp_path / "a") is not holds_file
    assert (tmp_path / "a").exists() is holds_file


@pytest.mark.parametrize("argv", [
    ["run", "--json", "-O", "4"],
    ["explain", "--json", "--max-num-seqs", "0"],
    ["diagnose", "--json", "/nonexistent/vllm.log"],
    ["plan", "--json", "--jsn"],
])
def test_bad_input_under_json_still_prints_one_error_document(capsys, argv):
    import json as _json

    from ascendgraph.cli.app import main as _main

    assert _main(argv) == 2
    out, err = capsys.readouterr()
    document = _json.loads(out)
    assert document["exit_code"] == 2 and document["error"]["message"] in err
    assert document["error"]["type"]


def test_json_inside_a_pasted_line_does_not_count(capsys):
    from ascendgraph.cli.app import main as _main

    assert _main(["explain", "--", "vllm", "serve", "m", "--json"]) == 2
    assert capsys.readouterr().out == ""
