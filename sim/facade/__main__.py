"""``python -m sim.facade -- CMD ...``: run CMD with the facade in place of torch_npu.

CMD and every Python subprocess it starts find ``torch_npu`` in a directory put first on
PYTHONPATH (``sim/facade/shim``), whose package installs the facade; the project root is
put on PYTHONPATH too, so ``sim`` is importable without an install. One line on stderr
says the facade is active (and which installed torch_npu it shadows); the exit status
is CMD's, as a shell reports it (128+N when signal N ended CMD; 127 when CMD is not found, 126
when it cannot be executed, with one line on stderr). SIGTERM, SIGHUP and SIGINT sent to the
launcher are passed on to CMD and the launcher waits for it, so CMD is never left running
orphaned (a terminal's Ctrl-C reaches CMD directly and is not passed on a second time).

"npu" is a torch device in CMD (`sim.npu_device`); ``--npu-device``, which once asked for
that, is still accepted and changes nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

from sim.facade import NOTICE_VARIABLE, notice_text, real_torch_npu_location

SHIM = Path(__file__).resolve().parent / "shim"
ROOT = Path(__file__).resolve().parents[2]
USAGE = "usage: python -m sim.facade -- CMD [ARG ...]  (runs CMD with the simulator's torch_npu facade)"
LEGACY_FLAGS = ("--npu-device",)  # the npu device is the facade's normal behaviour now


def facade_environment(environ: dict[str, str]) -> dict[str, str]:
    """The environment CMD runs in."""
    env = dict(environ)
    parts = [str(SHIM), str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"  # torch must not import a real torch_npu by itself
    env[NOTICE_VARIABLE] = "announced"
    return env


# The signals a launcher passes on to CMD, as a supervisor does (a shell's job would leave CMD
# running when its parent is terminated).
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
# What a shell answers when CMD cannot be run (POSIX "Command Search and Execution").
NOT_FOUND, CANNOT_EXECUTE = 127, 126


def _terminal_sends_sigint_to_cmd_too() -> bool:
    """True when a terminal's foreground process group is ours: its Ctrl-C reaches CMD directly
    (CMD is in our group), so forwarding it would deliver it twice."""
    for fd in (0, 1, 2):
        try:
            if os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


def exit_status(returncode: int) -> int:
    """CMD's status as a shell reports it: 128+N when a signal N ended it."""
    return 128 - returncode if returncode < 0 else returncode


def unrunnable(command: str, path: Optional[str]) -> Optional[OSError]:
    """Why ``command`` cannot be started (looked up as a shell does), or None."""
    if os.sep not in command:
        return None if shutil.which(command, path=path) else FileNotFoundError(errno.ENOENT, "command not found")
    if not os.path.exists(command):
        return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT))
    if os.path.isdir(command):
        return IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR))
    if not os.access(command, os.X_OK):
        return PermissionError(errno.EACCES, os.strerror(errno.EACCES))
    return None


def cannot_run(command: str, error: OSError) -> int:
    """One line on stderr and a shell's status for a CMD that cannot be started: 127 when it
    is not found, 126 when it cannot be executed."""
    print(f"sim.facade: {command}: {error.strerror or error}", file=sys.stderr)
    return NOT_FOUND if isinstance(error, FileNotFoundError) else CANNOT_EXECUTE


def run(argv: list[str], env: dict[str, str]) -> int:
    """Run CMD and wait for it; SIGTERM, SIGHUP and SIGINT to the launcher are passed on to CMD
    (a terminal's Ctrl-C reaches CMD by itself), so CMD is never left running on its own."""
    child: Optional[subprocess.Popen] = None
    pending: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and _terminal_sends_sigint_to_cmd_too():
            return
        if child is None:
            pending.append(signum)
        elif child.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED}
    try:
        try:
            child = subprocess.Popen(argv, env=env)
        except OSError as error:
            return cannot_run(argv[0], error)
        for signum in pending:
            forward(signum, None)
        return exit_status(child.wait())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str]) -> int:
    while argv and argv[0] in LEGACY_FLAGS:
        argv = argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    env = facade_environment(dict(os.environ))
    problem = unrunnable(argv[0], env.get("PATH"))
    if problem is not None:
        return cannot_run(argv[0], problem)
    print(notice_text(real_torch_npu_location()), file=sys.stderr, flush=True)
    return run(argv, env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
