"""Nothing left behind in the caches (ascendgraph/cache_temporaries.py): a write that fails (a
full disk) removes its temporary, and the temporaries of a process killed mid-write (SIGKILL
runs no error path) are removed by the next command that uses that cache."""

from __future__ import annotations

import errno
import io
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from ascendgraph.cache_temporaries import STALE_AFTER_S, is_temporary, sweep_stale_temporaries, temporary_prefix
from ascendgraph.compile.cache import CompileCache
from ascendgraph.compile.static_kernel import build_static_kernels
from ascendgraph.config import GraphConfig
from ascendgraph.tools.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]


def _cache(tmp_path: Path) -> Path:
    return Path(os.environ["ASCENDGRAPH_CACHE_DIR"])  # the root conftest gives every test its own


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if not p.is_dir())


def _plan() -> Any:
    config = GraphConfig.from_vllm_args(num_layers=1, compilation_config={"cudagraph_capture_sizes": [1, 2]},
                                        max_num_seqs=4, max_num_batched_tokens=16)
    return make_plan(config, budget=1, requests=2, measure="sample", sample=1)


class _FullDisk(io.RawIOBase):
    """A file opened for writing on a full disk: it exists (0 bytes), every write fails."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, data: Any) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self._stream.close()
        super().close()


@pytest.fixture
def full_cache_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every file opened for writing under the cache folder behaves as on a full disk."""
    cache = _cache(tmp_path)
    real_open = io.open

    def open_on_full_disk(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        stream = real_open(file, mode, *args, **kwargs)
        if not any(flag in mode for flag in "wax+"):
            return stream
        name = os.readlink(f"/proc/self/fd/{stream.fileno()}")
        if not name.startswith(str(cache)):
            return stream
        raw = getattr(stream, "buffer", stream)
        full = _FullDisk(getattr(raw, "raw", raw))
        return io.TextIOWrapper(io.BufferedWriter(full)) if "b" not in mode else io.BufferedWriter(full)

    monkeypatch.setattr(io, "open", open_on_full_disk)
    return cache


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="reads /proc/self/fd")
def test_a_plan_on_a_full_cache_disk_leaves_no_file(full_cache_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    result = _plan()
    assert result.measurement is not None and not result.measurement.cached
    assert _files(full_cache_disk) == []  # no 0-byte <key>.<pid>.tmp, no compile-cache temporary
    assert any("could not store the plan's measurement" in r.getMessage() and "No space left" in r.getMessage()
               for r in caplog.records)


# --------------------------------------------------------------------------- killed mid-write

WRITER = """
import sys, time
from ascendgraph.readers import write_output

def stuck(path):
    print("writing", flush=True)
    time.sleep(600)

write_output(sys.argv[1], stuck, "a cache entry")
"""

STATIC_BUILDER = """
import pathlib, sys, time
from ascendgraph.compile.static_kernel import build_static_kernels

write_text = pathlib.Path.write_text

def stuck(self, *args, **kwargs):
    if self.name == "manifest.json":
        print("writing", flush=True)
        time.sleep(600)
    return write_text(self, *args, **kwargs)

pathlib.Path.write_text = stuck
build_static_kernels([], sizes=[1], flags={}, cache_dir=pathlib.Path(sys.argv[1]))
"""


def _killed_mid_write(script: str, target: Path) -> None:
    """Run ``script`` in a child, SIGKILL it once it says it is writing ``target``."""
    child = subprocess.Popen([sys.executable, "-c", script, str(target)], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert child.stdout is not None
    assert child.stdout.readline() == b"writing\n"
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=60)


def test_a_killed_compile_cache_write_is_removed_by_the_next_run(tmp_path: Path) -> None:
    folder = tmp_path / "cache" / "compile"
    folder.mkdir(parents=True)
    _killed_mid_write(WRITER, folder / "0123.pkl")
    (left,) = os.listdir(folder)
    assert left.startswith(".0123.pkl.tmp-") and left.endswith(".tmp")
    assert CompileCache(tmp_path / "cache").load("4567") is None  # the next run's first look at the cache
    assert os.listdir(folder) == []


def test_killed_plan_and_traced_graph_writes_are_removed_by_the_next_plan(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    for folder, name in ((cache / "plan", "a.json"), (cache / "compile" / "traced", "b.pkl")):
        folder.mkdir(parents=True, exist_ok=True)
        _killed_mid_write(WRITER, folder / name)
    assert len([p for p in _files(cache) if ".tmp-" in p]) == 2
    _plan()
    assert [p for p in _files(cache) if is_temporary(Path(p).name)] == []


def test_a_killed_static_kernel_build_leaves_a_staging_folder_the_next_build_removes(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    _killed_mid_write(STATIC_BUILDER, root)
    (staging,) = [p for p in (root / "static_kernels").iterdir() if p.name.startswith(".")]
    assert ".tmp-" in staging.name and staging.is_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the build notice
        build = build_static_kernels([], sizes=[1], flags={}, cache_dir=root)
    assert [p.name for p in (root / "static_kernels").iterdir()] == [build.directory.name]


# --------------------------------------------------------------------------- which temporaries are stale


def test_only_stale_temporaries_are_removed(tmp_path: Path) -> None:
    hour_ago = time.time() - STALE_AFTER_S - 60
    entries = {
        "entry.pkl": hour_ago,  # a cache entry, however old
        f"{temporary_prefix('mine.pkl')}abc.tmp": time.time(),  # this process, writing now
        f"{temporary_prefix('fresh.pkl')}abc.tmp": time.time(),
        ".other-host.pkl.tmp-elsewhere-1.abc.tmp": time.time(),  # another host's: judged by age only
        ".old.pkl.tmp-elsewhere-1.abc.tmp": hour_ago,
        "k.1234567.tmp": hour_ago,  # an older version's plan temporary
        ".0123456789abcdef.x1y2z3": hour_ago,  # an older version's staging folder name
    }
    for name, when in entries.items():
        path = tmp_path / name
        path.write_text("")
        os.utime(path, (when, when))
    assert sweep_stale_temporaries(tmp_path) == 3
    assert sorted(os.listdir(tmp_path)) == sorted([
        "entry.pkl", f"{temporary_prefix('mine.pkl')}abc.tmp", f"{temporary_prefix('fresh.pkl')}abc.tmp",
        ".other-host.pkl.tmp-elsewhere-1.abc.tmp"])


def test_a_dead_writer_of_this_host_is_stale_at_once(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)
    name = temporary_prefix("x.pkl").replace(f"-{os.getpid()}.", f"-{dead}.") + "abc.tmp"
    (tmp_path / name).write_text("")
    assert sweep_stale_temporaries(tmp_path) == 1 and os.listdir(tmp_path) == []
