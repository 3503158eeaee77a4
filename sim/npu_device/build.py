"""Building the npu device's C++ extension: once per machine, into the cache, atomically.

Why. The simulated NPU is a PrivateUse1 device, which torch only accepts from C++
(allocator, device guard, hooks: ``csrc/npu_device.cpp``). The binary is never committed:
it is compiled from source on first use (``torch.utils.cpp_extension.load`` with ninja and
the system's g++) and reused by every later process.

Where. ``<cache>/npu-device-<key>/`` with ``<cache>`` = ``$ASCENDGRAPH_CACHE_DIR`` (else
``~/.cache/ascendgraph``, `ascendgraph.readers.user_cache_root`) and ``<key>`` a hash of the
sources, torch's version, Python's version and the flags: an edit of the C++ or another
torch builds anew, nothing else does. ``$ASCENDGRAPH_DOWNLOAD_CACHE_DIR``, where set, comes
first: the test suite gives every test a temporary ``ASCENDGRAPH_CACHE_DIR`` and points that
variable at the persistent cache, for artifacts that are expensive and immutable (the root
conftest), so a test run builds the extension at most once per machine.

Concurrency. pytest-xdist workers start together. One builds while the others wait on a
lock file (``npu-device-<key>.lock``, ``fcntl.flock``); the build happens in a temporary
directory renamed into place when it is complete, so no process ever loads a half-written
library. A build killed outright leaves its staging directory (``npu-device-<key>.build-*``);
the next build of that key removes it under the lock (`_remove_killed_builds`), where no
other process can be building into it. Ctrl-C removes it at once.

Failure. `NpuDeviceBuildError` is one line: the first compiler error and the build
directory (kept, with the full log in ``build.log``). The process remembers the failure
(no second attempt); nothing else of the simulator needs the extension.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib.machinery
import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Iterator, Optional, Sequence

import torch

from ascendgraph.errors import DeviceUnavailable
from ascendgraph.readers import user_cache_root

__all__ = ["EXTENSION_NAME", "SOURCES", "CFLAGS", "NpuDeviceBuildError", "build_key", "build_directory", "load_extension"]

EXTENSION_NAME = "ascendgraph_npu_device"
SOURCES: tuple[Path, ...] = (Path(__file__).resolve().parent / "csrc" / "npu_device.cpp",)
# -O1: the file is glue (every hot loop is a CPU kernel of torch's); it halves the compile time.
CFLAGS: tuple[str, ...] = ("-O1", "-w")
BUILD_LOG = "build.log"


class NpuDeviceBuildError(DeviceUnavailable):
    """The npu device's extension did not build (one line: the compiler's error, the directory)."""


def build_key(sources: Sequence[Path] = SOURCES, cflags: Sequence[str] = CFLAGS) -> str:
    digest = hashlib.sha256()
    for source in sources:
        digest.update(source.name.encode())
        digest.update(source.read_bytes())
    digest.update(torch.__version__.encode())
    digest.update(sys.version.encode())
    digest.update(" ".join(cflags).encode())
    return digest.hexdigest()[:16]


DOWNLOAD_CACHE_VARIABLE = "ASCENDGRAPH_DOWNLOAD_CACHE_DIR"


def default_cache_root() -> str:
    persistent = os.environ.get(DOWNLOAD_CACHE_VARIABLE, "").strip()
    return os.path.expanduser(persistent) if persistent else user_cache_root()


def build_directory(cache_root: Optional[str] = None, sources: Sequence[Path] = SOURCES) -> Path:
    return Path(cache_root or default_cache_root()) / f"npu-device-{build_key(sources)}"


def _library_in(directory: Path) -> Optional[Path]:
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    for path in sorted(directory.glob(f"{EXTENSION_NAME}*")):
        if any(path.name.endswith(suffix) for suffix in suffixes):
            return path
    return None


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def first_compiler_error(log: str) -> str:
    """The line a reader needs from a failed build's output: the first ``error:`` line."""
    for line in log.splitlines():
        if re.search(r"\berror\b:", line):
            return line.strip()
    for line in log.splitlines():
        if line.strip():
            return line.strip()
    return "no output"


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(EXTENSION_NAME, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules[EXTENSION_NAME] = module
    return module


def _staging_folders(target: Path) -> list[Path]:
    return sorted(target.parent.glob(target.name + ".build-*"))


def _remove_killed_builds(target: Path) -> None:
    """Staging folders of ``target`` left by builds that were killed (SIGKILL, the OOM killer):
    called under ``target``'s lock, so none of them belongs to a build still running."""
    for leftover in _staging_folders(target):
        shutil.rmtree(leftover, ignore_errors=True)


def _compile(target: Path, sources: Sequence[Path]) -> None:
    """Build into a temporary sibling of ``target`` (in a child process: loading the library
    there keeps this process free to load it once, from its final place) and rename it into
    place."""
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".build-", dir=target.parent))
    log_path = staging / BUILD_LOG
    command = [sys.executable, "-c", _BUILD_SCRIPT, EXTENSION_NAME, str(staging), " ".join(CFLAGS),
               *[str(s) for s in sources]]
    try:
        with open(log_path, "w") as log:
            status = subprocess.call(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except BaseException:  # Ctrl-C or an error starting the child: nothing half-built stays
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if status != 0:
        text = log_path.read_text(errors="replace")
        failed = target.with_name(target.name + ".failed")
        shutil.rmtree(failed, ignore_errors=True)
        staging.rename(failed)
        raise NpuDeviceBuildError(
            f"sim.npu_device: building the npu device extension failed: {first_compiler_error(text)} "
            f"(build directory {failed}, full log in {failed / BUILD_LOG}); the CPU simulator works without it"
        )
    for leftover in staging.glob("*.o"):
        leftover.unlink()
    os.replace(staging, target)


# The child process of `_compile`: torch's JIT build (ninja, g++) into the staging directory.
_BUILD_SCRIPT = """
import sys
from torch.utils import cpp_extension
name, directory, flags, *sources = sys.argv[1:]
cpp_extension.load(name=name, sources=sources, extra_cflags=flags.split(), build_directory=directory,
                   verbose=True, is_python_module=False)
"""


_LOADED: dict[str, ModuleType] = {}
_FAILED: dict[str, NpuDeviceBuildError] = {}


def load_extension(cache_root: Optional[str] = None, sources: Sequence[Path] = SOURCES) -> ModuleType:
    """The extension module, built first if the cache does not have it (see the module docstring)."""
    target = build_directory(cache_root, sources)
    key = str(target)
    if key in _LOADED:
        return _LOADED[key]
    if key in _FAILED:
        raise _FAILED[key]
    try:
        library = _library_in(target) if target.is_dir() else None
        if library is None:
            with _locked(target.with_name(target.name + ".lock")):
                library = _library_in(target) if target.is_dir() else None
                if library is None:
                    if target.exists():  # an unusable leftover: build it again
                        shutil.rmtree(target)
                    _remove_killed_builds(target)
                    _compile(target, sources)
                    library = _library_in(target)
        if library is None:
            raise NpuDeviceBuildError(f"sim.npu_device: the build in {target} produced no library")
    except NpuDeviceBuildError as exc:
        _FAILED[key] = exc
        raise
    module = sys.modules.get(EXTENSION_NAME)
    if module is None or getattr(module, "__file__", None) != str(library):
        module = _import(library)
    _LOADED[key] = module
    return module


def main() -> int:
    """``python -m sim.npu_device``: build (or find) the extension; print where it is."""
    try:
        module = load_extension()
    except NpuDeviceBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(module.__file__)
    return 0

