"""Root conftest: load the project's pytest plugins, and give every test its own cache.

The plugins (ascendgraph.testing.plugin, ascendgraph_npu_facade) are ``pytest11`` entry
points once the project is installed; from a checkout whose installed metadata predates
them they are loaded here instead (never twice).

docs/decisions.md "A cache directory per test": tests use a temporary ASCENDGRAPH_CACHE_DIR per test so xdist workers never
share static-kernel builds. Artifacts that are expensive and immutable (the torch-npu wheel
the contract test reads, the npu device's C++ extension, sim/npu_device/build.py) keep using
the user's persistent cache (ASCENDGRAPH_DOWNLOAD_CACHE_DIR).
"""

import os
from importlib.metadata import entry_points

import pytest

PLUGINS = ("ascendgraph.testing.plugin", "ascendgraph_npu_facade")
pytest_plugins = [name for name in PLUGINS if name not in {ep.value for ep in entry_points(group="pytest11")}]

PERSISTENT_CACHE_DIR = os.environ.get("ASCENDGRAPH_CACHE_DIR") or os.path.join(
    os.path.expanduser("~"), ".cache", "ascendgraph"
)


@pytest.fixture(autouse=True)
def _isolated_ascendgraph_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path / "ascendgraph-cache"))
    monkeypatch.setenv("ASCENDGRAPH_DOWNLOAD_CACHE_DIR", PERSISTENT_CACHE_DIR)
