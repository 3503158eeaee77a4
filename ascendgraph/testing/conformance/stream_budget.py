"""Conformance section: stream budget."""

from __future__ import annotations

import pytest
import torch
from typing import Any
from ascendgraph import errors
from ascendgraph.errors import OldHdkStack, StreamResourceExhausted, rewrite_capture_error
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget
from ascendgraph.testing.conformance.registry import case, sim_only
from ascendgraph.testing.conformance.helpers import capture


def _plan(device: Any, *, layers: int, sizes: list[int], mode: GraphMode, max_streams: int) -> Any:
    return plan_stream_budget(
        num_hidden_layers=layers, capture_sizes=sizes, mode=mode, tensor_parallel_size=2,
        max_streams=max_streams,
    )


def _capture_sizes_until_failure(device: Any, plan: Any, sizes: list[int], graphs_per_size: int, kind: str) -> tuple[int, BaseException]:
    x = torch.ones(1, device=device.torch_device)
    alive = []  # captured graphs hold their streams while they live
    for index, _size in enumerate(sorted(sizes, reverse=True)):
        for _ in range(graphs_per_size):
            try:
                alive.append(capture(device, lambda: x + 1, graph_kind=kind))
            except RuntimeError as exc:
                return index, exc
    raise AssertionError("every size fitted")


@case(sim_only("real stacks run out of streams at a stack-dependent count (the calibration test measures it)"))
def test_streams_run_out_at_the_size_the_planner_predicts(device):
    sizes = list(range(8, 160, 8))
    plan = _plan(device, layers=3, sizes=sizes, mode=GraphMode.PIECEWISE, max_streams=200)
    assert not plan.fits
    device.set_stream_plan(plan)
    failing, exc = _capture_sizes_until_failure(device, plan, sizes, plan.graphs_per_size, "piecewise")
    assert failing == plan.first_failing_index() == plan.max_num_sizes
    assert errors.TEXT_207008_CAPTURE_BEGIN in str(exc)
    typed = rewrite_capture_error(exc)
    assert isinstance(typed, StreamResourceExhausted) and typed.__cause__ is exc


@case(sim_only("the FULL-graph reserve is the planner's model of the stack"))
def test_full_graphs_draw_from_the_full_reserve_first(device):
    plan = _plan(device, layers=2, sizes=[1, 2, 4], mode=GraphMode.FULL_AND_PIECEWISE, max_streams=1800)
    device.set_stream_plan(plan)
    start = device.stats().streams_in_use
    assert start == plan.reserved_streams + plan.full_graph_reserve
    x = torch.ones(1, device=device.torch_device)
    alive = [capture(device, lambda: x + 1, graph_kind="full") for _ in range(3)]
    assert device.stats().streams_in_use == start
    alive.append(capture(device, lambda: x + 1, graph_kind="full"))
    assert device.stats().streams_in_use == start + 1
    alive.append(capture(device, lambda: x + 1, graph_kind="piecewise"))
    assert device.stats().streams_in_use == start + 1 + plan.streams_per_piecewise_graph


@case(sim_only("the HDK version is a simulator profile"))
def test_an_old_hdk_runs_out_of_streams_with_alloc_sq_cq_fail(device):
    from ascendgraph.device import get_device

    old = get_device("sim", profile="A2-old-hdk", stream_limit=2)
    x = torch.ones(1)
    alive = [capture(old, lambda: x + 1) for _ in range(2)]
    with pytest.raises(RuntimeError, match="Alloc sq cq fail") as exc:
        capture(old, lambda: x + 1)
    assert "retCode=0x7020023" in str(exc.value)
    assert isinstance(rewrite_capture_error(exc.value), OldHdkStack)
    assert len(alive) == 2
