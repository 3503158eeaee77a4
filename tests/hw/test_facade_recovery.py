"""A facade that recovers: leaving a task update, a task group or a capture by an exception
closes it, `sim.facade.configure()` resets the whole simulated NPU, and under ``--npu-facade`` a
test that leaves one of them open fails itself and the next test starts clean (docs/facade.md,
"Work left open, and recovering from it")."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from hw import api
from tests.inner_pytest import UNUSED_PLUGINS_OFF

REPO = Path(__file__).resolve().parents[2]


def simulator_modes() -> list[Any]:
    stacks = _get_current_dispatch_mode_stack() + _get_current_function_mode_stack()
    return [mode for mode in stacks if type(mode).__module__.startswith("sim.")]


class Doubling:
    """A captured graph whose one task group computes ``out = x * factor``, behind an
    ExternalEvent as vLLM Ascend's attention: a replay waits until an update re-issued it."""

    def __init__(self, npu: Any) -> None:
        self.npu = npu
        self.x = torch.arange(4.0)
        self.out = torch.empty(4)
        self.event = npu.ExternalEvent()
        self.graph = npu.NPUGraph()
        with npu.graph(self.graph):
            stream = npu.current_stream()
            factor = torch.full((4,), 2.0)  # allocated before the group (the facade's strictness)
            self.event.wait(stream)
            self.event.reset(stream)
            npu.graph_task_group_begin(stream)
            torch.mul(self.x, factor, out=self.out)
            self.handle = npu.graph_task_group_end(stream)

    def update(self, stream: Any, factor: torch.Tensor) -> None:
        self.npu.graph_task_update_begin(stream, self.handle)
        torch.mul(self.x, factor, out=self.out)
        self.npu.graph_task_update_end(stream)
        self.event.record(stream)


def test_configure_takes_a_task_update_left_open_off_the_dispatch_stack(torch_npu: Any) -> None:
    from sim import facade

    npu = torch_npu.npu
    doubling = Doubling(npu)
    with pytest.raises(ValueError):
        npu.graph_task_update_begin(npu.Stream(), doubling.handle)
        raise ValueError("refused inside the update")  # no torch.npu.stream around it: stays open
    assert facade.runtime().open_work() == [f"a task update of {doubling.handle.name} on stream 2"]
    facade.configure()
    assert simulator_modes() == []
    torch.testing.assert_close(torch.arange(4.0) * 3, torch.tensor([0.0, 3.0, 6.0, 9.0]))


def test_leaving_torch_npu_stream_by_an_exception_closes_the_task_update_on_it(torch_npu: Any) -> None:
    from sim import facade

    npu = torch_npu.npu
    doubling = Doubling(npu)
    update_stream = npu.Stream()
    with pytest.raises(ValueError):
        with npu.stream(update_stream):  # vLLM Ascend's update_graph_params
            npu.graph_task_update_begin(update_stream, doubling.handle)
            raise ValueError("refused inside the update")
    assert facade.runtime().open_work() == [] and simulator_modes() == []
    torch.testing.assert_close(torch.arange(4.0) * 3, torch.tensor([0.0, 3.0, 6.0, 9.0]))
    doubling.graph.replay()  # the group was not updated by the failed update: the next one works
    doubling.update(update_stream, torch.full((4,), 5.0))
    npu.synchronize()
    torch.testing.assert_close(doubling.out, torch.arange(4.0) * 5)


def test_leaving_torch_npu_graph_by_an_exception_in_a_task_group_raises_the_blocks_own_error(torch_npu: Any) -> None:
    from sim import facade

    npu = torch_npu.npu
    default = npu.current_stream()
    with pytest.raises(ValueError, match="the block's own error") as info:
        with npu.graph(npu.NPUGraph()):
            npu.graph_task_group_begin(npu.current_stream())
            raise ValueError("the block's own error")
    assert "never closed" not in str(info.value.__context__ or "")
    assert npu.current_stream() == default  # capture_end did not raise: the stream is restored
    assert facade.runtime().open_work() == [] and simulator_modes() == []


def test_leaving_torch_npu_stream_by_an_exception_aborts_a_capture_begun_on_it(torch_npu: Any) -> None:
    from sim import facade

    npu = torch_npu.npu
    graph = npu.NPUGraph()
    with pytest.raises(ValueError):
        with npu.stream(npu.Stream()):
            graph.capture_begin()
            npu.graph_task_group_begin(npu.current_stream())
            raise ValueError("inside the capture")
    assert facade.runtime().open_work() == [] and simulator_modes() == []
    assert not graph.sim_graph.is_captured
    torch.testing.assert_close(torch.ones(2) + 1, torch.full((2,), 2.0))


def test_configure_resets_the_whole_simulated_npu(torch_npu: Any) -> None:
    from sim import facade

    npu = torch_npu.npu
    doubling = Doubling(npu)
    npu.set_stream(npu.Stream())
    npu.graph_task_update_begin(npu.Stream(), doubling.handle)  # left open
    open_graph = npu.NPUGraph()
    open_graph.capture_begin()  # left open, on the side stream made current above
    npu.graph_task_group_begin(npu.current_stream())
    before = facade.runtime()
    assert before.default_capture_stream is not None and len(before.open_work()) == 2
    fresh = facade.configure()
    assert simulator_modes() == [] and not fresh.guarded and fresh.open_work() == []
    assert npu.current_stream() == npu.default_stream()
    assert fresh.default_capture_stream is None and fresh.device.stats().pool_bytes == 0
    assert before.device.open_work() == []  # the old NPU's work was closed, not just dropped
    torch.testing.assert_close(torch.arange(4.0) * 3, torch.tensor([0.0, 3.0, 6.0, 9.0]))


def test_configured_closes_what_the_block_left_open(torch_npu: Any) -> None:
    from sim import facade

    npu = torch_npu.npu
    with facade.configured(stream_limit=8):
        doubling = Doubling(npu)
        npu.graph_task_update_begin(npu.Stream(), doubling.handle)
    assert simulator_modes() == []
    torch.testing.assert_close(torch.arange(4.0) * 3, torch.tensor([0.0, 3.0, 6.0, 9.0]))


# ----------------------------------------------------------------------------- the pytest plugin
INNER_SUITE = '''
import pytest
import torch

npu = torch.npu


def tripling():
    """A graph computing out = x * 3 in a task group behind an ExternalEvent (vLLM Ascend's shape)."""
    x, out, event = torch.arange(4.0), torch.empty(4), npu.ExternalEvent()
    graph = npu.NPUGraph()
    with npu.graph(graph):
        stream = npu.current_stream()
        event.wait(stream)
        event.reset(stream)
        npu.graph_task_group_begin(stream)
        torch.mul(x, 3.0, out=out)
        handle = npu.graph_task_group_end(stream)
    return graph, handle, event, x, out


def test_1_raises_inside_a_task_update():
    graph, handle, event, x, out = tripling()
    graph.replay()
    npu.graph_task_update_begin(npu.Stream(), handle)
    raise ValueError("refused inside update_graph_params")


def test_2_computes():
    torch.testing.assert_close(torch.arange(4.0) * 3, torch.tensor([0.0, 3.0, 6.0, 9.0]))
    graph, handle, event, x, out = tripling()
    graph.replay()
    update_stream = npu.Stream()
    with npu.stream(update_stream):
        npu.graph_task_update_begin(update_stream, handle)
        torch.mul(x, 3.0, out=out)
        npu.graph_task_update_end(update_stream)
        event.record(update_stream)
    npu.synchronize()
    torch.testing.assert_close(out, torch.tensor([0.0, 3.0, 6.0, 9.0]))


def test_3_leaves_a_capture_open_without_raising():
    npu.set_stream(npu.Stream())
    npu.NPUGraph().capture_begin()


def test_4_computes():
    assert npu.current_stream() == npu.default_stream()
    torch.testing.assert_close(torch.ones(3) * 4, torch.full((3,), 4.0))
'''


def run_inner(root: Path, *args: str) -> tuple[int, str]:
    registered = {ep.value for ep in entry_points(group="pytest11")}
    plugins = [arg for name in ("ascendgraph.testing.plugin", "ascendgraph_npu_facade")
               if name not in registered for arg in ("-p", name)]
    command = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-p", "no:xdist", *UNUSED_PLUGINS_OFF,
               *plugins, *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=300)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.skipif(api.load_torch_npu()[0] is not None, reason="torch_npu is importable here")
@pytest.mark.parametrize("mode", [(), ("--npu-facade-process-wide",)], ids=["per-test", "process-wide"])
def test_a_test_that_leaves_work_open_fails_itself_and_the_next_test_starts_clean(
    tmp_path: Path, mode: tuple[str, ...]
) -> None:
    (tmp_path / "test_inner.py").write_text(INNER_SUITE)
    code, output = run_inner(tmp_path, "--npu-facade", *mode)
    assert code == 1, output
    assert "PASSED test_inner.py::test_2_computes" in output and "PASSED test_inner.py::test_4_computes" in output
    assert "FAILED test_inner.py::test_1_raises_inside_a_task_update" in output
    assert "FAILED test_inner.py::test_3_leaves_a_capture_open_without_raising" in output
    assert re.search(r"ValueError: refused inside update_graph_params\nE +the test left a task update of task group 0 of "
                     r"graph#\d+ on stream \d+ open on the simulated NPU", output), output
    assert re.search(r"the test left the capture of graph#\d+ on stream \d+ open", output), output
    assert "2 failed, 2 passed" in output
