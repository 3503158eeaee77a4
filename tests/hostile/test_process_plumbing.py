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


# The child runs find the traced graph in the worker's compile cache after the first
# (tests/conftest.py, `worker_compile_cache`): what is interrupted here is the command, not the trace.
pytestmark = pytest.mark.usefixtures("worker_compile_cache")


@pytest.fixture(autouse=True)
def _children_take_ctrl_c_as_from_a_terminal():
    """A shell without job control starts background commands with SIGINT ignored, and an
    ignored signal stays ignored across exec: a test run started that way (``.ci/run &`` in a
    script, ``nohup``) would give every child here an ignored Ctrl-C, which no process can see.
    The children get Python's own handler, as a command started from a terminal has."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    if previous is signal.SIG_IGN:
        signal.signal(signal.SIGINT, previous)


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


# Ctrl-C at other points of a real process. Each child signals where it is on stderr before
# the test sends SIGINT, so the outcome does not depend on how busy the machine is: wherever
# the signal lands after that line, the answer is exit 130 without a traceback.

STAGED = """
import sys, time
import ascendgraph.cli
from ascendgraph.cli import app, streams

stage = sys.argv[1]
sys.argv = ["ascendgraph", "run", "--num-layers", "1", "--requests", "2", "-cc",
            '{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2]}']

def say(line):
    sys.stderr.write(line + "\\n")
    sys.stderr.flush()

if stage == "torch import":
    whole = app._import_torch_whole

    def importing():
        say("importing torch")
        whole()

    app._import_torch_whole = importing
elif stage == "after the report":
    write = streams.write_stdout

    def reported(text):
        write(text)
        if "result" in text:
            say("reported")
            time.sleep(60)

    streams.write_stdout = reported
code = ascendgraph.cli.main()
if stage == "after main returned":
    say("returned")
    time.sleep(60)
sys.exit(code)
"""


@pytest.mark.parametrize("stage, ready", [("torch import", b"importing torch\n"), ("after the report", b"reported\n"),
                                          ("after main returned", b"returned\n")],
                         ids=["torch-import", "after-the-report", "after-main-returned"])
def test_ctrl_c_at_each_stage_is_exit_130_without_a_traceback(stage: str, ready: bytes) -> None:
    process = subprocess.Popen([sys.executable, "-c", STAGED, stage], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=_env())
    assert process.stderr is not None
    seen = []
    for line in process.stderr:
        seen.append(line)
        if line == ready:
            break
    assert seen and seen[-1] == ready, b"".join(seen).decode()[-2000:]
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=300)
    assert process.returncode == INTERRUPTED, (b"".join(seen) + rest).decode()[-2000:]
    assert b"Traceback" not in rest and b"KeyboardInterrupt" not in rest and b"Exception ignored" not in rest, \
        rest.decode()[-2000:]


def test_ctrl_c_very_early_in_start_up_is_never_exit_0() -> None:
    # No readiness line to wait for: the signal lands in the interpreter's start-up or in the
    # first imports. Before Python installs its handler the process dies of SIGINT (-2, what a
    # shell reports as 130); after, the command line turns it into 130.
    for _ in range(3):
        process = subprocess.Popen([*COMMAND, "explain"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                   env=_env())
        process.send_signal(signal.SIGINT)
        process.communicate(timeout=300)
        assert process.returncode in (INTERRUPTED, -signal.SIGINT)


def test_a_caught_interrupt_that_ended_a_string_exec_still_exits_with_mains_code(tmp_path: Path) -> None:
    # CPython remembers a KeyboardInterrupt that ended a string exec (torch runs generated code
    # that way) and, under `python -m`, dies by SIGINT at exit even though main answered 130.
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys\n"
        "import ascendgraph.cli\n"
        "from ascendgraph.cli import app\n\n"
        "def interrupted(argv):\n"
        "    exec('raise KeyboardInterrupt', {})\n\n"
        "app._main = interrupted\n"
        "sys.exit(ascendgraph.cli.main())\n")
    env = {**_env(), "PYTHONPATH": str(tmp_path) + os.pathsep + _env()["PYTHONPATH"]}
    result = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], capture_output=True, env=env, timeout=300)
    assert result.returncode == INTERRUPTED, result.stderr.decode()[-2000:]
    assert result.stderr.decode() == "ascendgraph: interrupted\n"
