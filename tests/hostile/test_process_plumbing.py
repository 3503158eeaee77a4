"""Output plumbing, the only part of the corpus that needs real processes: a reader that
closes the pipe, stdout on a full device or closed, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import ascendgraph.cli
from ascendgraph.cli.app import INTERRUPTED, PIPE_CLOSED

COMMAND = [sys.executable, "-m", "ascendgraph"]


def _env() -> dict[str, str]:
    root = str(Path(ascendgraph.cli.__file__).resolve().parents[2])
    return {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}


def test_a_closed_pipe_ends_the_command_quietly():
    # `ascendgraph explain --json | true`: the reader is gone before the document is written.
    read_end, write_end = os.pipe()
    os.close(read_end)
    result = subprocess.run([*COMMAND, "explain", "--json"], stdout=write_end, stderr=subprocess.PIPE,
                            env=_env(), timeout=300)
    os.close(write_end)
    assert result.returncode == PIPE_CLOSED
    assert result.stderr == b"", result.stderr.decode()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_on_a_full_device_is_one_line_and_exit_1():
    with open("/dev/full", "w") as full:
        result = subprocess.run([*COMMAND, "explain", "--json"], stdout=full, stderr=subprocess.PIPE, env=_env(),
                                timeout=300)
    err = result.stderr.decode()
    assert result.returncode == 1
    assert err.splitlines() == ["ascendgraph: error: cannot write to stdout: No space left on device"], err


def test_a_closed_stdout_is_one_line_and_exit_1():
    result = subprocess.run([*COMMAND, "explain", "--json"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            env=_env(), timeout=300, pass_fds=(), preexec_fn=lambda: os.close(1))
    err = result.stderr.decode()
    assert result.returncode == 1
    assert err.splitlines() == ["ascendgraph: error: cannot write to stdout: stdout is closed"], err


def test_ctrl_c_during_a_run_is_exit_130_without_a_traceback():
    process = subprocess.Popen([*COMMAND, "run", "--requests", "1000", "--num-layers", "1", "-v"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=_env())
    assert process.stderr is not None
    process.stderr.readline()  # the command is running (its first log line), not still starting Python
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=300)
    assert process.returncode == INTERRUPTED
    assert b"Traceback" not in rest and b"KeyboardInterrupt" not in rest, rest.decode()[-2000:]


def test_ctrl_c_while_the_command_line_loads_is_exit_130(monkeypatch, capsys):
    # The first instant: the interrupt arrives while `ascendgraph.cli.app` is being imported.
    import builtins

    real_import = builtins.__import__

    def interrupted_import(name, *args, **kwargs):
        if name == "ascendgraph.cli.app":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupted_import)
    assert ascendgraph.cli.main(["explain"]) == INTERRUPTED
    assert capsys.readouterr().err == "ascendgraph: interrupted\n"


def test_ctrl_c_inside_main_is_exit_130(monkeypatch, capsys):
    from ascendgraph.cli import app

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(app, "build_parser", interrupted)
    assert app.main(["explain"]) == INTERRUPTED
    assert capsys.readouterr().err == "ascendgraph: interrupted\n"


def test_any_failed_write_to_stdout_is_one_line_and_exit_1(monkeypatch, capsys):
    # Not only a full device or a closed descriptor: whatever OSError the write raises (here an
    # I/O error) is the command's stdout failing (a StdoutWriteError), reported on one line.
    import errno

    from ascendgraph.cli import app

    class FailingStdout:
        def write(self, text: str) -> int:
            raise OSError(errno.EIO, "Input/output error")

        def flush(self) -> None:
            return None

    monkeypatch.setattr(sys, "stdout", FailingStdout())
    assert app.main(["explain", "--json"]) == 1
    assert capsys.readouterr().err == "ascendgraph: error: cannot write to stdout: Input/output error\n"
