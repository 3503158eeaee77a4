"""Conformance section: constraints (§12)."""

from __future__ import annotations

import pytest
import torch

from ascendgraph import errors, ops
from ascendgraph.errors import (
    CAPTURE_END_BEFORE_BEGIN,
    CAPTURE_END_OTHER_STREAM,
    DEFAULT_STREAM_CAPTURE,
    GRAPH_ALREADY_CAPTURED,
    POOL_BEFORE_CAPTURE,
    REPLAY_BEFORE_CAPTURE,
    TASK_QUEUE_2_DURING_CAPTURE,
)
from ascendgraph.testing.conformance.registry import ALL, case, sim_only
from ascendgraph.testing.conformance.helpers import is_sim, tensor, capture, raises_text, assert_clean


@case(ALL)
def test_capture_on_the_default_stream_is_refused(device):
    graph = device.new_graph()
    with pytest.raises(RuntimeError) as exc:
        with device.graph(graph, stream=device.default_stream()):
            pass
    raises_text(device, exc, DEFAULT_STREAM_CAPTURE)


@case(ALL)
def test_a_second_capture_on_one_graph_is_refused(device):
    graph, _ = capture(device, lambda: torch.ones(2, device=device.torch_device) * 2)
    with pytest.raises(RuntimeError) as exc:
        with device.graph(graph):
            pass
    raises_text(device, exc, GRAPH_ALREADY_CAPTURED)


@case(ALL)
def test_capture_end_before_begin_is_refused(device):
    # On the stream current when the graph was made: torch_npu's NPUGraph remembers that
    # stream and checks "same stream" before the state (lib/libtorch_npu.so,
    # NPUGraph::capture_end), so on any other stream a card answers CAPTURE_END_OTHER_STREAM.
    graph = device.new_graph()
    with pytest.raises(RuntimeError) as exc:
        graph.capture_end()
    raises_text(device, exc, CAPTURE_END_BEFORE_BEGIN)


@case(ALL)
def test_capture_end_on_another_stream_is_refused(device):
    graph = device.new_graph()
    capture_stream, other = device.new_stream(), device.new_stream()
    with device.stream(capture_stream):
        graph.capture_begin()
    try:
        with device.stream(other):
            with pytest.raises(RuntimeError) as exc:
                graph.capture_end()
        raises_text(device, exc, CAPTURE_END_OTHER_STREAM)
    finally:
        with device.stream(capture_stream):
            graph.capture_end()
    graph.reset()


@case(ALL)
def test_replay_before_capture_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        device.new_graph().replay()
    raises_text(device, exc, REPLAY_BEFORE_CAPTURE)


@case(ALL)
def test_pool_before_capture_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        device.new_graph().pool()
    raises_text(device, exc, POOL_BEFORE_CAPTURE)


@case(ALL)
def test_an_unknown_capture_error_mode_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        with device.graph(device.new_graph(), capture_error_mode="loose"):
            pass
    assert "Unknown capture error mode" in str(exc.value)


@case(ALL)
def test_only_one_capture_at_a_time(device):
    first, second = device.new_graph(), device.new_graph()
    before = device.stats()
    with pytest.raises(RuntimeError) as exc:
        with device.graph(first):
            with device.graph(second, stream=device.new_stream()):
                pass
    if is_sim(device):
        assert "already in progress" in str(exc.value)
    assert_clean(device, before)


HOST_SYNCS = {
    "item": lambda t: t.sum().item(),
    "bool": lambda t: bool(t.sum() > 0),
    "tolist": lambda t: t.tolist(),
    "cpu": lambda t: t.cpu(),
    "equal": lambda t: torch.equal(t, t),
    "nonzero": lambda t: t.nonzero(),
    "masked_select": lambda t: t[t > 0],
}


@case(ALL)
@pytest.mark.parametrize("sync", sorted(HOST_SYNCS))
def test_host_synchronisation_during_capture_is_refused(device, sync):
    x = tensor(device, 8)
    before = device.stats()
    with pytest.raises(RuntimeError) as exc:
        with device.graph(device.new_graph()):
            HOST_SYNCS[sync](x)
    if is_sim(device):
        assert isinstance(exc.value, errors.CaptureConstraintError)
        assert "host" in str(exc.value) or "data-dependent" in str(exc.value)
    assert_clean(device, before)


@case(ALL)
def test_device_synchronize_during_capture_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        with device.graph(device.new_graph()):
            device.synchronize()
    if is_sim(device):
        assert "device.synchronize()" in str(exc.value)


@case(sim_only("torch_npu 2.13 captures RNG ops; rejecting them is a simulator default"))
def test_rng_during_capture_is_refused_by_default(device):
    with pytest.raises(errors.CaptureConstraintError, match="random"):
        with device.graph(device.new_graph()):
            torch.rand(4, device=device.torch_device)


@case(sim_only("the allow_rng_in_capture option belongs to the simulator"))
def test_rng_in_capture_is_allowed_when_the_device_allows_it(device):
    from ascendgraph.device import get_device

    permissive = get_device("sim", allow_rng_in_capture=True)
    graph, out = capture(permissive, lambda: torch.rand(1000, device=permissive.torch_device))
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(first, out)  # each replay draws new numbers


@case(sim_only("the environment is injected into the simulator; torch_npu reads the process's"))
def test_task_queue_enable_2_is_refused(device):
    from ascendgraph.device import get_device

    strict = get_device("sim", env={"TASK_QUEUE_ENABLE": "2"})
    with pytest.raises(errors.CaptureConstraintError) as exc:
        with strict.graph(strict.new_graph()):
            pass
    assert str(exc.value) == TASK_QUEUE_2_DURING_CAPTURE
    relaxed = get_device("sim", env={"TASK_QUEUE_ENABLE": "1"})
    capture(relaxed, lambda: torch.ones(1) + 1)


@case(sim_only("the device does not check in-place metadata changes; the simulator refuses them"))
def test_in_place_metadata_changes_during_capture_are_refused(device):
    x = tensor(device, 4, 4)
    with pytest.raises(errors.CaptureConstraintError, match="metadata|shape, strides"):
        with device.graph(device.new_graph()):
            x.t_()
