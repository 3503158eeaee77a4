"""Task-group rules and stale-parameter detection of the simulator (issue 15, docs/decisions.md "Stale FULL-graph parameters").

Inside graph_task_group_begin/_end only single-operator kernel tasks may sit: everything
else is refused with a text naming it, and the failed capture gives back every stream and
byte. A replay that executes a task group nobody updated since that replay began raises
StaleGraphParams (``require_task_updates=True``, the default).
"""

from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from ascendgraph import ops
from ascendgraph.errors import CaptureConstraintError, StaleGraphParams
from ascendgraph.workspace_sizes import paged_attention_op_workspace_bytes
from sim import SimDevice


def resources(device: SimDevice) -> tuple:
    stats = device.stats()
    return stats.streams_in_use, stats.pool_bytes, stats.graphs_alive, stats.extra["capturing"]


def _attention_args() -> tuple:
    query = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(0))
    cache = torch.randn(4, 4, 2, 8, generator=torch.Generator().manual_seed(1))
    table = torch.arange(4, dtype=torch.int32).view(2, 2)
    return query, cache, cache.clone(), table, [1, 2], [3, 5], 0.35


# What goes inside the open group -> the words the refusal must contain.
ATTENTION_ARGS = _attention_args()


def _workspace_query(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    ops.attention_workspace(*ATTENTION_ARGS)


def _allocation(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    torch.empty(8)


def _functional_op(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    x * 2


def _item(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    x[0].item()


def _synchronize(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    device.synchronize()


def _event_wait(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    device.new_external_event().wait(device.current_stream())


def _replay(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    other.replay()


def _nested_group(device: SimDevice, x: torch.Tensor, other: Any) -> None:
    device.task_group_begin(device.current_stream())


INTRUDERS: dict[str, tuple[Callable[..., None], str]] = {
    "workspace query": (_workspace_query, "workspace query (ascendgraph.attention_workspace.default)"),
    "allocation": (_allocation, "allocation (aten.empty"),
    "output allocation": (_functional_op, "output allocation (aten.mul.Tensor returns a new tensor)"),
    "host sync (.item())": (_item, "host synchronization"),
    "host sync (synchronize)": (_synchronize, "host synchronization (device.synchronize())"),
    "event wait": (_event_wait, "ExternalEvent (wait of external event#"),
    "graph replay": (_replay, "graph replay (replay of graph#1)"),
    "nested group": (_nested_group, "a task group is already open"),
}


@pytest.mark.parametrize("intruder", sorted(INTRUDERS))
def test_only_kernel_tasks_may_sit_inside_a_task_group_and_the_failed_capture_gives_everything_back(intruder):
    action, words = INTRUDERS[intruder]
    device = SimDevice()
    x = torch.ones(4)
    other = device.new_graph()
    with device.graph(other):
        torch.add(x, 1, out=torch.empty(4))
    baseline = resources(device)
    stream_before = device.current_stream()
    graph = device.new_graph()
    with pytest.raises(CaptureConstraintError) as excinfo:
        with device.graph(graph):
            device.task_group_begin(device.current_stream())
            x.add_(1)  # a kernel task writing into an existing tensor is fine
            action(device, x, other)
    message = str(excinfo.value)
    assert words in message, message
    if intruder != "nested group":
        assert "only single-operator kernel tasks may sit between graph_task_group_begin" in message
        assert "task group 0 (open)" in message and graph.name in message
    assert resources(device) == baseline
    assert device.current_stream() is stream_before and graph.state == "idle"
    # the device is usable: the same graph captures a correct task group now
    out = torch.empty(4)
    with device.graph(graph):
        stream = device.current_stream()
        device.task_group_begin(stream)
        torch.add(x, 1, out=out)
        device.task_group_end(stream)
    assert graph.is_captured


def test_the_workspace_query_and_output_allocations_before_the_group_are_fine():
    device = SimDevice()
    query, key, value, table, ends, lens, scale = ATTENTION_ARGS
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        workspace = ops.attention_workspace(query, key, value, table, ends, lens, scale)
        out = torch.empty_like(query)
        lse = torch.empty(1)
        device.task_group_begin(stream)
        ops.paged_attention(query, key, value, table, ends, lens, scale, out, workspace, lse)
        device.task_group_end(stream)
    assert graph.recorded_ops() == ["ascendgraph.paged_attention.default"]  # the query is no kernel
    assert workspace.dtype == torch.uint8 and workspace.numel() == paged_attention_op_workspace_bytes(query, key, table)
    assert graph.pool_bytes >= workspace.numel() + out.numel() * 4


def test_an_open_group_at_capture_end_is_refused_and_the_capture_gives_everything_back():
    device = SimDevice()
    baseline = resources(device)
    x = torch.ones(2)
    graph = device.new_graph()
    graph_stream = device.new_stream()
    with device.stream(graph_stream):
        graph.capture_begin()
        device.task_group_begin(graph_stream)
        x.add_(1)
        with pytest.raises(CaptureConstraintError, match="was never closed"):
            graph.capture_end()
    assert resources(device) == baseline and graph.state == "idle"


# --------------------------------------------------------------------------- stale parameters


def _updatable(device: SimDevice) -> tuple:
    """One task group behind an ExternalEvent wait, as the FULL-graph protocol captures it."""
    x = torch.arange(4.0)
    out = torch.empty(4)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        event = device.new_external_event()
        event.wait(stream)
        event.reset(stream)
        device.task_group_begin(stream)
        torch.mul(x, 2.0, out=out)
        handle = device.task_group_end(stream)
    return graph, handle, event, x, out


def _update(device: SimDevice, handle: Any, event: Any, x: torch.Tensor, out: torch.Tensor, factor: float,
            *, update: bool = True) -> None:
    stream = device.new_stream()
    with device.stream(stream):
        if update:
            device.task_update_begin(stream, handle)
            torch.mul(x, factor, out=out)
            device.task_update_end(stream)
        event.record(stream)


def test_a_replay_whose_group_was_updated_after_it_began_is_fine():
    device = SimDevice()
    graph, handle, event, x, out = _updatable(device)
    for factor in (3.0, 5.0):
        graph.replay()
        _update(device, handle, event, x, out, factor)
        device.synchronize()
        torch.testing.assert_close(out, x * factor)


def test_a_replay_executing_a_group_without_an_update_raises_stale_graph_params():
    device = SimDevice(lag="synchronous")  # the stale group surfaces when the host hears from the device at once
    graph, handle, event, x, out = _updatable(device)
    graph.replay()
    with pytest.raises(StaleGraphParams) as excinfo:
        _update(device, handle, event, x, out, 3.0, update=False)
    message = str(excinfo.value)
    assert "replay 1 of graph#1 executed task group 0 (aten.mul.out) without a task update" in message
    # the replay completed with the captured parameters; the device is consistent
    torch.testing.assert_close(out, x * 2.0)
    device.synchronize()
    graph.replay()
    _update(device, handle, event, x, out, 4.0)
    device.synchronize()
    torch.testing.assert_close(out, x * 4.0)


def test_an_update_before_the_replay_began_does_not_count():
    device = SimDevice(lag="synchronous")  # the stale group surfaces when the host hears from the device at once
    graph, handle, event, x, out = _updatable(device)
    graph.replay()
    _update(device, handle, event, x, out, 3.0)
    device.synchronize()
    graph.replay()  # replay 2: the update of replay 1 is older than it
    with pytest.raises(StaleGraphParams, match="replay 2 of graph#1"):
        _update(device, handle, event, x, out, 3.0, update=False)


def test_a_skipped_update_fault_is_caught_whatever_the_numbers():
    device = SimDevice(faults="task_update=skip_update", lag="synchronous")
    graph, handle, event, x, out = _updatable(device)
    graph.replay()
    with pytest.raises(StaleGraphParams):
        _update(device, handle, event, x, out, 2.0)  # the same factor: the numbers could not tell


def test_without_required_updates_a_stale_group_is_left_to_the_numbers():
    device = SimDevice(require_task_updates=False)
    graph, handle, event, x, out = _updatable(device)
    graph.replay()
    _update(device, handle, event, x, out, 3.0, update=False)
    device.synchronize()
    torch.testing.assert_close(out, x * 2.0)


def test_a_stale_group_replayed_without_a_wait_surfaces_at_the_replay():
    device = SimDevice(lag="synchronous")  # the stale group surfaces when the host hears from the device at once
    x, out = torch.ones(2), torch.empty(2)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        device.task_group_begin(stream)
        torch.add(x, 1, out=out)
        device.task_group_end(stream)
    with pytest.raises(StaleGraphParams, match="replay 1 of graph#1"):
        graph.replay()
    device.synchronize()  # reported once


def test_super_kernel_scopes_are_noted_on_the_capture_and_blank_names_refused():
    device = SimDevice()
    graph = device.new_graph()
    with device.graph(graph), device.super_kernel_scope("full_model"):
        torch.ones(2) + 1
    assert graph.info()["super_kernel_scopes"] == ["full_model"]
    with pytest.raises(RuntimeError, match="scope_name should be None or a non-empty string."):
        with device.super_kernel_scope("  "):
            pass


@pytest.mark.parametrize(
    "plan, error",
    [
        ("capture_begin=raise(207008)", RuntimeError),
        ("capture_end=raise(207005)", RuntimeError),
        ("malloc=raise(oom)", torch.OutOfMemoryError),
    ],
    ids=["capture_begin", "capture_end", "malloc"],
)
def test_a_capture_failing_at_any_failpoint_gives_back_every_stream_and_byte_and_the_stream(plan, error):
    device = SimDevice()
    x = torch.ones(4)
    keep = device.new_graph()
    with device.graph(keep):
        x * 3  # a graph alive in its own pool: its bytes and stream must stay
    baseline = resources(device)
    stream_before = device.current_stream()
    device.set_fault_plan(plan)
    graph = device.new_graph()
    with pytest.raises(error):
        with device.graph(graph):
            out = torch.empty(4)
            device.task_group_begin(device.current_stream())
            torch.add(x, 1, out=out)
            device.task_group_end(device.current_stream())
            x * 2
    assert resources(device) == baseline
    assert device.current_stream() is stream_before and graph.state == "idle"
    device.set_fault_plan(None)
    with device.graph(graph):
        x * 2
    assert graph.is_captured
