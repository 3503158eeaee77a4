"""tests/compat: vLLM Ascend's graph call sequence against torch_npu's public API only.

Every test here is an npu test: on a laptop it runs on the simulator's facade
(``pytest -m npu --npu-facade tests/compat``), on an Ascend node unchanged against the
real torch_npu (``pytest -m npu tests/compat``). Fault injection exists on the facade only.
"""

from __future__ import annotations

import os

import pytest

_HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if os.path.dirname(str(item.fspath)) == _HERE:
            item.add_marker(pytest.mark.npu)
