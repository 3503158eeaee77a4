"""``device.queues`` (`sim.queues`), ``device.host_read`` and the lagging device: what the host issues
on a stream runs when something waits for it, in stream order, and the ordering hazards that lag
makes possible on a card (vLLM Ascend's async-scheduling hang among them) are named errors."""

from __future__ import annotations

import pytest
import torch

from ascendgraph.errors import CaptureConstraintError, ConfigError, GraphHang, StaleGraphParams, StreamOrderError
from ascendgraph.testing.conformance.helpers import TinyAttention, capture_updatable_attention, update_attention
from sim import SimDevice


def capture(device, fn):
    graph = device.new_graph()
    with device.graph(graph):
        out = fn()
    return graph, out


# ----------------------------------------------------------------------------- the queues


def test_submitted_work_runs_when_the_stream_is_waited_for_in_stream_order():
    device = SimDevice()
    stream = device.new_stream()
    ran: list[str] = []
    device.queues.submit(stream, lambda: ran.append("first"), label="first")
    device.queues.submit(stream, lambda: ran.append("second"), label="second")
    assert ran == [] and device.queues.pending(stream) == 2  # the device runs behind the host
    stream.synchronize()
    assert ran == ["first", "second"] and device.queues.pending() == 0


def test_immediate_runs_each_item_when_issued_unless_its_stream_is_blocked():
    device = SimDevice(lag="immediate")
    stream = device.new_stream()
    event = device.new_external_event()
    ran: list[str] = []
    device.queues.submit(stream, lambda: ran.append("first"), label="first")
    event.wait(stream)  # blocks the stream until the event is recorded
    device.queues.submit(stream, lambda: ran.append("second"), label="second")
    assert ran == ["first"] and device.queues.pending(stream) == 2
    event.record(device.default_stream())
    assert ran == ["first", "second"] and device.queues.pending() == 0


def test_a_wait_pulls_the_stream_that_records_the_event_up_to_the_record():
    device = SimDevice()
    producer, consumer = device.new_stream(), device.new_stream()
    event = device.new_external_event()
    ran: list[str] = []
    event.wait(consumer)
    device.queues.submit(consumer, lambda: ran.append("consumer"), label="consumer")
    device.queues.submit(producer, lambda: ran.append("before the record"), label="a")
    event.record(producer)
    device.queues.submit(producer, lambda: ran.append("after the record"), label="b")
    consumer.synchronize()
    assert ran == ["before the record", "consumer"]  # the producer ran only as far as the record
    assert device.queues.pending(producer) == 1


def test_flushing_a_stream_nothing_will_release_is_a_hang_naming_it():
    device = SimDevice()
    stream = device.new_stream()
    event = device.new_external_event()
    event.wait(stream)
    device.queues.submit(stream, lambda: None, label="copy")
    with pytest.raises(GraphHang, match=f"{stream} is waiting on {event}"):
        device.queues.flush(stream, reason="stream.synchronize()")
    with pytest.raises(GraphHang):
        device.synchronize()


def test_bad_queue_input_is_refused_with_the_fix():
    device = SimDevice()
    with pytest.raises(ConfigError, match="callable"):
        device.queues.submit(device.default_stream(), "not work", label="x")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="lag must be one of device, immediate, synchronous, got 'later'"):
        SimDevice(lag="later")


# ----------------------------------------------------------------------------- replays behind the host


def test_a_replay_runs_when_the_host_waits_for_it_not_when_it_is_issued():
    device = SimDevice()
    x = torch.ones(4)
    graph, out = capture(device, lambda: x * 3)
    graph.replay()
    assert torch.isnan(out).all()  # issued, not run: the host did not wait
    device.current_stream().synchronize()
    assert torch.equal(out, x * 3)
    x.fill_(2)
    graph.replay()
    device.host_read("Tensor.item()")  # a host read of device memory waits for the current stream
    assert torch.equal(out, x * 3)


def test_an_eager_kernel_the_simulator_sees_does_not_overtake_its_streams_queue():
    device = SimDevice()
    x = torch.ones(4)
    graph, out = capture(device, lambda: x * 3)
    graph.replay()
    with device.track_eager():  # the engine's served steps run under it
        read = out + 0  # ordered after the replay on the same stream, as on a card
    assert torch.equal(read, x * 3)


def test_an_event_orders_a_second_stream_after_a_replay():
    device = SimDevice()
    x = torch.ones(4)
    graph, out = capture(device, lambda: x * 3)
    side = device.new_stream()
    seen: list[torch.Tensor] = []
    graph.replay()
    done = device.new_event()
    done.record(device.current_stream())
    done.wait(side)
    device.queues.submit(side, lambda: seen.append(out.clone()), label="read on the side stream")
    assert not done.query() or seen == []  # query lets the device catch up, the side stream waits its turn
    side.synchronize()
    assert torch.equal(seen[0], x * 3)  # the side stream waited for the replay through the event


def test_a_host_read_inside_a_capture_is_the_host_sync_error():
    device = SimDevice()
    graph = device.new_graph()
    with pytest.raises(CaptureConstraintError, match=r"Tensor\.item\(\) synchronizes with the host"):
        with device.graph(graph):
            _ = torch.ones(4) * 2
            device.host_read("Tensor.item()")
    assert graph.state == "idle"  # the failed capture left nothing behind


def test_a_host_read_waits_for_the_current_stream_and_hangs_when_it_cannot():
    device = SimDevice()
    event = device.new_external_event()
    stream = device.current_stream()
    event.wait(stream)
    with pytest.raises(GraphHang, match="waiting on"):
        device.host_read("Tensor.item()")
    event.record(device.new_stream())
    device.host_read("Tensor.item()")
    assert device.queues.pending() == 0


# ----------------------------------------------------------------------------- the hazards


def _async_steps(device, *, synchronize: bool):
    """vLLM Ascend's FULL decode loop under async scheduling: replay, then the task updates and
    the event record on the update stream; the next step starts before the device finished."""
    attention = TinyAttention(device)
    graph, handle, event = capture_updatable_attention(device, attention, [3, 5])
    update_stream = device.new_stream()
    for lens in ([2, 4], [7, 1], [9, 9]):
        if synchronize:  # acl_graph.py@182b75ea:253-266: synchronize before a FULL replay
            device.current_stream().synchronize()
        graph.replay()
        update_attention(device, attention, handle, event, lens, update_stream)
    device.synchronize()
    return attention


def test_a_task_update_not_ordered_after_the_previous_replay_is_refused_naming_stream_group_and_replay():
    device = SimDevice()
    with pytest.raises(StreamOrderError, match=r"task update of task group 0 of graph#1 on stream \d+ \(the update issued "
                                               r"after replay 2\) is not ordered after replay 1 of graph#1 on stream 0 "
                                               r"\(default\)"):
        _async_steps(device, synchronize=False)


def test_synchronizing_before_each_full_replay_keeps_the_steps_in_order():
    device = SimDevice()
    attention = _async_steps(device, synchronize=True)
    torch.testing.assert_close(attention.out, attention.eager([9, 9]))


def test_the_hazard_does_not_depend_on_how_fast_the_device_is():
    # A device that runs every item as it is issued still lets the host run ahead: the same race.
    with pytest.raises(StreamOrderError, match="is not ordered after replay 1 of graph#1"):
        _async_steps(SimDevice(lag="immediate"), synchronize=False)


def test_the_synchronous_setting_waits_for_every_item_so_the_same_loop_passes():
    device = SimDevice(lag="synchronous")
    attention = _async_steps(device, synchronize=False)
    torch.testing.assert_close(attention.out, attention.eager([9, 9]))


def test_an_event_recorded_before_the_previous_replay_consumed_it_is_a_hang_naming_stream_event_and_replay():
    device = SimDevice()
    x = torch.ones(4)
    graph = device.new_graph()
    event = device.new_external_event()
    with device.graph(graph):
        stream = device.current_stream()
        event.wait(stream)
        event.reset(stream)
        out = x + 1
    recorder = device.new_stream()
    graph.replay()
    event.record(recorder)  # releases replay 1
    graph.replay()  # no synchronize: replay 1 may not have waited and reset yet
    with pytest.raises(GraphHang, match=rf"{event} is recorded on {recorder} \(the record for replay 2 of graph#1\) "
                                        rf"while nothing orders it after replay 1 of graph#1 on stream \d+"):
        event.record(recorder)
    assert torch.isnan(out).all()  # nothing ran: the host never waited


def test_a_record_that_releases_a_replay_before_its_update_was_issued_is_stale_at_once():
    # The replay's wait is released before any update was issued: whatever the host issues next is
    # not ordered before the group, which runs with the captured lengths on a card. The host hears
    # it at the record, as it would if the device were fast (lag="immediate").
    for lag in ("device", "immediate"):
        device = SimDevice(lag=lag)
        attention = TinyAttention(device)
        graph, handle, event = capture_updatable_attention(device, attention, [3, 5])
        graph.replay()
        with pytest.raises(StaleGraphParams, match="replay 1 of graph#1 executed task group 0"):
            event.record(device.new_stream())
        device.synchronize()  # reported once: the replay completes with the captured lengths
        torch.testing.assert_close(attention.out, attention.eager([3, 5]))


def test_a_replay_whose_group_is_not_behind_an_event_runs_before_a_later_update():
    device = SimDevice()
    x, out = torch.ones(2), torch.empty(2)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        device.task_group_begin(stream)
        torch.add(x, 1, out=out)
        handle = device.task_group_end(stream)
    graph.replay()
    update = device.new_stream()
    with device.stream(update):  # issued after the replay, but nothing makes the replay wait for it
        device.task_update_begin(update, handle)
        torch.add(x, 5, out=out)
        device.task_update_end(update)
    with pytest.raises(StaleGraphParams, match="replay 1 of graph#1"):
        device.synchronize()


def test_a_host_read_before_the_copy_that_fills_it_is_refused_and_reads_the_old_data():
    device = SimDevice()
    stream = device.new_stream()
    source = torch.arange(4.0)
    pinned = torch.zeros(4)  # host memory a D2H copy fills
    device.queues.copy(pinned, source, stream=stream, destination_is_host=True)
    assert torch.equal(pinned, torch.zeros(4))  # the copy has not run
    with pytest.raises(StreamOrderError, match=rf"Tensor\.tolist\(\) reads host memory that copy of \(4,\) float32 on "
                                               rf"{stream} fills, and nothing waited for that copy"):
        device.host_access(pinned, "Tensor.tolist()")
    stream.synchronize()
    device.host_access(pinned, "Tensor.tolist()")
    assert torch.equal(pinned, source)


def test_writing_the_source_of_a_queued_host_to_device_copy_is_refused():
    device = SimDevice()
    stream = device.new_stream()
    staging = torch.arange(4.0)  # pinned host memory an H2D copy reads
    on_device = torch.zeros(4)
    device.queues.copy(on_device, staging, stream=stream, source_is_host=True)
    with pytest.raises(StreamOrderError, match="writes host memory that .* reads"):
        device.host_access(staging, "Tensor.copy_()", write=True)
    done = device.new_event()
    done.record(stream)
    done.synchronize()
    device.host_access(staging, "Tensor.copy_()", write=True)
    assert torch.equal(on_device, torch.arange(4.0))


def test_queued_work_issued_in_inference_mode_runs_after_the_host_left_it():
    # vLLM's runner fills pinned host buffers made under torch.inference_mode() with
    # non-blocking copies; the stream runs them when the host waits, possibly outside that mode.
    device = SimDevice()
    stream = device.new_stream()
    with torch.inference_mode():
        pinned = torch.zeros(4)  # an inference tensor
        source = torch.arange(4.0)
        device.queues.copy(pinned, source, stream=stream, destination_is_host=True)
        device.queues.submit(stream, lambda: pinned.add_(1), label="an in-place kernel on it")
    stream.synchronize()  # outside inference mode: torch refuses an in-place update of pinned here
    assert pinned.tolist() == [1.0, 2.0, 3.0, 4.0]


def test_abandoning_the_queues_runs_what_can_run_and_forgets_what_never_will():
    device = SimDevice()
    ran: list[str] = []
    free, stuck = device.new_stream(), device.new_stream()
    device.queues.submit(free, lambda: ran.append("free"), label="free work")
    event = device.new_external_event()
    event.wait(stuck)
    device.queues.submit(stuck, lambda: ran.append("stuck"), label="stuck work")
    left = device.queues.abandon()
    assert ran == ["free"]
    assert len(left) == 2 and all(str(stuck) in item for item in left)  # the wait and the work behind it
    assert device.queues.pending() == 0
    device.synchronize()  # the hang was forgotten with the work
