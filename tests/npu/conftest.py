"""tests/npu: hardware-only tests, run with ``pytest -m npu`` on an Ascend node.

Every test here carries the ``npu`` marker (added below, whether or not a module says so),
so the default run never collects them and ``-m npu`` on a machine without a usable NPU
stops with the plugin's usage error. The device conformance suite runs on npu from
tests/conformance (its ``npu`` parameters); this directory holds what only hardware can
show: fused kernels against the reference, a short engine run per mode, the calibration.
"""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from ascendgraph.device import get_device

_HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if os.path.dirname(str(item.fspath)) == _HERE:
            item.add_marker(pytest.mark.npu)


@pytest.fixture
def npu_device() -> Iterator[object]:
    device = get_device("npu")
    device.router.fallbacks.clear()  # the router is process-wide: only this test's fallbacks count
    yield device
    device.synchronize()
    device.empty_cache()
