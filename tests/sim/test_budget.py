"""Stream charging follows the planner's StreamPlan."""

from __future__ import annotations

import pytest

from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget
from sim.budget import StreamLedger


def plan(mode, sizes, layers=4, max_streams=1800, **kw):
    return plan_stream_budget(num_hidden_layers=layers, capture_sizes=sizes, mode=mode, max_streams=max_streams, **kw)


def test_without_a_plan_every_graph_costs_one_stream_of_the_limit():
    ledger = StreamLedger(3)
    for kind in ("full", "piecewise", "full"):
        assert ledger.fits(kind)
        ledger.charge(kind)
    assert ledger.in_use == 3 and not ledger.fits("full")


def test_reserved_streams_are_held_from_the_moment_the_plan_is_set():
    p = plan(GraphMode.FULL_AND_PIECEWISE, [1, 2, 4, 8], tensor_parallel_size=2)
    ledger = StreamLedger(1800)
    ledger.set_plan(p)
    assert ledger.in_use == p.reserved_streams + p.full_graph_reserve == 40 + 4
    assert ledger.budget == p.max_streams


@pytest.mark.parametrize("expansion", [None, "AIV"])
@pytest.mark.parametrize("tp", [1, 2])
def test_piecewise_sizes_fit_exactly_as_many_times_as_the_planner_says(expansion, tp):
    sizes = list(range(1, 300))
    p = plan(GraphMode.PIECEWISE, sizes, layers=6, max_streams=500, tensor_parallel_size=tp,
             hccl_op_expansion_mode=expansion)
    ledger = StreamLedger(9999)
    ledger.set_plan(p)
    fitted_sizes = 0
    while True:
        graphs = 0
        while graphs < p.graphs_per_size and ledger.fits("piecewise"):
            ledger.charge("piecewise")
            graphs += 1
        if graphs < p.graphs_per_size:
            break
        fitted_sizes += 1
    assert fitted_sizes == p.max_num_sizes
    assert ledger.in_use == p.streams_needed(p.max_num_sizes) + graphs * p.streams_per_piecewise_graph


def test_full_graphs_use_the_reserve_first_and_releases_return_it():
    p = plan(GraphMode.FULL_AND_PIECEWISE, [1, 2])
    ledger = StreamLedger(1800)
    ledger.set_plan(p)
    start = ledger.in_use
    charges = [ledger.charge("full") for _ in range(3)]
    assert [c.from_full_reserve for c in charges] == [True, True, False]
    assert ledger.in_use == start + 1
    ledger.release(charges[0])
    assert ledger.charge("full").from_full_reserve
    for c in charges[1:]:
        ledger.release(c)
    assert ledger.in_use == start + 0 and ledger.graphs_charged == 1


def test_bad_kinds_and_plans_are_config_errors():
    ledger = StreamLedger(10)
    with pytest.raises(ConfigError, match="full, piecewise"):
        ledger.cost("partial")
    with pytest.raises(ConfigError, match="StreamPlan"):
        ledger.set_plan(object())
