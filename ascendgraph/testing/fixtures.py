"""pytest fixtures for device tests: ``device``, ``sim_device``, ``fault_plan``.

* ``device`` — a fresh device per test. The backend is the test's parameter when the
  fixture is parametrised indirectly (the conformance suite does that), else
  ``--ascendgraph-device`` (or ``--device`` where the project has no option of that name),
  else ``npu`` in an ``-m npu`` run and ``sim`` otherwise. A ``@pytest.mark.fault("...")``
  marker applies that fault plan to it (simulator only; hardware skips such tests). A test
  with the marker must use ``device`` (else it fails: the plan would be ignored); a bad
  plan fails the test with the parser's message.
* ``sim_device`` — always a fresh simulator device.
* ``fault_plan`` — the plan the ``fault`` marker applied to ``device`` (None without one).

The fixtures reach backends through `ascendgraph.device.get_device` only; each test gets
its own device object, so pytest-xdist workers and tests never share state.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import pytest

from ascendgraph.device import Device, FaultInjection, get_device
from ascendgraph.errors import ConfigError
from ascendgraph.testing.plugin import device_option, selects_npu_tests

__all__ = ["device", "sim_device", "fault_plan", "device_backend_name"]


def device_backend_name(request: pytest.FixtureRequest) -> str:
    """The backend the ``device`` fixture uses for this test."""
    param = getattr(request, "param", None)
    if param:
        return str(param)
    option = device_option(request.config)
    if option:
        return option
    markexpr = request.config.getoption("markexpr", default="") or ""
    return "npu" if selects_npu_tests(markexpr) else "sim"


FAULT_MARKER = (
    "fault(plan): apply a fault plan to the `device` fixture, e.g. "
    "fault(\"capture_begin=3*off->raise(207008)\")"
)


def pytest_configure(config: pytest.Config) -> None:
    # Registered here too, so projects that load the plugin run with --strict-markers.
    config.addinivalue_line("markers", FAULT_MARKER)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """A fault marker on a test that does not use the ``device`` fixture would be ignored
    silently (and the test would pass without its fault): fail it instead."""
    if item.get_closest_marker("fault") is not None and "device" not in getattr(item, "fixturenames", ()):
        pytest.fail(
            f"{item.nodeid}: @pytest.mark.fault applies its plan to the `device` fixture, which this test "
            "does not use; take `device` as an argument (sim_device is never faulted)",
            pytrace=False,
        )


def _fault_spec(request: pytest.FixtureRequest) -> Optional[str]:
    marker = request.node.get_closest_marker("fault")
    if marker is None:
        return None
    args = list(marker.args) + ([marker.kwargs["plan"]] if "plan" in marker.kwargs else [])
    if len(args) != 1 or not isinstance(args[0], str) or set(marker.kwargs) - {"plan"}:
        pytest.fail(
            f"{request.node.nodeid}: @pytest.mark.fault takes one plan string, e.g. "
            "fault(\"capture_begin=3*off->raise(207008)\"), got "
            f"fault({', '.join([*map(repr, marker.args), *(f'{k}={v!r}' for k, v in marker.kwargs.items())])})",
            pytrace=False,
        )
    return args[0]


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Iterator[Device]:
    name = device_backend_name(request)
    spec = _fault_spec(request)
    created = get_device(name)
    if spec is not None:
        if not isinstance(created, FaultInjection):
            pytest.skip(f"fault injection needs the simulator; the {name!r} device cannot inject {spec!r}")
        try:
            created.set_fault_plan(spec)
        except ConfigError as exc:
            pytest.fail(f"{request.node.nodeid}: bad @pytest.mark.fault plan {spec!r}: {exc}", pytrace=False)
    yield created


@pytest.fixture
def sim_device() -> Device:
    return get_device("sim")


@pytest.fixture
def fault_plan(request: pytest.FixtureRequest, device: Device) -> Any:
    """The fault plan applied to ``device`` by the test's ``fault`` marker (or None)."""
    return device.fault_plan if isinstance(device, FaultInjection) else None
