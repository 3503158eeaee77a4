"""ascendgraph's pytest plugin: ``--device``, the npu gate, and the shared fixtures.

Registered as a ``pytest11`` entry point (``ascendgraph``), so a project that installs
ascendgraph gets it without a conftest; a conftest may still load it with
``pytest_plugins = ["ascendgraph.testing.plugin"]``. Fixtures (``device``, ``sim_device``,
``fault_plan``) live in `ascendgraph.testing.fixtures`; fault scenarios are collected by
`ascendgraph.testing.scenarios`.

The ``npu`` marker is registered here (a project that installs ascendgraph and marks tests
``npu`` needs no ``markers`` entry of its own, also under ``--strict-markers``).

The npu gate (one rule, docs/decisions.md "The npu gate"). npu items are the tests marked
``npu``. When no NPU is usable here:

* a selection that holds npu items *alone* (``-m npu``, ``--device npu``, ``pytest
  tests/npu``) is a usage error that says why and names ``--npu-facade`` (the simulator's
  torch_npu facade, a plugin of ``sim``) when that switch exists;
* any other selection runs without its npu items, which are deselected with one notice
  line, whatever ``-m`` says (``-m "not slow"`` must not pull npu items into a CPU run).

With ``--npu-facade`` the facade is torch_npu, the npu backend is usable and nothing is
gated. A run that has no npu items, selects none with ``-m`` and uses no ``--device npu`` is
not gated (and never asks whether an NPU is usable).
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

import pytest

from ascendgraph.device import backend_availability

NPU_USAGE_ERROR = (
    "pytest -m npu needs a usable Ascend NPU, and this machine has none: {reason}. "
    "Run plain `pytest` for the simulator suite, {facade}or run -m npu on an Ascend node with CANN "
    "and torch_npu installed (pip install -e '.[npu]')."
)
DEVICE_NPU_USAGE_ERROR = (
    "pytest --device npu needs a usable Ascend NPU, and this machine has none: {reason}. "
    "Use --device sim, {facade}or run on an Ascend node with CANN and torch_npu installed."
)
NPU_ITEMS_USAGE_ERROR = (
    "the selected tests all need an Ascend NPU (marked npu), and this machine has none: {reason}. "
    "Run plain `pytest` for the simulator suite, {facade}or run them on an Ascend node."
)
FACADE_HINT = "add --npu-facade to run them on the simulator's torch_npu facade, "
DESELECTED_NOTICE = "ascendgraph: {count} npu test(s) deselected: no usable NPU here ({reason})"
NPU_MARKER = "npu: needs a usable Ascend NPU; deselected without one, and -m npu without one is a usage error (ascendgraph)"
NPU_TIMEOUT_S = 300.0  # per npu test (pytest-timeout): one hang must not stall a node
# pytest-timeout's thread method: a watchdog thread dumps the stacks and ends the process.
# Its signal method raises in the main thread only when the interpreter gets control back,
# which never happens while the thread is blocked inside C (an ACL call waiting on a card).
NPU_TIMEOUT_METHOD = "thread"
_GATE_KEY = pytest.StashKey[Optional[str]]()  # why no NPU is usable (None: usable); set once asked
_NOTICE_KEY = pytest.StashKey[str]()


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

    def only(*names: str) -> Callable[..., bool]:
        return lambda name, **kwargs: name in names

    return bool(expression.evaluate(only("npu"))) and not expression.evaluate(only())


def _declares_npu_marker(config: pytest.Config) -> bool:
    return any(str(line).split(":")[0].strip() == "npu" for line in config.getini("markers"))


def _facade_hint(config: pytest.Config) -> str:
    try:
        config.getoption("--npu-facade")
    except ValueError:
        return ""
    return FACADE_HINT


def npu_unusable_reason() -> Optional[str]:
    """None when the npu backend is usable (a card, or the facade in place), else why not."""
    usable, reason = backend_availability("npu")
    return None if usable else reason


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # trylast: a plugin that provides torch_npu (sim's --npu-facade) configures first.
    for module in _optional_plugin_modules():
        if not config.pluginmanager.is_registered(module):
            config.pluginmanager.register(module, name=module.__name__)
    if not _declares_npu_marker(config):
        config.addinivalue_line("markers", NPU_MARKER)
    markexpr = config.getoption("markexpr", default="") or ""
    device = config.getoption("--device", default=None)
    if device != "npu" and not selects_npu_tests(markexpr):
        return  # gated at collection, and only if npu items are collected
    reason = _npu_gate_reason(config)
    if reason is None:
        return
    if device == "npu":
        raise pytest.UsageError(DEVICE_NPU_USAGE_ERROR.format(reason=reason, facade=_facade_hint(config)))
    raise pytest.UsageError(NPU_USAGE_ERROR.format(reason=reason, facade=_facade_hint(config)))


def _npu_gate_reason(config: pytest.Config) -> Optional[str]:
    """Why no NPU is usable here (None when one is), asked once per session."""
    if _GATE_KEY not in config.stash:
        config.stash[_GATE_KEY] = npu_unusable_reason()
    return config.stash[_GATE_KEY]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    npu_items = [item for item in items if item.get_closest_marker("npu") is not None]
    if not npu_items:
        return
    reason = _npu_gate_reason(config)
    if reason is None:
        _add_timeouts(config, npu_items)
        _skip_simulator_strictness_on_a_card(config, npu_items)
        return
    if len(npu_items) == len(items):
        raise pytest.UsageError(NPU_ITEMS_USAGE_ERROR.format(reason=reason, facade=_facade_hint(config)))
    keep = [item for item in items if item.get_closest_marker("npu") is None]
    markexpr = config.getoption("markexpr", default="") or ""
    if _selected_by_markexpr(markexpr):
        config.stash[_NOTICE_KEY] = DESELECTED_NOTICE.format(count=len(npu_items), reason=reason)
    config.hook.pytest_deselected(items=npu_items)
    items[:] = keep


def _selected_by_markexpr(markexpr: str) -> bool:
    """Whether -m would have run npu items (the notice is only worth a line then)."""
    if not markexpr:
        return True
    from _pytest.mark.expression import Expression

    def is_npu(name: str, /, **kwargs: Any) -> bool:
        return name == "npu"

    return bool(Expression.compile(markexpr).evaluate(is_npu))


def _add_timeouts(config: pytest.Config, npu_items: list[pytest.Item]) -> None:
    """npu items get pytest-timeout's per-test limit unless they set their own."""
    if not npu_items or not config.pluginmanager.hasplugin("timeout"):
        return
    if config.getoption("timeout", default=None):
        return
    for item in npu_items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(NPU_TIMEOUT_S, method=NPU_TIMEOUT_METHOD))


SIMULATOR_STRICTNESS_SKIP = (
    "simulator strictness: a card does not raise here (the facade's declared strictness, docs/facade.md); "
    "runs with --npu-facade only"
)


def _skip_simulator_strictness_on_a_card(config: pytest.Config, npu_items: list[pytest.Item]) -> None:
    """npu items marked ``simulator_strictness`` expect a refusal only the simulator makes."""
    if config.getoption("--npu-facade", default=False):
        return
    for item in npu_items:
        if item.get_closest_marker("simulator_strictness") is not None:
            item.add_marker(pytest.mark.skip(reason=SIMULATOR_STRICTNESS_SKIP))


def pytest_report_collectionfinish(config: pytest.Config) -> Optional[str]:
    return config.stash.get(_NOTICE_KEY, None)
