"""tests/hw: the torch_npu backend on a machine without an NPU (CPU only).

The wheel reader (torch_npu_wheel.py) sits beside this file; make it importable
whatever pytest's import mode.
"""

from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
