"""Optional device capabilities (ascendgraph.device): declared by each backend, checked against
what the device has, and asked for by the core through the protocols only."""

from __future__ import annotations

from ascendgraph.device import (
    CAPABILITIES,
    FaultInjection,
    KernelFallbacks,
    VirtualClock,
    WarmupScope,
    capability_mismatches,
)
from sim.device import SimDevice


def test_the_simulator_declares_exactly_what_it_provides():
    device = SimDevice()
    assert capability_mismatches(device) == {}
    assert isinstance(device, FaultInjection) and isinstance(device, VirtualClock)
    assert not isinstance(device, KernelFallbacks)  # the simulator has no missing kernels to fall back from


def test_a_declaration_that_claims_too_much_or_too_little_is_named():
    class Overclaiming(SimDevice):
        capabilities = (*SimDevice.capabilities, KernelFallbacks)

    class Underclaiming(SimDevice):
        capabilities = tuple(c for c in SimDevice.capabilities if c is not WarmupScope)

    assert capability_mismatches(Overclaiming()) == {"KernelFallbacks": "declared, not provided"}
    assert capability_mismatches(Underclaiming()) == {"WarmupScope": "provided, not declared"}


def test_every_capability_is_a_runtime_checkable_protocol_with_a_docstring():
    for protocol in CAPABILITIES:
        assert getattr(protocol, "_is_runtime_protocol", False), protocol
        assert protocol.__doc__ and "[" in protocol.__doc__, f"{protocol.__name__} says what happens without it"


def test_the_core_never_probes_a_device_with_getattr():
    import re
    from pathlib import Path

    core = Path(__file__).resolve().parents[2] / "ascendgraph"
    probes = {
        str(path.relative_to(core.parent)): line.strip()
        for path in core.rglob("*.py")
        for line in path.read_text(encoding="utf-8").splitlines()
        if re.search(r"\b(getattr|hasattr)\((self\.|engine\.)?(device|created)\b", line)
    }
    assert probes == {}, "ask through the capability protocols of ascendgraph.device instead"
