"""Conformance section: failed captures, reset."""

from __future__ import annotations

import gc
import pytest
import torch

from ascendgraph.testing.conformance.registry import ALL, case, sim_only
from ascendgraph.testing.conformance.helpers import tensor, capture, assert_clean


@case(ALL)
def test_a_failed_capture_leaves_nothing_behind(device):
    x = tensor(device, 64, 64)
    graph = device.new_graph()
    before = device.stats()
    with pytest.raises(ValueError, match="boom"):
        with device.graph(graph):
            (x @ x).relu()
            raise ValueError("boom")
    assert_clean(device, before)
    with pytest.raises(RuntimeError):
        graph.replay()
    with device.graph(graph):  # the same object captures again
        out = x + 1
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x + 1)


@case(ALL)
def test_reset_releases_streams_and_pool_memory(device):
    before = device.stats()
    x = tensor(device, 32, 32)
    graph, _ = capture(device, lambda: (x @ x) * 2)
    during = device.stats()
    assert during.graphs_alive == before.graphs_alive + 1
    assert during.streams_in_use > before.streams_in_use
    assert during.pool_bytes > before.pool_bytes
    graph.reset()
    assert_clean(device, before)
    with pytest.raises(RuntimeError):
        graph.replay()


@case(ALL)
def test_a_reset_graph_captures_again(device):
    x = tensor(device, 8)
    graph, _ = capture(device, lambda: x + 1)
    graph.reset()
    with device.graph(graph):
        out = x * 7
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x * 7)


@case(sim_only("hardware statistics do not follow garbage-collected graph objects"))
def test_a_dropped_graph_gives_its_resources_back(device):
    before = device.stats()
    x = tensor(device, 16, 16)
    graph, out = capture(device, lambda: x @ x)
    del graph, out
    gc.collect()
    assert_clean(device, before)
