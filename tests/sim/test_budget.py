"""Stream charging from what a captured graph holds (sim/budget.py, docs/semantics.md "Streams").

The figures are the physical model's (docs/semantics.md §9, docs/decisions.md), written here as literals: 1 stream per graph,
+1 (AIV) or +2 (FFTS+) per communication group whose collectives the graph holds, and 40
per group reserved under FFTS+ at its first collective. No StreamPlan is involved.
"""

from __future__ import annotations

import pytest
import torch

import sim
from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget
from sim.budget import StreamLedger


def _all_reduce(x, group="tp", world=2):
    return torch.ops.ascendgraph.all_reduce(x, group, world)


def _capture(device, body, kind="piecewise"):
    graph = device.new_graph()
    with device.graph(graph, graph_kind=kind):
        body()
    return graph


def test_every_graph_costs_one_stream_of_the_limit_whatever_its_kind():
    ledger = StreamLedger(3)
    charges = [ledger.begin_graph(kind) for kind in ("full", "piecewise", "full")]
    assert all(c is not None for c in charges)
    assert ledger.in_use == 3 and ledger.begin_graph("full") is None and ledger.in_use == 3
    ledger.release(charges[0])
    assert ledger.in_use == 2 and ledger.graphs_charged == 2


@pytest.mark.parametrize("expansion, per_group, reserve", [("AIV", 1, 0), (None, 2, 40), ("AI_CPU", 2, 40),
                                                            ("FFTS+", 2, 40), ("aiv", 1, 0)])
def test_a_graph_holding_collectives_costs_one_plus_its_groups_under_the_expansion_mode(expansion, per_group, reserve):
    device = sim.SimDevice(hccl_op_expansion_mode=expansion)
    x = torch.ones(4)

    def body():
        _all_reduce(x)
        _all_reduce(x)  # the same group again: no more streams
        _all_reduce(x, group="dp")

    graph = _capture(device, body)
    assert device.stats().streams_in_use == reserve * 2 + 1 + 2 * per_group
    second = _capture(device, lambda: _all_reduce(x))  # reserves are taken once per group
    assert device.stats().streams_in_use == reserve * 2 + 1 + 2 * per_group + 1 + per_group
    graph.reset()
    assert second.device is device
    assert device.stats().streams_in_use == reserve * 2 + 1 + per_group  # the reserve stays with the device


def test_the_expansion_mode_comes_from_the_environment_unless_given():
    x = torch.ones(2)
    aiv = sim.SimDevice(env={"HCCL_OP_EXPANSION_MODE": "AIV"})
    ffts = sim.SimDevice(env={})
    alive = [_capture(device, lambda: _all_reduce(x)) for device in (aiv, ffts)]
    assert len(alive) == 2
    assert aiv.stats().streams_in_use == 2 and ffts.stats().streams_in_use == 43
    switched = sim.SimDevice(env={"HCCL_OP_EXPANSION_MODE": "AIV"})
    switched.set_hccl_op_expansion_mode("HOST")
    alive.append(_capture(switched, lambda: _all_reduce(x)))
    assert switched.stats().streams_in_use == 43


def test_a_collective_that_does_not_fit_fails_its_capture_and_returns_every_stream():
    device = sim.SimDevice(stream_limit=44)
    x = torch.ones(2)
    alive = _capture(device, lambda: _all_reduce(x))  # 40 + 1 + 2 (kept alive: a freed graph returns its streams)
    assert device.stats().streams_in_use == 43
    with pytest.raises(RuntimeError, match="Stream resources are insufficient") as info:
        _capture(device, lambda: _all_reduce(x))  # 1 fits, the collective's 2 do not
    assert "needs 2 more streams" in str(info.value)
    assert device.stats().streams_in_use == 43 and device.stats().graphs_alive == 1
    assert alive.device is device


def test_eager_collectives_cost_nothing_and_are_the_identity():
    device = sim.SimDevice(stream_limit=1)
    x = torch.arange(4.0)
    y = _all_reduce(x, world=8)
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()
    assert device.stats().streams_in_use == 0


def test_the_profiles_reserved_streams_are_held_from_the_start():
    device = sim.SimDevice(profile={"base": "A2", "stream_limit": 5, "reserved_streams": 3})
    assert device.stats().streams_in_use == 3
    alive = [_capture(device, lambda: None), _capture(device, lambda: None)]
    with pytest.raises(RuntimeError, match="207008"):
        _capture(device, lambda: None)
    assert len(alive) == 2


def test_a_plan_sets_the_limit_only_never_the_charges():
    p = plan_stream_budget(num_hidden_layers=4, capture_sizes=[1, 2, 4, 8], mode=GraphMode.FULL_AND_PIECEWISE,
                           tensor_parallel_size=2, max_streams=7)
    device = sim.SimDevice()
    device.set_stream_plan(p)
    assert device.stats().streams_in_use == 0 and device.stats().stream_limit == 7
    alive = [_capture(device, lambda: None, kind="full") for _ in range(7)]  # kept: freed graphs return streams
    with pytest.raises(RuntimeError, match="207008"):
        _capture(device, lambda: None)
    assert len(alive) == 7


def test_bad_kinds_and_plans_are_config_errors():
    ledger = StreamLedger(10)
    with pytest.raises(ConfigError, match="full, piecewise"):
        ledger.begin_graph("partial")
    with pytest.raises(ConfigError, match="StreamPlan"):
        ledger.set_plan(object())
