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


# Expressions the scan below reads as a device that are not one, each with what it is.
_NOT_A_DEVICE = {
    ("ascendgraph/caller_state.py", "device"): "torch's default device, a torch.device",
    ("ascendgraph/runtime/stages/build.py", "device"): "EngineOptions.device given as a backend name",
    ("ascendgraph/tools/scenario/loading.py", "device"): "a scenario file's device: mapping",
    ("ascendgraph/tools/scenario/actions.py", "scenario.device"): "a scenario's DeviceSpec",
}
_TORCH_DEVICE_ATTRIBUTES = {"type", "index"}  # tensor.device is a torch.device


def _protocol_members(protocol: type) -> set[str]:
    names = {n for n in dir(protocol) if not n.startswith("_")}
    return names | set(getattr(protocol, "__annotations__", {}))


def _sim_only_case(function: "ast.AST") -> bool:
    """A conformance case marked @case(sim_only(...)): it may reach into the simulator."""
    import ast

    return any(isinstance(d, ast.Call) and any(isinstance(a, ast.Call) and getattr(a.func, "id", "") == "sim_only"
                                                 for a in d.args)
               for d in getattr(function, "decorator_list", ()))


def undeclared_device_members(core: "Path") -> list[str]:
    """``path:line expression.member`` for every member the core reads off a device (a name
    ``device`` / ``created`` / ``dev``, or any ``<x>.device``) that neither `Device` nor a
    capability of `CAPABILITIES` declares."""
    import ast

    from ascendgraph.device import Device

    declared = set().union(*(_protocol_members(p) for p in (Device, *CAPABILITIES)))
    found = []
    for path in sorted(core.rglob("*.py")):
        relative = str(path.relative_to(core.parent))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        exempt = {id(n) for f in ast.walk(tree) if _sim_only_case(f) for n in ast.walk(f)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or id(node) in exempt or node.attr in declared:
                continue
            owner = node.value
            is_device = (isinstance(owner, ast.Name) and owner.id in ("device", "created", "dev")) or (
                isinstance(owner, ast.Attribute) and owner.attr == "device"
                and node.attr not in _TORCH_DEVICE_ATTRIBUTES)
            if is_device and (relative, ast.unparse(owner)) not in _NOT_A_DEVICE:
                found.append(f"{relative}:{node.lineno} {ast.unparse(node)}")
    return sorted(found)


def test_the_core_reads_off_a_device_only_what_a_protocol_declares():
    from pathlib import Path

    core = Path(__file__).resolve().parents[2] / "ascendgraph"
    assert undeclared_device_members(core) == [], (
        "declare the member on ascendgraph.device.Device or as a capability protocol (docs/ARCHITECTURE.md "
        "'What a backend provides'), and ask for it with isinstance")


def test_the_scan_finds_undeclared_members_and_passes_declared_ones(tmp_path):
    package = tmp_path / "ascendgraph"
    (package / "testing").mkdir(parents=True)
    (package / "ranks.py").write_text(
        "def f(rank, ranks, device, x):\n"
        "    rank.device.synchronize(); x.device.type; device.clock()\n"
        "    return rank.device.host_clock_us, ranks[0].device.fabric, device.queues\n")
    (package / "testing" / "cases.py").write_text(
        "@case(sim_only('the simulator only'))\ndef test_x(device):\n    device.queues.run()\n\n"
        "@case(ALL)\ndef test_y(device):\n    device.require_task_updates = False\n")
    assert undeclared_device_members(package) == [
        "ascendgraph/ranks.py:3 device.queues", "ascendgraph/ranks.py:3 rank.device.host_clock_us",
        "ascendgraph/ranks.py:3 ranks[0].device.fabric", "ascendgraph/testing/cases.py:7 device.require_task_updates",
    ]
