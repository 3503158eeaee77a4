"""Conformance section: capture and replay."""

from __future__ import annotations

import torch

from ascendgraph import ops
from ascendgraph.testing.conformance.registry import ALL, case, sim_only
from ascendgraph.testing.conformance.helpers import tensor, capture


@case(ALL)
def test_replay_equals_eager(device):
    x, w = tensor(device, 4, 16), tensor(device, 16, 16, seed=1)

    def step():
        return torch.relu(x @ w).softmax(-1) * 2 + 1

    graph, out = capture(device, step)
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, step())


@case(ALL)
def test_replay_reads_new_values_copied_into_the_captured_input(device):
    x, w = tensor(device, 4, 16), tensor(device, 16, 8, seed=1)
    graph, out = capture(device, lambda: x @ w)
    fresh = tensor(device, 4, 16, seed=5)
    x.copy_(fresh)
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, fresh @ w)


@case(ALL)
def test_a_new_tensor_not_copied_into_the_captured_input_is_ignored(device):
    w = tensor(device, 16, 8, seed=1)
    inputs = {"x": tensor(device, 4, 16)}
    captured = inputs["x"].clone()
    graph, out = capture(device, lambda: inputs["x"] @ w)
    inputs["x"] = tensor(device, 4, 16, seed=9)  # rebinding is invisible to the graph
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, captured @ w)
    assert not torch.allclose(out, inputs["x"] @ w)


@case(ALL)
def test_outputs_keep_their_address_across_replays(device):
    x = tensor(device, 8)
    graph, out = capture(device, lambda: x * 3)
    address = out.data_ptr()
    for _ in range(3):
        graph.replay()
    device.synchronize()
    assert out.data_ptr() == address
    torch.testing.assert_close(out, x * 3)


@case(ALL)
def test_python_scalars_are_frozen_at_capture(device):
    x = tensor(device, 8)
    settings = {"scale": 2.0}
    graph, out = capture(device, lambda: x * settings["scale"])
    settings["scale"] = 5.0
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x * 2.0)


@case(ALL)
def test_in_place_work_runs_once_per_replay_and_not_at_capture(device):
    counter = torch.zeros(4, device=device.torch_device)
    graph, _ = capture(device, lambda: counter.add_(1))
    device.synchronize()
    assert torch.equal(counter, torch.zeros(4, device=device.torch_device))
    for _ in range(3):
        graph.replay()
    device.synchronize()
    assert torch.equal(counter, torch.full((4,), 3.0, device=device.torch_device))


@case(ALL)
def test_replay_runs_on_the_default_stream_and_on_side_streams(device):
    x = tensor(device, 8)
    graph, out = capture(device, lambda: x + 1)
    with device.stream(device.default_stream()):
        graph.replay()
    x.add_(10)
    with device.stream(device.new_stream()):
        graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x + 1)


@case(ALL)
def test_views_of_captured_outputs_see_replayed_values(device):
    x = tensor(device, 4, 4)
    graph, out = capture(device, lambda: x * 2)
    row = out[1]
    x.copy_(tensor(device, 4, 4, seed=3))
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(row, x[1] * 2)


@case(ALL)
def test_multi_output_custom_ops_replay(device):
    x, residual, weight = tensor(device, 3, 16), tensor(device, 3, 16, seed=1), tensor(device, 16, seed=2)
    ey, es = ops.add_rms_norm(x, residual, weight, 1e-6)  # also the warm-up the capture needs
    graph, (y, x_sum) = capture(device, lambda: ops.add_rms_norm(x, residual, weight, 1e-6))
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(y, ey)
    torch.testing.assert_close(x_sum, es)


@case(ALL)
def test_graphs_sharing_a_pool_both_replay_correctly(device):
    pool = device.graph_pool_handle()
    x = tensor(device, 8, 8)
    big, big_out = capture(device, lambda: (x @ x).relu(), pool=pool)
    small, small_out = capture(device, lambda: x[:2] * 4, pool=big.pool())
    big.replay()
    small.replay()
    device.synchronize()
    torch.testing.assert_close(big_out, (x @ x).relu())
    torch.testing.assert_close(small_out, x[:2] * 4)


@case(ALL)
def test_is_current_stream_capturing_only_inside_capture(device):
    graph = device.new_graph()
    seen = []
    assert not device.is_current_stream_capturing()
    with device.graph(graph):
        seen.append(device.is_current_stream_capturing())
        torch.ones(1, device=device.torch_device).add_(1)
    assert seen == [True]
    assert not device.is_current_stream_capturing()


@case(sim_only("capture outputs are uninitialised memory on hardware: arbitrary, not reliably NaN"))
def test_capture_outputs_are_garbage_until_the_first_replay(device):
    x = tensor(device, 8)
    graph, out = capture(device, lambda: x + 1)
    assert torch.isnan(out).all()
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x + 1)
