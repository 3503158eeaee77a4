"""Declared capabilities: a device's ``capabilities`` name exactly the optional capability
protocols of `ascendgraph.device` it provides (docs/ARCHITECTURE.md "What a backend provides")."""

from __future__ import annotations

from ascendgraph.device import CAPABILITIES, Device, capability_mismatches
from ascendgraph.testing.conformance.registry import ALL, case


@case(ALL)
def test_the_device_declares_exactly_the_optional_capabilities_it_provides(device: Device) -> None:
    assert set(device.capabilities) <= set(CAPABILITIES)
    assert capability_mismatches(device) == {}
