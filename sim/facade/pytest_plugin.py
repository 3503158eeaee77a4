"""pytest plugin of the simulator's torch_npu facade: ``--npu-facade``.

Registered as a ``pytest11`` entry point (``ascendgraph_npu_facade``). Inert unless the
switch is given. With ``--npu-facade`` the facade is installed before any plugin asks
whether an NPU is usable (so ``pytest -m npu --npu-facade`` runs the npu suite on the
CPU), every test gets a fresh simulated NPU behind the facade, and the report header says
the facade is in use.

``--npu-facade-process-wide`` keeps one simulated NPU for the whole process instead, as
torch_npu is on a node: the current stream, torch.npu.graph's class-wide capture stream,
suspended replays, graphs and pools persist from one test to the next, so a test that
leaves state behind breaks the tests after it here as it would on a card (CI runs the
npu suite this way). Tests that call ``sim.facade.configure()`` themselves still get the
fresh device they ask for.
"""

from __future__ import annotations

from typing import Iterator, Optional

import pytest

_ACTIVE = pytest.StashKey[bool]()
_PROCESS_WIDE = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ascendgraph")
    group.addoption(
        "--npu-facade",
        action="store_true",
        default=False,
        help="run torch_npu code (the npu backend, -m npu tests) on the simulator's torch_npu facade "
        "(sim.facade; docs/facade.md); a real torch_npu is shadowed, and the run says so",
    )
    group.addoption(
        "--npu-facade-process-wide",
        action="store_true",
        default=False,
        help="with --npu-facade: one simulated NPU for the whole process (as torch_npu on a node) instead of a "
        "fresh one per test, so state a test leaves behind reaches the next tests",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    active = bool(config.getoption("--npu-facade", default=False))
    process_wide = bool(config.getoption("--npu-facade-process-wide", default=False))
    if process_wide and not active:
        raise pytest.UsageError("--npu-facade-process-wide needs --npu-facade (it says how the facade keeps state)")
    config.stash[_ACTIVE] = active
    config.stash[_PROCESS_WIDE] = process_wide
    if active:
        from sim import facade

        facade.install()


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_ACTIVE, False):
        from sim import facade

        facade.uninstall()


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    if not config.stash.get(_ACTIVE, False):
        return None
    state = "one process-wide simulated NPU" if config.stash.get(_PROCESS_WIDE, False) else "a fresh simulated NPU per test"
    return f"npu: sim.facade (the simulator's torch_npu facade; no NPU is used; {state})"


@pytest.fixture(autouse=True)
def _fresh_facade_npu(request: pytest.FixtureRequest) -> Iterator[None]:
    if not request.config.stash.get(_ACTIVE, False) or request.config.stash.get(_PROCESS_WIDE, False):
        yield
        return
    from sim import facade

    facade.configure()
    yield
