"""Root conftest: load the project's pytest plugins, and give every test its own cache.

The plugins (ascendgraph.testing.plugin, ascendgraph_npu_facade) are ``pytest11`` entry
points once the project is installed; from a checkout whose installed metadata predates
them they are loaded here instead (never twice).

docs/decisions.md "A cache directory per test": tests use a temporary ASCENDGRAPH_CACHE_DIR per test so xdist workers never
share static-kernel builds. Artifacts that are expensive and immutable (the torch-npu wheel
the contract test reads, the npu device's C++ extension, sim/npu_device/build.py) keep using
the user's persistent cache (ASCENDGRAPH_DOWNLOAD_CACHE_DIR).
"""

import gc
import itertools
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from ascendgraph.readers import user_cache_root

# The cyclic garbage collector of a test process (a worker runs thousands of tests and holds
# 200,000-700,000 tracked objects). With CPython's default thresholds (700, 10, 10) it ran 700
# young and 5 full collections before the first test (importing torch) and 19 full
# collections in tests/engine alone, 6.3 s of that folder's 45 s of CPU; with a young
# generation of 10,000 allocations, set here before anything heavy is imported, and what is
# alive after collection frozen (`pytest_collection_finish`: the imported modules and the
# collected items live as long as the session), 4 full collections and 2.6 s. Only when the
# collector runs changes: every cycle is still collected, and a test that needs its garbage
# gone calls gc.collect() itself.
YOUNG_GENERATION_THRESHOLD = 10_000
gc.set_threshold(YOUNG_GENERATION_THRESHOLD, *gc.get_threshold()[1:])

# pytest rewrites the asserts of every module it imports from here on: the test modules, and
# ascendgraph, sim and hw too (the distribution that provides the pytest11 entry points is
# rewritten whole). It keeps each rewritten module in `__pycache__/*-pytest-<version>.pyc`, read
# back while it matches its source (size and modification time) -- but only writes that file when
# Python may write bytecode. With PYTHONDONTWRITEBYTECODE set (many containers, this project's
# CI), every pytest process (each xdist worker, each inner pytest a test starts, each in-process
# pytester session that re-imports the plugins) rewrote and compiled its ~490 modules again:
# 3.4 s of CPU for a worker's collection. scripts/compile_bytecode.py writes the plain bytecode
# whatever that variable says; this is the same for pytest's rewritten bytecode, from this
# conftest on (docs/testing.md "Start-up").
sys.dont_write_bytecode = False

PLUGINS = ("ascendgraph.testing.plugin", "ascendgraph_npu_facade")
pytest_plugins = [name for name in PLUGINS if name not in {ep.value for ep in entry_points(group="pytest11")}]

# The user's cache folder as ascendgraph itself finds it ($ASCENDGRAPH_CACHE_DIR, $XDG_CACHE_HOME, ~/.cache).
PERSISTENT_CACHE_DIR = user_cache_root()


class _CacheDirs:
    """Names a fresh cache directory per test below one folder of the session: a name, not a
    folder -- ascendgraph creates its cache directory when it first writes there. Most tests
    never write a cache, and a `tmp_path` per test (a folder and pytest's `*current` symlink,
    about 0.5 ms of CPU and several ms of file-system wall time each) cost the suite's 5,800
    tests seconds for nothing."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._names = itertools.count()

    def fresh(self) -> Path:
        return self._root / f"cache-{next(self._names)}"


@pytest.fixture(scope="session")
def _cache_dirs(tmp_path_factory: pytest.TempPathFactory) -> _CacheDirs:
    return _CacheDirs(tmp_path_factory.mktemp("ascendgraph-caches"))


@pytest.fixture(autouse=True)
def _isolated_ascendgraph_cache(_cache_dirs: _CacheDirs, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(_cache_dirs.fresh()))
    monkeypatch.setenv("ASCENDGRAPH_DOWNLOAD_CACHE_DIR", PERSISTENT_CACHE_DIR)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    gc.freeze()  # see YOUNG_GENERATION_THRESHOLD
