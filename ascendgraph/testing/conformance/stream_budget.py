"""Conformance section: stream budget."""

from __future__ import annotations

import pytest
import torch
from typing import Any
from ascendgraph import errors
from ascendgraph.device import HcclExpansionMode
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


@case(sim_only("real stacks run out of streams at a stack-dependent count (the calibration test measures it)"))
def test_streams_run_out_at_the_size_the_planner_predicts(device):
    # each graph holds the tensor-parallel all-reduce, as a tp=2 model's pieces do; the device
    # charges what the graphs hold (docs/semantics.md "Streams"), the planner predicts it
    sizes = list(range(8, 160, 8))
    plan = _plan(device, layers=3, sizes=sizes, mode=GraphMode.PIECEWISE, max_streams=200)
    assert not plan.fits
    device.set_stream_plan(plan)  # the stack's limit (200), nothing else
    if isinstance(device, HcclExpansionMode):
        device.set_hccl_op_expansion_mode("FFTS+")
    x = torch.ones(1, device=device.torch_device)
    alive = []
    failing, exc = None, None
    for index, _size in enumerate(sorted(sizes, reverse=True)):
        try:
            for _ in range(3 + 1):  # layers + 1 pieces
                alive.append(capture(device, lambda: torch.ops.ascendgraph.all_reduce(x + 1, "tp", 2),
                                      graph_kind="piecewise"))
        except RuntimeError as error:
            failing, exc = index, error
            break
    assert failing == plan.first_failing_index() == plan.max_num_sizes
    assert exc is not None and errors.TEXT_STREAMS_INSUFFICIENT in str(exc)
    typed = rewrite_capture_error(exc)
    assert isinstance(typed, StreamResourceExhausted) and typed.__cause__ is exc


@case(sim_only("the stream charges are the simulator's physical model"))
def test_a_graph_holding_collectives_holds_their_streams(device):
    if isinstance(device, HcclExpansionMode):
        device.set_hccl_op_expansion_mode("FFTS+")
    start = device.stats().streams_in_use
    x = torch.ones(1, device=device.torch_device)
    alive = [capture(device, lambda: torch.ops.ascendgraph.all_reduce(x + 1, "tp", 2), graph_kind="full")]
    assert device.stats().streams_in_use == start + 40 + 1 + 2  # group reserve, the graph, its FFTS+ streams
    alive.append(capture(device, lambda: x + 1, graph_kind="full"))
    assert device.stats().streams_in_use == start + 40 + 1 + 2 + 1
    for graph, _ in alive:
        graph.reset()
    assert device.stats().streams_in_use == start + 40  # the communicator's reserve stays


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
