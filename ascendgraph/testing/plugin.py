"""ascendgraph's pytest plugin: ``--device``, the ``-m npu`` guard, and the shared fixtures.

Load it from a conftest with ``pytest_plugins = ["ascendgraph.testing.plugin"]``.
Fixtures (``device``, ``sim_device``, ``fault_plan``) live in
`ascendgraph.testing.fixtures`; fault scenarios are collected by
`ascendgraph.testing.scenarios` when that module exists.
"""

from __future__ import annotations

import importlib
from typing import Any

import pytest

from ascendgraph.device import backend_availability

NPU_USAGE_ERROR = (
    "pytest -m npu needs a usable Ascend NPU, and this machine has none: {reason}. "
    "Run plain `pytest` for the simulator suite, or run -m npu on an Ascend node with CANN "
    "and torch_npu installed (pip install -e '.[npu]')."
)


def _optional_plugin_modules() -> list[Any]:
    modules = []
    for name in ("ascendgraph.testing.fixtures", "ascendgraph.testing.scenarios"):
        try:
            modules.append(importlib.import_module(name))
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return modules


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ascendgraph")
    group.addoption(
        "--device",
        action="store",
        default=None,
        choices=("sim", "npu", "auto"),
        help="device backend for the `device` fixture (default: sim; -m npu runs use npu)",
    )


def selects_npu_tests(markexpr: str) -> bool:
    """True when a -m expression selects npu-marked tests but not unmarked ones (an NPU run)."""
    if not markexpr:
        return False
    from _pytest.mark.expression import Expression

    expression = Expression.compile(markexpr)

    def only(*names: str):
        return lambda name, **kwargs: name in names

    return bool(expression.evaluate(only("npu"))) and not expression.evaluate(only())


def pytest_configure(config: pytest.Config) -> None:
    for module in _optional_plugin_modules():
        if not config.pluginmanager.is_registered(module):
            config.pluginmanager.register(module, name=module.__name__)
    markexpr = config.getoption("markexpr", default="") or ""
    if selects_npu_tests(markexpr) or config.getoption("--device") == "npu":
        usable, reason = backend_availability("npu")
        if not usable:
            raise pytest.UsageError(NPU_USAGE_ERROR.format(reason=reason))
