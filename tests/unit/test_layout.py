"""ARCHITECTURE.md: the core (`ascendgraph/`) never imports `sim`, `hw` or `torch_npu`; it
reaches the backends through the `ascendgraph.devices` entry points only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ascendgraph.device import check_device_options
from ascendgraph.errors import ConfigError

CORE = Path(__file__).resolve().parents[2] / "ascendgraph"
FORBIDDEN = {"sim", "hw", "torch_npu"}


def _imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_core_never_imports_a_backend_or_torch_npu():
    offenders = {
        str(path.relative_to(CORE.parent)): sorted(_imported_roots(ast.parse(path.read_text(encoding="utf-8"))) & FORBIDDEN)
        for path in CORE.rglob("*.py")
    }
    assert {path: roots for path, roots in offenders.items() if roots} == {}


def test_backend_options_are_checked_through_the_registry_without_a_device():
    check_device_options("sim", profile="A3", faults="capture_begin=1*off->raise(207008)")
    check_device_options("sim", profile={"base": "A2", "stream_limit": 64})
    with pytest.raises(ConfigError, match="unknown site"):
        check_device_options("sim", faults="bogus=1")
    with pytest.raises(ConfigError, match="stream_limit"):
        check_device_options("sim", profile={"base": "A2", "stream_limit": 0})
