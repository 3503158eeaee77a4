"""``device.queues`` (`sim.queues`) and ``device.host_read``: device work a device type submits to a
stream runs in stream order, behind what the stream is blocked on; a host read flushes the
current stream and is refused inside a capture."""

from __future__ import annotations

import pytest
import torch

from ascendgraph.errors import CaptureConstraintError, ConfigError, GraphHang
from sim import SimDevice


def test_submitted_work_runs_in_stream_order_behind_an_unrecorded_wait():
    device = SimDevice()
    stream = device.new_stream()
    event = device.new_external_event()
    ran: list[str] = []
    device.queues.submit(stream, lambda: ran.append("first"), label="first")
    event.wait(stream)  # blocks the stream until the event is recorded
    device.queues.submit(stream, lambda: ran.append("second"), label="second")
    device.queues.flush(device.default_stream(), reason="another stream")  # nothing waits there
    assert "second" not in ran and device.queues.pending(stream) == 2
    event.record(device.default_stream())
    device.queues.flush(stream, reason="test")
    assert ran == ["first", "second"] and device.queues.pending() == 0


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


def test_submit_needs_a_callable():
    device = SimDevice()
    with pytest.raises(ConfigError, match="callable"):
        device.queues.submit(device.default_stream(), "not work", label="x")  # type: ignore[arg-type]


def test_a_host_read_waits_for_the_current_stream():
    device = SimDevice()
    event = device.new_external_event()
    stream = device.current_stream()
    event.wait(stream)
    with pytest.raises(GraphHang, match="waiting on"):
        device.host_read("Tensor.item()")
    event.record(device.new_stream())
    device.host_read("Tensor.item()")
    assert device.queues.pending() == 0


def test_a_host_read_inside_a_capture_is_the_host_sync_error():
    device = SimDevice()
    graph = device.new_graph()
    with pytest.raises(CaptureConstraintError, match=r"Tensor\.item\(\) synchronizes with the host"):
        with device.graph(graph):
            _ = torch.ones(4) * 2
            device.host_read("Tensor.item()")
    assert graph.state == "idle"  # the failed capture left nothing behind
