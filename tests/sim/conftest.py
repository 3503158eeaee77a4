"""Fixtures of the simulator's tests."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
import torch

from sim.npu_device.fallback import on_device
from tests.facade_fixtures import facade_torch_npu


@pytest.fixture
def kernels_run_as_on_the_device() -> Iterator[None]:
    """The facade's kernels are torch_npu's: registered for npu tensors only, they run on CPU
    aliases of device memory (sim.npu_device.fallback). Under this fixture they run on CPU
    tensors as the device runs them, so their formulas are tested without a simulated NPU."""
    with on_device():
        yield


@pytest.fixture
def torch_npu(kernels_run_as_on_the_device: None) -> Iterator[Any]:
    """The facade's torch_npu module, its kernels' formulas run on CPU tensors as the npu
    device runs them (`kernels_run_as_on_the_device`)."""
    with facade_torch_npu() as module:
        yield module


@pytest.fixture
def npu() -> Iterator[Any]:
    """The facade's torch_npu module with npu tensors on the simulated NPU (its own memory,
    streams and graphs)."""
    import sim.npu_device as npu_device
    from sim import facade

    facade.install(quiet=True)
    facade.configure()
    if not hasattr(torch.Tensor, "is_npu"):
        torch.Tensor.is_npu = property(lambda tensor: tensor.device.type == "npu")  # type: ignore[attr-defined]
    npu_device.enable()
    npu_device.attach(facade.device())
    try:
        import torch_npu

        yield torch_npu
    finally:
        npu_device.attach(None)
        facade.uninstall()
