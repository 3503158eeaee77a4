"""Root conftest: load ascendgraph's pytest plugin (markers, --device, fixtures, scenarios)."""

pytest_plugins = ["ascendgraph.testing.plugin"]
