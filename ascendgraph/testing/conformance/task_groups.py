"""Conformance section: task groups, external events."""

from __future__ import annotations

import pytest
import torch

from ascendgraph import errors
from ascendgraph.errors import GraphHang
from ascendgraph.testing.conformance.registry import ALL, case, sim_only
from ascendgraph.testing.conformance.helpers import tensor, TinyAttention, capture_updatable_attention, update_attention
from ascendgraph.testing.conformance.helpers import on_simulator


@case(ALL)
def test_a_task_update_changes_the_replayed_result(device):
    attention = TinyAttention(device)
    graph, handle, event = capture_updatable_attention(device, attention, [3, 5])
    update_stream = device.new_stream()
    graph.replay()
    update_attention(device, attention, handle, event, [6, 9], update_stream)
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([6, 9]))


@case(ALL)
def test_without_the_update_replay_uses_the_frozen_lengths(device):
    attention = TinyAttention(device)
    graph, _, event = capture_updatable_attention(device, attention, [3, 5])
    graph.replay()
    # The simulator (directly, or under hw on the torch_npu facade) also reports the stale group
    # and the replay completes (docs/decisions.md "Stale FULL-graph parameters"); a card
    # replays silently with the frozen lengths.
    reports_stale = on_simulator(device)
    if reports_stale:
        with pytest.raises(errors.StaleGraphParams, match="without a task update"):
            event.record(device.new_stream())  # release the wait, but no update
            device.synchronize()  # the host hears from the device here at the latest
    else:
        event.record(device.new_stream())  # release the wait, but no update
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([3, 5]))
    assert not torch.allclose(attention.out, attention.eager([6, 9]))


@case(ALL)
def test_updates_apply_to_every_later_replay(device):
    attention = TinyAttention(device)
    graph, handle, event = capture_updatable_attention(device, attention, [3, 5])
    stream = device.new_stream()
    for lens in ([2, 4], [7, 1], [9, 9]):
        graph.replay()
        update_attention(device, attention, handle, event, lens, stream)
        device.synchronize()
        torch.testing.assert_close(attention.out, attention.eager(lens))


@case(sim_only("a replay suspended at an external-event wait cannot be observed on hardware"))
def test_replay_suspends_at_an_unrecorded_external_event_until_it_is_recorded(device):
    x = tensor(device, 4)
    graph = device.new_graph()
    event = device.new_external_event()
    with device.graph(graph):
        stream = device.current_stream()
        before = x * 2
        event.wait(stream)
        event.reset(stream)
        after = before + 1
    graph.replay()
    device.queues.run(device.current_stream())  # the device gets as far as it can
    torch.testing.assert_close(before, x * 2)  # ran
    assert torch.isnan(after).all()  # not yet: waiting on the event
    event.record(device.new_stream())
    device.synchronize()
    torch.testing.assert_close(after, x * 2 + 1)


@case(sim_only("a never-recorded event hangs a real device"))
def test_synchronize_with_a_suspended_replay_raises_a_hang_naming_graph_and_event(device):
    device.require_task_updates = False  # this case is about the hang, not the missing update
    attention = TinyAttention(device)
    graph, _, event = capture_updatable_attention(device, attention, [3, 5])
    graph.replay()
    with pytest.raises(GraphHang) as exc:
        device.synchronize()
    assert graph.name in str(exc.value) and str(event) in str(exc.value)
    event.record(device.new_stream())
    device.synchronize()


@case(sim_only("reuse without reset is undefined on hardware; the simulator reports it"))
def test_recording_an_external_event_twice_without_reset_is_an_error(device):
    event = device.new_external_event()
    stream = device.new_stream()
    event.record(stream)
    with pytest.raises(RuntimeError, match="without reset"):
        event.record(stream)
    event.reset(stream)
    event.record(stream)


@case(ALL)
def test_an_eager_wait_before_record_is_released_by_the_record(device):
    event = device.new_external_event()
    waiter, recorder = device.new_stream(), device.new_stream()
    event.wait(waiter)
    assert not waiter.query()  # the waiter holds a wait nobody has recorded yet
    event.record(recorder)
    device.synchronize()
    assert waiter.query() and recorder.query()  # the record released it; nothing is left pending


@case(sim_only("the device's error for a mismatched update is undefined; the simulator names it"))
@pytest.mark.parametrize("mistake", ["wrong op", "extra op", "no op"])
def test_an_update_that_does_not_match_the_group_is_an_error(device, mistake):
    attention = TinyAttention(device)
    graph, handle, event = capture_updatable_attention(device, attention, [3, 5])
    stream = device.new_stream()
    with device.stream(stream):
        device.task_update_begin(stream, handle)
        if mistake == "wrong op":
            attention.out.mul_(2)
        elif mistake == "extra op":
            attention.launch([1, 1])
            attention.out.mul_(2)
        with pytest.raises(errors.CaptureConstraintError, match="does not match its capture"):
            device.task_update_end(stream)


@case(ALL)
def test_task_groups_exist_only_inside_a_capture(device):
    stream = device.new_stream()
    with pytest.raises(RuntimeError):
        device.task_group_begin(stream)


@case(sim_only("stale handles are undefined behaviour on hardware"))
def test_handles_of_a_reset_graph_cannot_be_updated(device):
    attention = TinyAttention(device)
    graph, handle, _ = capture_updatable_attention(device, attention, [3, 5])
    graph.reset()
    stream = device.new_stream()
    with pytest.raises(errors.CaptureConstraintError, match="no longer exists"):
        device.task_update_begin(stream, handle)
