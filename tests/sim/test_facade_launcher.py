"""``python -m sim.facade -- CMD``: signals sent to the launcher reach CMD and the launcher
waits for it; its exit status is CMD's as a shell reports it (128+N for a signal, 126 / 127
when CMD cannot be run, with one line on stderr and no traceback). Real subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# CMD: says its pid, then waits; a forwarded signal is written down and ends it with status 7.
WAITER = """
import os, signal, sys, time
def caught(signum, frame):
    open(sys.argv[1], "w").write(signal.Signals(signum).name)
    sys.exit(7)
for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    signal.signal(signum, caught)
print(os.getpid(), flush=True)
time.sleep(120)
"""


def launcher(*cmd: str, **options: object) -> subprocess.Popen:
    # A session of its own: no controlling terminal, so a SIGINT to the launcher is not one a
    # terminal also delivered to CMD (when pytest itself runs in a terminal).
    return subprocess.Popen([sys.executable, "-m", "sim.facade", "--", *cmd], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            **options)  # type: ignore[call-overload]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_a_signal_to_the_launcher_reaches_cmd_and_the_launcher_waits_for_it(tmp_path: Path, signum: int) -> None:
    caught = tmp_path / "caught"
    process = launcher(sys.executable, "-c", WAITER, str(caught))
    try:
        assert process.stdout is not None
        child = int(process.stdout.readline())
        process.send_signal(signum)
        code = process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 7, process.stderr.read() if process.stderr else ""
    assert caught.read_text() == signal.Signals(signum).name
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:  # reaped by the launcher: gone at once
        time.sleep(0.05)
    assert not alive(child)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL, signal.SIGINT], ids=lambda s: s.name)
def test_a_cmd_ended_by_signal_n_makes_the_launcher_exit_128_plus_n(signum: int) -> None:
    done = subprocess.run([sys.executable, "-m", "sim.facade", "--", sys.executable, "-c",
                           f"import os, signal; signal.signal({int(signum)}, signal.SIG_DFL) if {int(signum)} != 9 else None; "
                           f"os.kill(os.getpid(), {int(signum)})"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 128 + signum, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("kind,status,reason", [
    ("folder", 126, "Is a directory"),
    ("not executable", 126, "Permission denied"),
    ("missing path", 127, "No such file or directory"),
    ("missing command", 127, "command not found"),
])
def test_a_cmd_that_cannot_run_is_one_line_and_a_shells_status(tmp_path: Path, kind: str, status: int, reason: str) -> None:
    plain = tmp_path / "plain.sh"
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    command = {"folder": str(tmp_path), "not executable": str(plain), "missing path": str(tmp_path / "absent"),
               "missing command": "ascendgraph-no-such-command"}[kind]
    done = subprocess.run([sys.executable, "-m", "sim.facade", "--", command], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == status
    assert done.stderr == f"sim.facade: {command}: {reason}\n"


def test_the_launcher_process_imports_neither_torch_nor_the_simulator_and_cmd_gets_both() -> None:
    # -X importtime lists on stderr every module the launcher process imports (CMD's own list
    # would follow on the same stderr; CMD here prints what it has on stdout instead).
    probe = "import sys, torch_npu; print('torch' in sys.modules, 'sim.device' in sys.modules)"
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "sim.facade", "--", sys.executable, "-c", probe],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}
    assert {"sim", "sim.facade", "sim.launcher_process"} <= imported
    assert not imported & {"torch", "sim.device", "sim.kernels", "sim.facade.runtime", "ascendgraph"}
    assert done.stdout.split() == ["True", "True"]  # CMD imports torch_npu (the facade) whole


@pytest.mark.parametrize(("orig_argv", "module"), [
    (["python", "-m", "sim.facade", "--", "x"], "sim.facade"),
    (["python", "-msim.facade"], "sim.facade"),
    (["python", "-W", "error", "-X", "importtime", "-m", "sim.facade.__main__"], "sim.facade.__main__"),
    (["python", "-I", "-m", "pytest", "-m", "sim.facade"], "pytest"),
    (["python", "-c", "import sim", "-m", "sim.facade"], None),
    (["python", "script.py", "-m", "sim.facade"], None),
    (["python"], None),
])
def test_the_module_run_with_dash_m_is_read_as_the_interpreter_reads_it(orig_argv: list[str],
                                                                         module: object) -> None:
    from sim.launcher_process import module_after_dash_m

    assert module_after_dash_m(orig_argv) == module

