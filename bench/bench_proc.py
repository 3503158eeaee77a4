"""Process-level measurements: a command's wall time and peak RSS, and a machine load the
bench makes itself.

* `run_measured` starts a command, waits for it with ``os.wait4`` and returns its wall time,
  CPU time and peak resident set size (``ru_maxrss`` of that child alone, not of every child
  the bench ever waited for).
* `busy_load` starts one busy process per core (a Python loop that never sleeps) and stops
  exactly those processes, by id, when the block ends: the "loaded machine" of the
  API-vs-CLI row (docs/decisions.md "Performance figures"), whatever else the machine happens to be doing.

No assertions here: these are measurements.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Iterator, Mapping, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUSY_CODE = "while True:\n    pass\n"


@dataclass(frozen=True)
class ProcessFigures:
    """What one finished command cost."""

    command: str
    exit_code: int
    wall_s: float
    cpu_s: float  # user + system of the child
    peak_rss_bytes: int
    stdout_tail: str
    stderr_tail: str


def _tail(path: str, lines: int = 6) -> str:
    with open(path, encoding="utf-8", errors="replace") as handle:
        return "\n".join(handle.read().strip().splitlines()[-lines:])


def run_measured(argv: Sequence[str], *, env: Optional[Mapping[str, str]] = None, cwd: str = ROOT,
                 timeout_s: float = 3600.0) -> ProcessFigures:
    """Run ``argv`` to completion; wall time, CPU time and peak RSS of that process."""
    with tempfile.TemporaryDirectory(prefix="ascendgraph-bench-") as scratch:
        out_path, err_path = os.path.join(scratch, "out"), os.path.join(scratch, "err")
        with open(out_path, "w") as out, open(err_path, "w") as err:
            start = time.perf_counter()
            process = subprocess.Popen(list(argv), cwd=cwd, env=dict(env) if env is not None else None,
                                       stdout=out, stderr=err, stdin=subprocess.DEVNULL)
            deadline = start + timeout_s
            while True:
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid:
                    break
                if time.perf_counter() > deadline:
                    process.kill()
                    pid, status, usage = os.wait4(process.pid, 0)
                    break
                time.sleep(0.02)
            wall = time.perf_counter() - start
            process.returncode = os.waitstatus_to_exitcode(status)  # keep Popen from waiting again
        return ProcessFigures(
            command=" ".join(argv),
            exit_code=process.returncode,
            wall_s=wall,
            cpu_s=usage.ru_utime + usage.ru_stime,
            peak_rss_bytes=int(usage.ru_maxrss) * 1024,  # Linux reports KiB
            stdout_tail=_tail(out_path),
            stderr_tail=_tail(err_path),
        )


def python_command(*args: str) -> list[str]:
    return [sys.executable, *args]


@contextlib.contextmanager
def busy_load(processes: Optional[int] = None) -> Iterator[list[int]]:
    """One busy process per core (or ``processes``) for the duration of the block."""
    count = processes if processes is not None else (os.cpu_count() or 1)
    started = [subprocess.Popen([sys.executable, "-c", BUSY_CODE], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(count)]
    try:
        time.sleep(0.2)  # let them start spinning
        yield [p.pid for p in started]
    finally:
        for process in started:  # stop exactly the processes started here
            if process.poll() is None:
                process.send_signal(signal.SIGKILL)
        for process in started:
            process.wait()
