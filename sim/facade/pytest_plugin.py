"""pytest plugin of the simulator's torch_npu facade: ``--npu-facade``.

Registered as a ``pytest11`` entry point (``ascendgraph_npu_facade``). Inert unless the
switch is given. With ``--npu-facade`` the facade is installed before any plugin asks
whether an NPU is usable (so ``pytest -m npu --npu-facade`` runs the npu suite on the
CPU), every test gets a fresh simulated NPU behind the facade (torch_npu is one
process-wide runtime; a fresh one keeps tests independent), and the report header says
the facade is in use.
"""

from __future__ import annotations

from typing import Iterator, Optional

import pytest

_ACTIVE = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ascendgraph")
    group.addoption(
        "--npu-facade",
        action="store_true",
        default=False,
        help="run torch_npu code (the npu backend, -m npu tests) on the simulator's torch_npu facade "
        "(sim.facade; docs/facade.md); a real torch_npu is shadowed, and the run says so",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    active = bool(config.getoption("--npu-facade", default=False))
    config.stash[_ACTIVE] = active
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
    return "npu: sim.facade (the simulator's torch_npu facade; no NPU is used)"


@pytest.fixture(autouse=True)
def _fresh_facade_npu(request: pytest.FixtureRequest) -> Iterator[None]:
    if not request.config.stash.get(_ACTIVE, False):
        yield
        return
    from sim import facade

    facade.configure()
    yield
