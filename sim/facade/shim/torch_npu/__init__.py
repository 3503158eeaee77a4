"""``import torch_npu`` under ``python -m sim.facade``: this directory is first on
PYTHONPATH, and this package replaces itself with the simulator's facade."""

import sys

from sim.facade import install

install(quiet=True)
sys.modules[__name__] = sys.modules["torch_npu"]
