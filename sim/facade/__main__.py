"""``python -m sim.facade -- CMD ...``: run CMD with the facade in place of torch_npu.

CMD and every Python subprocess it starts find ``torch_npu`` in a directory put first on
PYTHONPATH (``sim/facade/shim``), whose package installs the facade; the project root is
put on PYTHONPATH too, so ``sim`` is importable without an install. One line on stderr
says the facade is active (and which installed torch_npu it shadows); the exit status
is CMD's. "npu" is a torch device in CMD (`sim.npu_device`); ``--npu-device``, which once
asked for that, is still accepted and changes nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


def main(argv: list[str]) -> int:
    while argv and argv[0] in LEGACY_FLAGS:
        argv = argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    print(notice_text(real_torch_npu_location()), file=sys.stderr, flush=True)
    try:
        return subprocess.call(argv, env=facade_environment(dict(os.environ)))
    except FileNotFoundError:
        print(f"sim.facade: command not found: {argv[0]}", file=sys.stderr)
        return 127
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
