"""ascendgraph's pytest plugin: ``--device``, the npu gate, and the shared fixtures.

Registered as a ``pytest11`` entry point (``ascendgraph``), so a project that installs
ascendgraph gets it without a conftest; a conftest may still load it with
``pytest_plugins = ["ascendgraph.testing.plugin"]``. Fixtures (``device``, ``sim_device``,
``fault_plan``) live in `ascendgraph.testing.fixtures`; fault scenarios are collected by
`ascendgraph.testing.scenarios`, only in the folders a project names in its
``ascendgraph_scenarios`` ini option.

Being installed everywhere, it must not break a project that has never heard of it. Its
device flag is ``--ascendgraph-device``, and also ``--device`` where that name is free:
pytest loads plugins before the project's initial conftests, and argparse refuses a second
``--device`` (pytest would not start), so ``--device`` is added only once those conftests
have added their own options, and only when none of them defines it. A project with its own
``--device`` keeps it; ``--ascendgraph-device`` works everywhere.

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
    "pytest {flag} npu needs a usable Ascend NPU, and this machine has none: {reason}. "
    "Use {flag} sim, {facade}or run on an Ascend node with CANN and torch_npu installed."
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


SCENARIO_INI = "ascendgraph_scenarios"  # the folders a project opts in (ascendgraph.testing.scenarios)
DEVICE_FLAG = "--ascendgraph-device"
SHORT_DEVICE_FLAG = "--device"  # only where no conftest of the project claims it
DEVICE_DEST = "ascendgraph_device"
DEVICE_CHOICES = ("sim", "npu", "auto")
_SHORT_FLAG_KEY = pytest.StashKey[bool]()  # set when --device is this plugin's in this session


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    group = parser.getgroup("ascendgraph")
    group.addoption(
        DEVICE_FLAG,
        action="store",
        dest=DEVICE_DEST,
        default=None,
        choices=DEVICE_CHOICES,
        help="device backend for the `device` fixture (default: sim; -m npu runs use npu)",
    )
    parser.addini(
        SCENARIO_INI,
        type="paths",
        default=[],
        help="folders whose *.toml files are ascendgraph fault scenarios, each collected as a test "
        "(e.g. tests/scenarios); none by default",
    )
    if _loaded_by_a_conftest(pluginmanager):
        # `pytest_plugins = ["ascendgraph.testing.plugin"]`: the initial conftests are being
        # loaded, so the hook below has already started; the conftest naming this plugin has
        # added its options by now.
        _add_short_device_flag(parser, pluginmanager)


@pytest.hookimpl(wrapper=True)
def pytest_load_initial_conftests(early_config: pytest.Config, parser: pytest.Parser, args: list[str]) -> Any:
    """Once the project's initial conftests have added their options (pytest loads plugins
    first), add ``--device`` unless one of them defines it: argparse refuses a second
    ``--device`` and pytest would not start."""
    try:
        return (yield)
    finally:
        _add_short_device_flag(parser, early_config.pluginmanager)


def _loaded_by_a_conftest(pluginmanager: pytest.PytestPluginManager) -> bool:
    return any(str(getattr(plugin, "__file__", "")).endswith("conftest.py") for plugin in pluginmanager.get_plugins())


def _claimed(parser: pytest.Parser, flag: str) -> bool:
    groups = [*getattr(parser, "_groups", ()), getattr(parser, "_anonymous", None)]
    return any(flag in option.names() for group in groups if group is not None for option in group.options)


def _add_short_device_flag(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    config = pluginmanager.get_plugin("pytestconfig")
    if _claimed(parser, SHORT_DEVICE_FLAG):
        return
    parser.getgroup("ascendgraph").addoption(
        SHORT_DEVICE_FLAG,
        action="store",
        dest=DEVICE_DEST,
        default=None,
        choices=DEVICE_CHOICES,
        help=f"the same as {DEVICE_FLAG} (a project whose conftest defines {SHORT_DEVICE_FLAG} keeps its own)",
    )
    if config is not None:
        config.stash[_SHORT_FLAG_KEY] = True


def device_flag(config: pytest.Config) -> str:
    """How to spell the device flag in this session (messages name the one that works)."""
    return SHORT_DEVICE_FLAG if config.stash.get(_SHORT_FLAG_KEY, False) else DEVICE_FLAG


def device_option(config: pytest.Config) -> Optional[str]:
    """The backend asked for with ``--ascendgraph-device`` (or this plugin's ``--device``)."""
    value = config.getoption(DEVICE_DEST, default=None)
    return str(value) if value else None


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
    device = device_option(config)
    if device != "npu" and not selects_npu_tests(markexpr):
        return  # gated at collection, and only if npu items are collected
    reason = _npu_gate_reason(config)
    if reason is None:
        return
    if device == "npu":
        raise pytest.UsageError(DEVICE_NPU_USAGE_ERROR.format(reason=reason, facade=_facade_hint(config),
                                                              flag=device_flag(config)))
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
