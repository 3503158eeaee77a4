"""tests/hw: the torch_npu backend on a machine without an NPU (CPU only).

The wheel reader (torch_npu_wheel.py) sits beside this file; make it importable
whatever pytest's import mode. ``torch_npu``: the facade installed in process with a fresh
simulated NPU, for the tests of the facade itself.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterator

import pytest

from tests.facade_fixtures import facade_torch_npu

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def torch_npu() -> Iterator[Any]:
    """The facade installed in place of torch_npu, on a fresh simulated NPU (reset again after
    the test, so what a test leaves open stays with it)."""
    with facade_torch_npu() as module:
        yield module
