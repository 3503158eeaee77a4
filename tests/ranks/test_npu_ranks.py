"""Fabric ranks each on its own simulated NPU (`sim.facade.configure_devices`), one rank thread
at a time with its own copy of per-process globals (`sim.vllm_ranks.PerRankGlobals`): what the
whole model runners of tests/vllm_ascend/test_ranks_runners.py stand on."""

from __future__ import annotations

import sys
import types
from typing import Any, Iterator

import pytest
import torch
import torch.distributed as dist

from ascendgraph.errors import CollectiveDeadlock
from sim.process_group import FabricWorld
from sim.vllm_ranks import PerRankGlobals, module_slot

# vLLM calls all_gather_into_tensor, which torch 2.13 marks deprecated: these tests call it as vLLM does.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.distributed.all_gather_into_tensor` is deprecated:FutureWarning")


@pytest.fixture
def process_global() -> Iterator[types.ModuleType]:
    module = types.ModuleType("ascendgraph_test_process_global")
    module.value = "process"  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    try:
        yield module
    finally:
        del sys.modules[module.__name__]


def test_each_rank_keeps_its_own_copy_of_a_process_global_across_collectives(process_global):
    """Two ranks write a module global, meet, and read it back: each sees its own value (its
    copy is put back as it takes the baton), starts from the fresh value, and the process's own
    value is back after the run. Without the switch the second writer's value is what both read."""
    seen = {}

    def body(rank):
        seen[rank, "fresh"] = process_global.value
        process_global.value = f"rank {rank}"
        dist.all_reduce(torch.zeros(1))
        seen[rank] = process_global.value

    slots = PerRankGlobals([module_slot(process_global.__name__, "value", lambda: "fresh")])
    with slots.installed():
        FabricWorld(2, switch=slots).run(body)
    assert seen == {(0, "fresh"): "fresh", (1, "fresh"): "fresh", 0: "rank 0", 1: "rank 1"}
    assert process_global.value == "process"
    seen.clear()
    FabricWorld(2).run(body)  # no switch: one process global for both threads
    assert seen[0] == seen[1]


def _capture_all_gather(rank: int, group: Any = None) -> tuple[Any, Any, Any]:
    torch.npu.set_device(rank)
    x = torch.full((2,), float(rank + 1), device="npu")
    out = torch.empty(4, device="npu")
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        dist.all_gather_into_tensor(out, x, group=group)
    return graph, x, out


def test_ranks_on_two_simulated_npus_exchange_their_data_eagerly_and_in_replays(two_simulated_npus):
    """Eager collectives and captured ones (met when each NPU runs its replay) move the bytes
    between the two simulated NPUs, each rank's result on its own NPU."""
    got = {}

    def body(rank):
        torch.npu.set_device(rank)
        x = torch.full((2,), float(rank + 1), device="npu")
        out = torch.empty(4, device="npu")
        dist.all_gather_into_tensor(out, x)
        got[rank, "eager"] = (out.device, out.cpu().tolist())
        graph, x, out = _capture_all_gather(rank)
        x.fill_(10.0 * (rank + 1))
        graph.replay()
        got[rank, "replay"] = out.cpu().tolist()

    FabricWorld(2).run(body)
    assert got[0, "eager"] == (torch.device("npu", 0), [1.0, 1.0, 2.0, 2.0])
    assert got[1, "eager"] == (torch.device("npu", 1), [1.0, 1.0, 2.0, 2.0])
    assert got[0, "replay"] == got[1, "replay"] == [10.0, 10.0, 20.0, 20.0]


def test_a_rank_blocked_in_a_host_collective_lets_its_npu_run_a_queued_replay(two_simulated_npus):
    """Rank 0 queues a replay (its captured all-gather still to run on its lagging NPU) and
    enters a host all-reduce; rank 1 replays and waits for its result, then joins the host
    all-reduce. On cards rank 0's NPU runs the replay while its host waits, so both pass; the
    simulator runs the rank's queued work as its host blocks (otherwise: a deadlock no card has)."""
    got = {}

    def body(rank):
        graph, _, out = _capture_all_gather(rank)
        graph.replay()
        if rank == 0:
            dist.all_reduce(torch.ones(1))
            got[rank] = out.cpu().tolist()
        else:
            got[rank] = out.cpu().tolist()
            dist.all_reduce(torch.ones(1))

    FabricWorld(2).run(body)
    assert got[0] == got[1] == [1.0, 1.0, 2.0, 2.0]


def test_ranks_that_order_a_replay_and_a_host_collective_differently_are_reported_as_a_deadlock(two_simulated_npus):
    """The limit of that model (docs/ranks.md): rank 1 enters the host all-reduce before it
    issues its replay, rank 0 after queueing its own; rank 0's NPU runs its replay as its host
    blocks and waits for rank 1's, whose host waits for rank 0's: reported as a deadlock."""
    def body(rank):
        device_group = dist.new_group([0, 1], group_desc="device")
        graph, _, _ = _capture_all_gather(rank, device_group)
        if rank == 0:
            graph.replay()
            dist.all_reduce(torch.ones(1))
        else:
            dist.all_reduce(torch.ones(1))
            graph.replay()
            torch.npu.synchronize()

    with pytest.raises(CollectiveDeadlock) as info:
        FabricWorld(2).run(body)
    assert "rank 0 waits in device#0" in str(info.value) and "rank 1 waits in default_pg#0" in str(info.value)
