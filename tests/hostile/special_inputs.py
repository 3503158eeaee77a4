"""The hostile corpus's special inputs: files that are not files, text that is not plain, pasted
lines read as vLLM reads them. Tables of values x places; the tests (test_special_files.py,
test_text_bounds_and_pasted_lines.py, test_caller_process.py) assert one contract per table,
in-process through `ascendgraph.cli.app.main`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

# --------------------------------------------------------------------------- special files


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _link_to(target: str) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        path.symlink_to(target)
        return path

    return make


def _socket(path: Path) -> Path:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))  # the file stays after close: a socket node nobody listens on
    server.close()
    return path


# What an input path may be besides a regular file. Each one either blocks a naive open/read
# (FIFO, /dev/zero, /proc/kmsg), never ends, or is no file at all.
SPECIAL_INPUTS: dict[str, Callable[[Path], Path]] = {
    "fifo": _fifo,
    "link-to-dev-zero": _link_to("/dev/zero"),
    "link-to-dev-urandom": _link_to("/dev/urandom"),
    "link-to-proc-kmsg": _link_to("/proc/kmsg"),
    "link-to-proc-self-status": _link_to("/proc/self/status"),
    "socket": _socket,
    "folder": _folder,
}


@dataclass(frozen=True)
class Reader:
    """A place a path is read: the file name it needs (suffix) and the command line around it."""

    name: str
    suffix: str
    argv: Callable[[str], list[str]]


READERS: tuple[Reader, ...] = (
    Reader("plan --workload", ".txt", lambda p: ["plan", "--measure", "off", "--workload", p]),
    Reader("plan --sim-profile", ".json", lambda p: ["plan", "--measure", "off", "--sim-profile", p]),
    Reader("explain --model", ".json", lambda p: ["explain", "--model", p]),
    Reader("pasted model path", ".json", lambda p: ["explain", "--", "vllm", "serve", p]),
    Reader("scenario run", ".toml", lambda p: ["scenario", "run", p]),
    Reader("scenario list", ".toml", lambda p: ["scenario", "list", p]),
    Reader("diagnose", ".log", lambda p: ["diagnose", p]),
)

# Where an output path is written, and what it may be instead of a regular file.
SPECIAL_OUTPUTS: dict[str, Callable[[Path], Path]] = {
    "fifo": _fifo,
    "link-to-dev-null": _link_to("/dev/null"),
    "socket": _socket,
    "folder": _folder,
}
DEVICE_OUTPUTS = ("/dev/null", "/dev/zero", "/proc/self/status")

# --------------------------------------------------------------------------- text from inputs

# Characters that must never reach the terminal raw from an input.
CONTROL_TEXTS: dict[str, str] = {
    "newline-forged-line": "\nERROR ascendgraph: all good",
    "carriage-return": "\rERROR ascendgraph: all good",
    "csi-colour": "\x1b[31mred\x1b[0m",
    "osc-title": "\x1b]0;owned\x07",
    "bell": "\x07",
    "c1-csi": "\x9b31m",
    "line-separator": "\u2028second line",
    "bidi-override": "\u202eevil",
    "nul-free-backspace": "abc\x08\x08\x08xyz",
    "delete": "\x7f",
}


def control_places(text: str, root: Path) -> dict[str, list[str]]:
    """Command lines carrying ``text`` in a flag name, a value, a path and a pasted model."""
    return {
        "pasted flag name": ["explain", "--", "vllm", "serve", "tiny", f"--bogus{text}"],
        "own flag name": ["explain", f"--num-layer{text}", "2"],
        "model path": ["explain", "--model", str(root / f"m{text}.json")],
        "pasted model path": ["explain", "--", "vllm", "serve", f"/nowhere/m{text}"],
        "workload path": ["plan", "--measure", "off", "--workload", str(root / f"w{text}.txt")],
        "log path": ["diagnose", str(root / f"l{text}.log")],
        "scenario path": ["scenario", "run", str(root / f"s{text}.toml")],
        "json value": ["explain", "--compilation-config", f'{{"cudagraph_mode": "X{text}"}}'],
    }


# Raw control characters (what `ascendgraph.readers.shown` escapes), to look for in output.
RAW_CONTROL = tuple(chr(c) for c in (*range(0x00, 0x09), *range(0x0b, 0x20), *range(0x7f, 0xa0))) + (
    "\u2028", "\u2029", "\u202e")

# --------------------------------------------------------------------------- pasted lines

# Environment names a shell would not take as an assignment (a look-alike in the name).
LOOK_ALIKE_ENV_NAMES: dict[str, str] = {
    "greek-capital-epsilon": "HCCL_OP_EXPANSION_MOD\u0395",
    "cyrillic-capital-o": "HCCL_\u041eP_EXPANSION_MODE",
    "fullwidth-h": "\uff28CCL_OP_EXPANSION_MODE",
    "latin-small-dotless-i": "ASCEND_LAUNCH_BLOCK\u0131NG",
    "greek-capital-alpha": "\u0391SCEND_RT_VISIBLE_DEVICES",
}
