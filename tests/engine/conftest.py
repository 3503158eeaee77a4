"""Engine tests: small models, few capture sizes, one torch thread per worker, engine runs
shared per worker for tests that only read them (`shared_run`), and one compile cache per
worker (`worker_compile_cache`, tests/conftest.py)."""

from __future__ import annotations

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


@pytest.fixture(autouse=True)
def _engine_tests_share_the_worker_compile_cache(worker_compile_cache: Path) -> None:
    """Every engine test compiles one of a few small models: they share the worker's compile
    cache (tests/conftest.py, `worker_compile_cache`); none reads or writes its entries itself
    (test_npugraph_ex_run.py sets a cache directory of its own)."""


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
