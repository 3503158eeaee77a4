"""Differential parity suite: ascendgraph's upstream rules against the installed vLLM 0.32.0.

Run it in the environment built by ``scripts/parity-env.sh``::

    "$(scripts/parity-env.sh | tail -n 1)" -m pytest -m vllm tests/parity -n auto

Every module here skips itself (with the reason) when vLLM cannot be imported, so the main
test run never needs vLLM. ``ASCENDGRAPH_PARITY_EXAMPLES`` lowers or raises the number of
hypothesis examples per property (default 2000, the CI floor). See docs/parity.md.
"""

from __future__ import annotations

import os
import sys

import pytest

# The harness module sits beside this file; make it importable whatever pytest's import mode.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Everything under tests/parity is a vLLM parity test, whether or not a module says so.
    for item in items:
        if os.path.dirname(str(item.fspath)) == _HERE:
            item.add_marker(pytest.mark.vllm)
