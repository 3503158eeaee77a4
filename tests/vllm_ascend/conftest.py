"""vLLM Ascend's own graph-mode code on the simulator's torch_npu facade (marker ``vllm_ascend``).

Run it with ``make vllm-ascend`` (docs/vllm-ascend.md): the environment of
``scripts/vllm-ascend-env.sh`` (vLLM 0.27.1, vLLM Ascend's source on sys.path) and the
session under ``python -m sim.facade --npu-device --``. Every test here is marked
``vllm_ascend`` (excluded from the default run). Outside that set-up the modules skip with
the reason — except when the run selects ``-m vllm_ascend`` with ``ASCENDGRAPH_CI=1``
(``.ci/run``): then a missing environment fails the run instead of turning it green.
"""

from __future__ import annotations

import os
import sys

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


def pytest_configure(config: pytest.Config) -> None:
    import harness

    markexpr = config.getoption("markexpr", default="") or ""
    harness.SELECTED = "vllm_ascend" in markexpr and "not vllm_ascend" not in markexpr


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if os.path.dirname(str(item.fspath)) == _HERE:
            item.add_marker(pytest.mark.vllm_ascend)
