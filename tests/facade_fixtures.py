"""What the test folders' ``torch_npu`` fixtures share (tests/hw/conftest.py, tests/sim/conftest.py)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def facade_torch_npu() -> Iterator[Any]:
    """The facade installed in place of torch_npu on a fresh simulated NPU, and the module it
    provides; afterwards the NPU is reset (what a test left open stays with it) and the facade
    uninstalled."""
    from sim import facade

    facade.install(quiet=True)
    facade.configure()
    try:
        import torch_npu as module

        yield module
    finally:
        facade.configure()
        facade.uninstall()
