"""Fixtures of the simulator's tests."""

from __future__ import annotations

from typing import Iterator

import pytest

from sim.npu_device.fallback import on_device


@pytest.fixture
def kernels_run_as_on_the_device() -> Iterator[None]:
    """The facade's kernels are torch_npu's: registered for npu tensors only, they run on CPU
    aliases of device memory (sim.npu_device.fallback). Under this fixture they run on CPU
    tensors as the device runs them, so their formulas are tested without a simulated NPU."""
    with on_device():
        yield
