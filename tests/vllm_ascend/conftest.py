"""vLLM Ascend's own graph-mode code on the simulator's torch_npu facade (marker ``vllm_ascend``).

Run it with ``make vllm-ascend`` (docs/vllm-ascend.md): the environment of
``scripts/vllm-ascend-env.sh`` (vLLM 0.27.1, vLLM Ascend's source on sys.path) and the
session under ``python -m sim.facade --npu-device --``. Every test here is marked
``vllm_ascend`` (excluded from the default run). Outside that set-up the modules skip with
the reason — except when the run selects ``-m vllm_ascend`` with ``ASCENDGRAPH_CI=1``
(``.ci/run``): then a missing environment fails the run instead of turning it green.

``--check-memory``: after each test, the simulator's memory ledger (sim/memory_ledger.py)
checks what vLLM Ascend's graphs keep alive — its ``graph_params`` records and per-size
workspaces (compilation/acl_graph.py) — and the run's summary lists every tensor a record
holds strongly and every shared pool that grows with each capture size (docs/vllm-ascend.md).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterator

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


MEMORY_PROPERTY = "graph memory"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--check-memory", action="store_true", default=False,
                     help="after each vLLM Ascend test, report what its graphs' parameter records and workspaces keep "
                          "alive that weak references would have served (sim/memory_ledger.py)")


@pytest.fixture
def fresh_simulated_npu() -> None:
    """The test starts on a fresh simulated NPU (`sim.facade.configure`), as the modules that build
    their runners with tests/vllm_ascend/serving.py do: an earlier test on this worker may have
    left work queued on its NPU (under `-n 2` without loadfile, a replay waiting on an event
    nobody records reached a DP-rank module's first host collective: GraphHang), which the
    test's first host collective would otherwise run. The DP-rank modules use it."""
    from sim import facade

    facade.configure()


@pytest.fixture(autouse=True)
def _check_graph_memory(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if not request.config.getoption("--check-memory"):
        return
    import graph_memory

    findings = [str(finding) for finding in graph_memory.check().findings]
    if findings:
        request.node.user_properties.append((MEMORY_PROPERTY, "\n".join(findings)))


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    if not config.getoption("--check-memory"):
        return
    seen = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, text in getattr(report, "user_properties", ()):
                if name == MEMORY_PROPERTY and getattr(report, "when", "") == "teardown":
                    seen.append(f"{report.nodeid}:\n{text}")
    terminalreporter.section("memory held by vLLM Ascend's graphs (--check-memory)")
    terminalreporter.write_line("\n".join(seen) if seen else "nothing held that weak references would have served")
