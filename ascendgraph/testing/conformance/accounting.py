"""Conformance section: accounting."""

from __future__ import annotations

import torch

from ascendgraph.testing.conformance.registry import case, sim_only
from ascendgraph.testing.conformance.helpers import tensor, capture


@case(sim_only("the virtual clock belongs to the simulator"))
def test_a_replay_costs_less_virtual_time_than_the_same_ops_eagerly(device):
    x, w = tensor(device, 1, 64), tensor(device, 64, 64, seed=1)

    def step():
        h = x
        for _ in range(8):
            h = torch.relu(h @ w) + 1
        return h

    graph, _ = capture(device, step)
    start = device.stats().virtual_time_us
    with device.track_eager():
        step()
    device.synchronize()
    eager = device.stats().virtual_time_us - start
    start = device.stats().virtual_time_us
    graph.replay()
    device.synchronize()
    replay = device.stats().virtual_time_us - start
    assert 0 < replay < eager


@case(sim_only("kernel records are the simulator's profile source"))
def test_profiling_keeps_one_kernel_record_per_replayed_task(device, tmp_path):
    x = tensor(device, 4, 4)
    graph, _ = capture(device, lambda: (x @ x).relu())
    with device.profiling(str(tmp_path)) as session:
        graph.replay()
        device.synchronize()  # the device runs behind the host: its kernels have run by here
    names = [record.name for record in session.records]
    assert names == ["aten.mm.default", "aten.relu.default"]
    assert all(record.graph == graph.name and record.duration_us > 0 for record in session.records)


@case(sim_only("two simulated devices in one process"))
def test_two_devices_are_independent(device):
    from ascendgraph.device import get_device

    other = get_device("sim")
    x = torch.ones(1)
    first, _ = capture(device, lambda: x + 1)
    assert other.stats().graphs_alive == 0 and other.stats().streams_in_use == 0
    graph = device.new_graph()
    with device.graph(graph):
        inner, inner_out = capture(other, lambda: x + 2)  # one device's capture does not block another's
        y = x + 3
    assert device.stats().graphs_alive == 2 and other.stats().graphs_alive == 1
    assert graph.recorded_ops() == ["aten.add.Tensor"] and inner.recorded_ops() == ["aten.add.Tensor"]
    inner.replay()
    graph.replay()
    other.synchronize()
    device.synchronize()
    torch.testing.assert_close(inner_out, x + 2)
    torch.testing.assert_close(y, x + 3)
    assert first.is_captured
