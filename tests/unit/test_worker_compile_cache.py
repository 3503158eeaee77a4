"""The `worker_compile_cache` fixture (tests/conftest.py, docs/testing.md "One compile cache per
worker"): only the compile cache's entries are shared by a worker's tests; the rest of the cache
directory stays the test's own."""

from __future__ import annotations

import os
from pathlib import Path

from ascendgraph.compile.cache import CompileCache
from ascendgraph.compile.static_kernel import cache_root


def test_the_compile_cache_is_the_workers_and_the_rest_of_the_cache_the_tests_own(worker_compile_cache):
    root = Path(os.environ["ASCENDGRAPH_CACHE_DIR"])  # the test's own directory (root conftest.py)
    assert CompileCache().directory.resolve() == worker_compile_cache.resolve()
    static_kernels = cache_root() / "static_kernels"  # where static-kernel builds go (static_kernel.py)
    assert static_kernels.resolve().is_relative_to(root.resolve())
    assert not static_kernels.resolve().is_relative_to(worker_compile_cache.resolve())
    assert [path.name for path in root.iterdir()] == ["compile"]  # only the link to the worker's entries


def test_a_test_without_the_fixture_has_a_compile_cache_of_its_own():
    root = Path(os.environ["ASCENDGRAPH_CACHE_DIR"])
    directory = CompileCache().directory
    assert directory.is_relative_to(root) and not root.exists()  # named for this test; nothing made it yet


def test_each_test_is_given_a_cache_directory_no_other_test_was_given(_cache_dirs):
    current = Path(os.environ["ASCENDGRAPH_CACHE_DIR"])
    later = {_cache_dirs.fresh() for _ in range(3)}
    assert len(later) == 3 and current not in later
    assert all(path.parent == current.parent and not path.exists() for path in later)
