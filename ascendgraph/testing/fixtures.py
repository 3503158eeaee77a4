"""pytest fixtures for device tests: ``device``, ``sim_device``, ``fault_plan``.

* ``device`` — a fresh device per test. The backend is the test's parameter when the
  fixture is parametrised indirectly (the conformance suite does that), else ``--device``,
  else ``npu`` in an ``-m npu`` run and ``sim`` otherwise. A ``@pytest.mark.fault("...")``
  marker applies that fault plan to it (simulator only; hardware skips such tests).
* ``sim_device`` — always a fresh simulator device.
* ``fault_plan`` — the plan the ``fault`` marker applied to ``device`` (None without one).

The fixtures reach backends through `ascendgraph.device.get_device` only; each test gets
its own device object, so pytest-xdist workers and tests never share state.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import pytest

from ascendgraph.device import Device, get_device
from ascendgraph.testing.plugin import selects_npu_tests

__all__ = ["device", "sim_device", "fault_plan", "device_backend_name"]


def device_backend_name(request: pytest.FixtureRequest) -> str:
    """The backend the ``device`` fixture uses for this test."""
    param = getattr(request, "param", None)
    if param:
        return str(param)
    option = request.config.getoption("--device", default=None)
    if option:
        return str(option)
    markexpr = request.config.getoption("markexpr", default="") or ""
    return "npu" if selects_npu_tests(markexpr) else "sim"


def _fault_spec(request: pytest.FixtureRequest) -> Optional[str]:
    marker = request.node.get_closest_marker("fault")
    if marker is None:
        return None
    if len(marker.args) != 1 or not isinstance(marker.args[0], str):
        raise pytest.UsageError(
            f"{request.node.nodeid}: @pytest.mark.fault takes one plan string, e.g. "
            "fault(\"capture_begin=3*off->raise(207008)\")"
        )
    return marker.args[0]


@pytest.fixture
def device(request: pytest.FixtureRequest) -> Iterator[Device]:
    name = device_backend_name(request)
    spec = _fault_spec(request)
    created = get_device(name)
    if spec is not None:
        apply = getattr(created, "set_fault_plan", None)
        if apply is None:
            pytest.skip(f"fault injection needs the simulator; the {name!r} device cannot inject {spec!r}")
        apply(spec)
    yield created


@pytest.fixture
def sim_device() -> Device:
    return get_device("sim")


@pytest.fixture
def fault_plan(request: pytest.FixtureRequest, device: Device) -> Any:
    """The fault plan applied to ``device`` by the test's ``fault`` marker (or None)."""
    return getattr(device, "fault_plan", None)
