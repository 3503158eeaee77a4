"""Engine tests: small models, few capture sizes, one torch thread per worker, engine runs
shared per worker for tests that only read them (`shared_run`), and one compile cache per
worker (`_worker_compile_cache`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

from ascendgraph.config import GraphConfig
from tests.engine.helpers import EngineRun, SharedRuns


@pytest.fixture(autouse=True, scope="session")
def _one_intra_op_thread():
    # The simulator issues many small ops; with pytest-xdist workers sharing two cores,
    # one intra-op thread per worker avoids OpenMP oversubscription (10x slower).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def _worker_compile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker-compile-cache")


@pytest.fixture(autouse=True)
def _worker_compile_cache(_isolated_ascendgraph_cache: None, _worker_compile_dir: Path) -> None:
    """The compile cache's entries (``<cache>/compile``: traced graphs and pass results) are shared
    by the engine tests of one worker; everything else in the cache directory (static-kernel
    builds, ...) stays the test's own (the root conftest's per-test ASCENDGRAPH_CACHE_DIR).

    Every engine test compiles one of a few small models; with a cache of its own each paid a
    Dynamo trace (about 2 s of CPU of a 3.5 s run). The compile cache's contract is that a hit
    only makes a run faster, never changes what it computes (ascendgraph/compile/cache.py), and
    tests/unit/test_compile_cache.py checks that contract; no engine test reads or writes the
    cache's entries itself (a test that does sets its own ASCENDGRAPH_CACHE_DIR, as
    test_npugraph_ex_run.py does). xdist workers never share the directory (one per worker)."""
    root = Path(os.environ["ASCENDGRAPH_CACHE_DIR"])
    root.mkdir(parents=True, exist_ok=True)
    (root / "compile").symlink_to(_worker_compile_dir, target_is_directory=True)


@pytest.fixture(scope="session")
def _shared_runs() -> SharedRuns:
    return SharedRuns()


@pytest.fixture
def shared_run(_shared_runs: SharedRuns, request: pytest.FixtureRequest) -> Iterator[Callable[..., EngineRun]]:
    """``shared_run(config, **options)``: the worker's run of that configuration, built on first
    use. Read it only (tests/engine/helpers.py, "shared runs"): after the test, a run whose
    fingerprint changed fails the test by name."""
    used: list[str] = []

    def get(config: GraphConfig, **options: Any) -> EngineRun:
        key, run = _shared_runs.get(config, **options)
        used.append(key)
        return run

    yield get
    changed = _shared_runs.changed(sorted(set(used)))
    if changed:
        pytest.fail(
            f"{request.node.nodeid} changed a shared engine run ({'; '.join(changed)}): a test given shared_run "
            "only reads it; build your own with run_engine to observe or change a run",
            pytrace=False,
        )
