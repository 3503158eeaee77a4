"""Conformance section: faults (simulator)."""

from __future__ import annotations

import pytest
import torch

from ascendgraph.errors import DeviceLost, GraphHang, StreamResourceExhausted, rewrite_capture_error
from ascendgraph.testing.conformance.registry import case, sim_only
from ascendgraph.testing.conformance.helpers import (
    tensor,
    capture,
    assert_clean,
    TinyAttention,
    capture_updatable_attention,
    update_attention,
)
from ascendgraph import errors
from ascendgraph import ops


@case(sim_only("fault injection is a simulator facility"))
def test_a_capture_begin_fault_fires_after_the_counted_passes(device):
    device.set_fault_plan("capture_begin=2*off->raise(207008)")
    x = torch.ones(1)
    alive = [capture(device, lambda: x + 1) for _ in range(2)]
    assert len(alive) == 2
    before = device.stats()
    with pytest.raises(RuntimeError) as exc:
        capture(device, lambda: x + 1)
    assert isinstance(rewrite_capture_error(exc.value), StreamResourceExhausted)
    assert_clean(device, before)


@case(sim_only("fault injection is a simulator facility"))
def test_device_loss_fails_every_later_call(device):
    x = torch.ones(1)
    graph, _ = capture(device, lambda: x + 1)
    device.set_fault_plan("replay=raise(device_lost)")
    with pytest.raises(DeviceLost):
        graph.replay()
    with pytest.raises(DeviceLost):
        device.synchronize()


@case(sim_only("fault injection is a simulator facility"))
def test_a_skipped_update_leaves_stale_results(device):
    attention = TinyAttention(device)
    graph, handle, event = capture_updatable_attention(device, attention, [3, 5])
    device.set_fault_plan("task_update=skip_update")
    graph.replay()
    with pytest.raises(errors.StaleGraphParams, match=f"replay 1 of {graph.name} executed task group 0"):
        update_attention(device, attention, handle, event, [6, 9], device.new_stream())
        device.synchronize()  # the host hears from the device here at the latest
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([3, 5]))


@case(sim_only("fault injection is a simulator facility"))
def test_without_required_updates_a_skipped_update_is_left_to_the_numbers(device):
    device.require_task_updates = False
    attention = TinyAttention(device)
    graph, handle, event = capture_updatable_attention(device, attention, [3, 5])
    device.set_fault_plan("task_update=skip_update")
    graph.replay()
    update_attention(device, attention, handle, event, [6, 9], device.new_stream())
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([3, 5]))


@case(sim_only("what a card does with a non-kernel task inside a task group is undefined; the simulator refuses it"))
@pytest.mark.parametrize("intruder", ["workspace query", "allocation", "event wait"])
def test_only_kernel_tasks_may_sit_inside_a_task_group(device, intruder):
    attention = TinyAttention(device)
    before = device.stats()
    stream_before = device.current_stream()
    graph = device.new_graph()
    with pytest.raises(errors.CaptureConstraintError, match="only single-operator kernel tasks") as exc:
        with device.graph(graph):
            stream = device.current_stream()
            device.task_group_begin(stream)
            if intruder == "workspace query":
                ops.attention_workspace(
                    attention.query, attention.key_cache, attention.value_cache, attention.block_table,
                    [1, 2], [3, 5], attention.scale,
                )
            elif intruder == "allocation":
                torch.empty(4, device=device.torch_device)
            else:
                device.new_external_event().wait(stream)
    assert {"event wait": "ExternalEvent (wait"}.get(intruder, intruder) in str(exc.value)
    assert_clean(device, before)
    assert device.current_stream() == stream_before


@case(sim_only("the workspace query's size is the simulator's stand-in"))
def test_prepared_outside_the_group_the_attention_call_captures(device):
    attention = TinyAttention(device)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        workspace = ops.attention_workspace(
            attention.query, attention.key_cache, attention.value_cache, attention.block_table,
            [1, 2], [3, 5], attention.scale,
        )
        lse = torch.empty(1, dtype=attention.query.dtype, device=device.torch_device)
        device.task_group_begin(stream)
        ops.paged_attention(
            attention.query, attention.key_cache, attention.value_cache, attention.block_table,
            [1, 2], [3, 5], attention.scale, attention.out, workspace, lse,
        )
        device.task_group_end(stream)
    assert graph.recorded_ops() == ["ascendgraph.paged_attention.default"]


@case(sim_only("fault injection is a simulator facility"))
def test_an_oom_during_capture_leaves_nothing_behind(device):
    device.set_fault_plan("malloc=1*off->raise(oom)")
    x = tensor(device, 16, 16)
    before = device.stats()
    with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory"):
        capture(device, lambda: (x @ x) + 1)
    assert_clean(device, before)


@case(sim_only("fault injection is a simulator facility"))
def test_a_hung_replay_is_reported_at_synchronize(device):
    x = torch.ones(1)
    graph, _ = capture(device, lambda: x + 1)
    device.set_fault_plan("replay=hang")
    graph.replay()
    with pytest.raises(GraphHang, match=graph.name):
        device.synchronize()
