"""`plan` input checks: workload batch sizes above max_num_batched_tokens, and the --plot path
(checked before any work, exit 2 in one line; the PNG is written atomically)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import ascendgraph.cli.plan  # noqa: F401  (imported first: it binds make_plan before a test patches it)
import ascendgraph.tools.plan as plan_module
from ascendgraph.cli.app import main
from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.tools.plan import Workload, check_plot_path, make_plan, read_workload_file

OFF = ["--measure", "off"]


def _plan(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["plan", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _write(tmp_path: Path, text: str, name: str = "batches.txt") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# --------------------------------------------------------------------------- workload above the max


def test_a_batch_above_max_num_batched_tokens_is_named_by_line(tmp_path):
    path = _write(tmp_path, "8\n# big\n99999999999999999999\n")
    with pytest.raises(ConfigError) as info:
        read_workload_file(path, max_tokens=8192)
    message = str(info.value)
    assert message.startswith(f"{path}:3: batch size 99999999999999999999 is above max_num_batched_tokens (8192)")
    assert "--max-num-batched-tokens" in message
    assert read_workload_file(_write(tmp_path, "8192\n1\n", "ok.txt"), max_tokens=8192) == [8192, 1]


def test_cli_rejects_a_batch_above_the_configured_max_with_exit_2(tmp_path, capsys):
    path = _write(tmp_path, "4\n64\n")
    code, out, err = _plan(capsys, "--workload", path, "--max-num-batched-tokens", "32", *OFF)
    assert code == 2 and out == ""
    assert f"{path}:2: batch size 64 is above max_num_batched_tokens (32)" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err and "1e+" not in err


def test_cli_default_max_rejects_the_huge_line(tmp_path, capsys):
    path = _write(tmp_path, "99999999999999999999\n")
    code, _, err = _plan(capsys, "--workload", path, *OFF)
    assert code == 2 and f"{path}:1: batch size 99999999999999999999 is above max_num_batched_tokens (8192)" in err


def test_make_plan_checks_a_workload_given_as_a_value():
    workload = Workload(source="file", description="api", batch_sizes=[4, 10_000], counted=[4, 10_000])
    with pytest.raises(ConfigError, match=r"batch 2: batch size 10000 is above max_num_batched_tokens \(8192\)"):
        make_plan(GraphConfig(), workload, measure="off")
    fitting = Workload(source="file", description="api", batch_sizes=[4, 8192], counted=[4, 8192])
    assert make_plan(GraphConfig(), fitting, measure="off").workload is fitting


# --------------------------------------------------------------------------- --plot path


@pytest.fixture
def no_measuring(monkeypatch):
    """Fail the test if the plan is computed: a bad --plot must be refused before any work."""

    def refuse(*args, **kwargs):
        raise AssertionError("the plan was computed before --plot was checked")

    monkeypatch.setattr(plan_module, "make_plan", refuse)
    monkeypatch.setattr(ascendgraph.cli.plan, "make_plan", refuse)  # where the command looks it up


def _bad_plot_paths(tmp_path: Path) -> dict[str, tuple[str, str]]:
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    (tmp_path / "folder").mkdir()
    return {
        "empty": ("", "--plot needs the path of a PNG file to write, got ''"),
        "blank": ("  ", "--plot needs the path of a PNG file to write"),
        "parent is a file": (str(a_file / "waste.png"), f"{a_file} is a file, not a folder"),
        "parent missing": (str(tmp_path / "nope" / "waste.png"), f"folder {tmp_path / 'nope'} does not exist"),
        "path is a folder": (str(tmp_path / "folder"), "is a folder; give a file path in it"),
    }


@pytest.mark.parametrize("case", ["empty", "blank", "parent is a file", "parent missing", "path is a folder"])
def test_a_bad_plot_path_is_exit_2_in_one_line_before_any_work(tmp_path, capsys, no_measuring, case):
    pytest.importorskip("matplotlib")
    path, expected = _bad_plot_paths(tmp_path)[case]
    code, out, err = _plan(capsys, "--plot", path, "--requests", "2")
    assert code == 2, err
    assert out == "" and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert expected in err, err


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0, reason="root may write to any folder")
def test_an_unwritable_plot_folder_is_refused(tmp_path):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(ConfigError, match="is not writable"):
            check_plot_path(str(folder / "waste.png"))
    finally:
        folder.chmod(0o755)


def test_a_good_plot_path_passes(tmp_path):
    assert check_plot_path(str(tmp_path / "waste.png")) == str(tmp_path / "waste.png")
    (tmp_path / "old.png").write_bytes(b"old")
    assert check_plot_path(str(tmp_path / "old.png"))  # an existing file is replaced


def test_a_failed_png_write_leaves_no_file_behind(tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def broken_savefig(self, fname, *args, **kwargs):
        with open(fname, "wb") as handle:
            handle.write(b"\x89PNG partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", broken_savefig)
    target = tmp_path / "waste.png"
    code, out, err = _plan(capsys, "--plot", str(target), "--requests", "2", "--budget", "2", *OFF)
    assert code == 2 and out == ""
    assert f"--plot {target}: cannot write it: No space left on device" in err
    assert list(tmp_path.iterdir()) == [], "no partial or temporary file is left"
