"""tests/ranks: the rank tests run small engines of a few configurations; they share the
worker's compile cache (tests/conftest.py, `worker_compile_cache`), as tests/engine does.
No test here reads, writes or counts compile-cache entries."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def _rank_tests_share_the_worker_compile_cache(worker_compile_cache: Path) -> None:
    """A cache hit only skips the trace; what a run computes and reports is the same
    (tests/unit/test_compile_cache.py and test_traced_cache.py check that contract)."""
