"""pytest plugin of the simulator's torch_npu facade: ``--npu-facade``.

Registered as a ``pytest11`` entry point (``ascendgraph_npu_facade``). Inert unless the
switch is given, and light: it is a package of its own, outside ``sim``, because pytest loads
every entry point in every run of the environment, and importing ``sim`` imports torch and
the simulator (about 1.7 s of CPU). ``sim.facade`` is imported only when the switch is on. With ``--npu-facade`` the facade is installed before any plugin asks
whether an NPU is usable (so ``pytest -m npu --npu-facade`` runs the npu suite on the
CPU), every test gets a fresh simulated NPU behind the facade, and the report header says
the facade is in use.

``--npu-facade-process-wide`` keeps one simulated NPU for the whole process instead, as
torch_npu is on a node: the current stream, torch.npu.graph's class-wide capture stream,
suspended replays, graphs and pools persist from one test to the next, so a test that
leaves state behind breaks the tests after it here as it would on a card (CI runs the
npu suite this way). Tests that call ``sim.facade.configure()`` themselves still get the
fresh device they ask for.

Either way, a test that leaves a capture, a task group, a task update or a super kernel scope
open fails itself, naming what it left open (its fixtures' teardown: an error of that test), and
the simulated NPU is reset (`sim.facade.configure`: torch's mode stacks cleared of the facade's
modes, a new current stream, capture stream, pools), so the next test starts clean in both
modes. Without that reset, a task update's collector left on torch's dispatch stack turns every
later op of the process into an uncomputed output.
"""

from __future__ import annotations

import gc
import sys
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
        fresh = "torch" not in sys.modules
        from sim import facade

        facade.install()
        if fresh:
            # What importing torch and the simulator made (about 180,000 objects) lives as long
            # as the process: frozen, the collector's full collections no longer walk it. Those of
            # a short facade session come late (assertion rewriting, pytest's own gc.collect()
            # at the end) and walked it six times: 0.9 s of the first facade test's 3.9 s of CPU.
            # Only when this hook imported torch (nothing of the caller's is frozen with it).
            gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_ACTIVE, False):
        from sim import facade

        facade.uninstall()


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    if not config.stash.get(_ACTIVE, False):
        return None
    state = "one process-wide simulated NPU" if config.stash.get(_PROCESS_WIDE, False) else "a fresh simulated NPU per test"
    return f"npu: sim.facade (the simulator's torch_npu facade; no NPU is used; {state})"


LEFT_OPEN = (
    "{where} left {what} open on the simulated NPU (sim.facade); the NPU was reset for the next test. "
    "Close each with its end call (capture_end, graph_task_group_end, graph_task_update_end, "
    "super_kernel_scope_end) also when the work in between raises"
)


def _close_what_was_left_open(where: str) -> Optional[str]:
    """Reset the facade's NPU when something is open on it; the failure text, or None."""
    from sim import facade

    rt = facade.runtime()
    if not rt.open_work():
        return None
    left = rt.close_open_work()
    facade.configure()
    return LEFT_OPEN.format(where=where, what="; ".join(left))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    if not item.config.stash.get(_ACTIVE, False):
        return (yield)
    try:
        result = yield
    except BaseException as error:
        left = _close_what_was_left_open("the test")
        if left is not None:
            error.add_note(left)
        raise
    left = _close_what_was_left_open("the test")
    if left is not None:
        pytest.fail(left, pytrace=False)
    return result


@pytest.fixture(autouse=True)
def _fresh_facade_npu(request: pytest.FixtureRequest) -> Iterator[None]:
    if not request.config.stash.get(_ACTIVE, False):
        yield
        return
    from sim import facade

    if request.config.stash.get(_PROCESS_WIDE, False):
        _close_what_was_left_open("the previous test")  # already reported there; the NPU starts clean
    else:
        facade.configure()
    yield
    left = _close_what_was_left_open("the test's fixtures")
    if left is not None:
        pytest.fail(left, pytrace=False)
