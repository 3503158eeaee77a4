"""The pytest fixtures of ascendgraph.testing.fixtures."""

from __future__ import annotations

import pytest
import torch

from ascendgraph.errors import StreamResourceExhausted, rewrite_capture_error
from ascendgraph.testing.conformance import ALL, CASES, SimOnly


def test_device_defaults_to_a_fresh_simulator(device, sim_device):
    assert device.name == "sim" and sim_device.name == "sim" and device is not sim_device
    assert device.stats().graphs_alive == 0


@pytest.mark.fault("capture_begin=1*off->raise(207008)")
def test_the_fault_marker_applies_its_plan_to_the_device(device, fault_plan):
    assert fault_plan is not None and "capture_begin" in fault_plan.rules
    x = torch.ones(1)
    keep = device.new_graph()
    with device.graph(keep):
        x + 1
    with pytest.raises(RuntimeError) as exc:
        with device.graph(device.new_graph()):
            x + 1
    assert isinstance(rewrite_capture_error(exc.value), StreamResourceExhausted)


def test_fault_plan_is_none_without_a_marker(fault_plan):
    assert fault_plan is None


def test_the_conformance_suite_has_at_least_thirty_tagged_cases():
    assert len(CASES) >= 30
    for case in CASES.values():
        tag = getattr(case, "conformance_tag", None)
        assert tag == ALL or isinstance(tag, SimOnly), case
