"""The `worker_compile_cache` fixture (tests/conftest.py, docs/testing.md "One compile cache per
worker"): only the compile cache's entries are shared by a worker's tests; the rest of the cache
directory stays the test's own."""

from __future__ import annotations

import os
from pathlib import Path

from ascendgraph.compile.cache import CompileCache
from ascendgraph.compile.static_kernel import cache_root


def test_the_compile_cache_is_the_workers_and_the_rest_of_the_cache_the_tests_own(worker_compile_cache, tmp_path):
    root = Path(os.environ["ASCENDGRAPH_CACHE_DIR"])
    assert root.is_relative_to(tmp_path)  # the test's own directory (root conftest.py)
    assert CompileCache().directory.resolve() == worker_compile_cache.resolve()
    static_kernels = cache_root() / "static_kernels"  # where static-kernel builds go (static_kernel.py)
    assert static_kernels.resolve().is_relative_to(tmp_path.resolve())
    assert not static_kernels.resolve().is_relative_to(worker_compile_cache.resolve())


def test_a_test_without_the_fixture_has_a_compile_cache_of_its_own(tmp_path):
    directory = CompileCache().directory
    assert directory.is_relative_to(tmp_path) and not directory.exists()
