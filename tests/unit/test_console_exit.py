"""The console script's exit (`ascendgraph.cli.console_main`): the command's status, its output
and the atexit handlers as at a normal exit, then ``os._exit`` instead of CPython's teardown
(`exit_without_teardown`); the normal exit where that teardown still has work (a live thread, a
stream that does not flush) and where the process is not the command's own (a profiler, ``-c``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ascendgraph.cli import _process_is_the_commands

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Each child reports on stderr when it leaves through os._exit (the fast way), then leaves.
PRELUDE = """
import atexit, io, os, sys, threading, time, weakref
real_exit = os._exit
def reporting_exit(code):
    os.write(2, b"fast exit %d\\n" % code)
    real_exit(code)
os._exit = reporting_exit
from ascendgraph.cli import exit_without_teardown, main
"""


def _console(body: str, *argv: str) -> subprocess.CompletedProcess[str]:
    script = PRELUDE + f"sys.argv = ['ascendgraph', *{list(argv)!r}]\n" + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": ROOT}, cwd=ROOT, timeout=120)


def test_the_status_output_and_exit_handlers_are_a_normal_exits_then_the_process_ends_at_once():
    done = _console("""
        class Box: pass
        box = Box()
        weakref.finalize(box, print, "finalizer ran")
        atexit.register(print, "handler ran")
        exit_without_teardown(main())
    """, "explain")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("model tiny")
    assert sorted(done.stdout.rstrip().splitlines()[-2:]) == ["finalizer ran", "handler ran"]
    assert done.stderr.endswith("fast exit 0\n")

    bad = _console("""
        atexit.register(print, "handler ran")
        exit_without_teardown(main())
    """, "run", "--num-layers", "-1")
    assert bad.returncode == 2 and "--num-layers" in bad.stderr and bad.stdout == "handler ran\n"
    assert bad.stderr.endswith("fast exit 2\n")


def test_a_thread_still_running_is_waited_for_the_normal_way():
    # The thread prints only after the command returned, so its line is last however slow the
    # command is on a loaded machine (a fixed 0.5 s head start raced `explain` there).
    done = _console("""
        returned = threading.Event()
        def late():
            returned.wait()
            time.sleep(0.2)
            print("thread finished", flush=True)
        threading.Thread(target=late).start()
        code = main()
        returned.set()
        exit_without_teardown(code)
    """, "explain")
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip().endswith("thread finished")
    assert "fast exit" not in done.stderr


def test_a_stream_that_does_not_flush_leaves_the_exit_to_python():
    done = _console("""
        class Closed(io.StringIO):
            def flush(self):
                raise ValueError("I/O operation on closed file")
        atexit.register(os.write, 2, b"handler ran\\n")
        sys.stdout = Closed()
        exit_without_teardown(3)
    """)
    assert done.returncode == 120  # CPython's status for an exit whose stdout does not flush
    assert "fast exit" not in done.stderr
    assert "handler ran" in done.stderr  # Python's own exit still runs them


SCRIPT = "/venv/bin/ascendgraph"


@pytest.mark.parametrize("orig_argv, ours", [
    (["python", "-m", "ascendgraph", "run"], True),
    (["python", "-mascendgraph", "run"], True),
    (["python", "-X", "importtime", "-W", "error", "-m", "ascendgraph.__main__"], True),
    (["python", SCRIPT, "run"], True),
    (["python", "-I", SCRIPT, "run"], True),
    (["python", "-m", "cProfile", "-o", "out", "-m", "ascendgraph", "run"], False),
    (["python", "-m", "pdb", SCRIPT, "run"], False),
    (["python", "-c", "import ascendgraph.cli as c; c.console_main()"], False),
    (["python", "-", "run"], False),
    (["python", "/elsewhere/wrapper.py", "run"], False),
    (["python"], False),
])
def test_only_the_commands_own_process_is_ended_early(orig_argv, ours):
    assert _process_is_the_commands(orig_argv, script=SCRIPT) is ours


def test_a_profiler_running_the_module_in_process_gets_control_back(tmp_path: Path):
    profile = tmp_path / "explain.prof"
    done = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "ascendgraph", "explain"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, cwd=tmp_path,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert profile.stat().st_size > 0  # written by cProfile after the module returned
