"""Temporary files and folders in ascendgraph's caches: how they are named, and removing the
ones a killed process left behind.

Every cache entry is written to a temporary beside it and renamed into place
(`ascendgraph.readers.write_output`, `output_directory`, the static-kernel build's staging
folder), and the error paths remove the temporary. A process killed outright (SIGKILL, the
OOM killer, a power cut) runs no error path, so its temporary stays; the next run is correct
(it never reads a temporary), but nothing used to remove it.

Names. A temporary beside ``<name>`` is ``.<name>.tmp-<host>-<pid>.<random>[.tmp]``
(`temporary_prefix`): the writer's host name (letters and digits, anything else as ``_``) and
process id, so a later process can tell whose it is.

Sweep. `sweep_stale_temporaries(folder)` removes the temporaries of ``folder`` (not below it)
that are stale: written by a process of this host that no longer exists, or older than
`STALE_AFTER_S` (an hour; a write takes seconds), whoever wrote it — also the names older
versions used (a leading dot, or a ``.tmp`` ending: no cache entry is named so). A process
of another host (a cache folder shared over NFS) is never judged by its id, only by age.
`sweep_once` does it once per folder per process; each cache calls it when it is first used
(the compile cache, the traced-graph cache, the plan cache, the static-kernel builds), so
the next command that uses a cache cleans it. Removal is best effort: an entry that another
process removes first, or that cannot be removed, is left to the next sweep.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Optional, Union

__all__ = ["STALE_AFTER_S", "temporary_prefix", "is_temporary", "is_stale", "sweep_stale_temporaries", "sweep_once"]

STALE_AFTER_S = 3600.0
_MARKER = ".tmp-"
_OWNED = re.compile(r"\.tmp-(?P<host>[A-Za-z0-9_]*)-(?P<pid>[0-9]{1,10})\.")
_swept: set[str] = set()
_swept_lock = threading.Lock()


def _host() -> str:
    try:
        name = socket.gethostname()
    except OSError:
        name = ""
    return re.sub(r"[^A-Za-z0-9]", "_", name)[:64]


def temporary_prefix(name: str) -> str:
    """The prefix (for `tempfile.mkstemp` / `mkdtemp`) of a temporary beside ``name``."""
    return f".{name}{_MARKER}{_host()}-{os.getpid()}."


def is_temporary(name: str) -> bool:
    """Whether a name in a cache folder is a temporary (ours, or an older version's)."""
    return name.startswith(".") or name.endswith(".tmp")


def _owner_gone(name: str) -> bool:
    """The temporary names a process of this host that no longer runs."""
    match = _OWNED.search(name)
    if match is None or match.group("host") != _host():
        return False
    pid = int(match.group("pid"))
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OverflowError, OSError):
        return False  # it exists (another user's), or the id is not one this system has
    return False


def is_stale(entry: Union[os.DirEntry[str], Path], now: Optional[float] = None) -> bool:
    """A temporary whose writer is gone, or older than `STALE_AFTER_S`."""
    name = entry.name
    if not is_temporary(name):
        return False
    if _owner_gone(name):
        return True
    try:
        modified = entry.stat(follow_symlinks=False).st_mtime
    except OSError:
        return False
    return (time.time() if now is None else now) - modified > STALE_AFTER_S


def _remove(entry: os.DirEntry[str]) -> bool:
    try:
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)
        return True
    except FileNotFoundError:
        return False  # another process removed it first
    except OSError:
        return False


def sweep_stale_temporaries(folder: Union[str, os.PathLike[str]]) -> int:
    """Remove the stale temporaries directly in ``folder``; how many were removed."""
    removed = 0
    now = time.time()
    try:
        with os.scandir(folder) as entries:
            stale = [entry for entry in entries if is_stale(entry, now)]
    except OSError:  # no such folder yet, not a folder, not readable
        return 0
    for entry in stale:
        removed += _remove(entry)
    return removed


def sweep_once(folder: Union[str, os.PathLike[str]]) -> None:
    """`sweep_stale_temporaries` the first time this process uses ``folder``."""
    key = os.path.abspath(os.fspath(folder))
    with _swept_lock:
        if key in _swept:
            return
        _swept.add(key)
    sweep_stale_temporaries(key)
