"""What the multi-rank runner asks of a rank's device: the capabilities of ascendgraph.device it
needs (VirtualClock, CollectiveFabric), asked for through the protocols."""

from __future__ import annotations

import pytest

from ascendgraph.device import CollectiveFabric, VirtualClock
from ascendgraph.errors import DeviceUnavailable
from ascendgraph.runtime.ranks import RankDevice, _rank_device
from sim.device import SimDevice


def test_a_device_without_a_fabric_or_clock_cannot_run_ranks_and_is_told_what_it_lacks():
    class NoFabric(SimDevice):
        collective_fabric = None
        capabilities = tuple(c for c in SimDevice.capabilities if c is not CollectiveFabric)

    class NoFabricNoClock(NoFabric):
        clock = None
        capabilities = tuple(c for c in NoFabric.capabilities if c is not VirtualClock)

    with pytest.raises(DeviceUnavailable, match=r"lacks CollectiveFabric \(ascendgraph.device"):
        _rank_device(NoFabric())
    with pytest.raises(DeviceUnavailable, match="lacks VirtualClock, CollectiveFabric"):
        _rank_device(NoFabricNoClock())


def test_the_simulator_is_a_rank_device_and_its_fabric_names_what_programs_yield():
    device = SimDevice(meta_tensors=True)
    assert isinstance(_rank_device(device), RankDevice)
    from ascendgraph.parallel.layout import ParallelLayout

    fabric = device.collective_fabric(ParallelLayout(dp=2), seed=0)
    call = fabric.collective_type(group="dp", op="all_reduce", shape=(1,), dtype="int32", rows=[[1]])
    assert call.group == "dp" and fabric.decision_type(group="dp", value=(1,)).value == (1,)
