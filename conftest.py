"""Root conftest: load ascendgraph's pytest plugin, and give every test its own cache.

INTERFACES.md: tests use a temporary ASCENDGRAPH_CACHE_DIR per test so xdist workers never
share static-kernel builds. Downloads that are expensive and immutable (the torch-npu wheel
the contract test reads) keep using the user's persistent cache.
"""

import os

import pytest

pytest_plugins = ["ascendgraph.testing.plugin"]

PERSISTENT_CACHE_DIR = os.environ.get("ASCENDGRAPH_CACHE_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "ascendgraph"
)


@pytest.fixture(autouse=True)
def _isolated_ascendgraph_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path / "ascendgraph-cache"))
    monkeypatch.setenv("ASCENDGRAPH_DOWNLOAD_CACHE_DIR", PERSISTENT_CACHE_DIR)
