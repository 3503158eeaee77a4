"""Which Ascend SoC generation a device name belongs to, and the DeviceProfile of a real NPU.

Theory of operation. torch_npu reports CANN's SoC name (``Ascend910B3``,
``Ascend910_9391``, ``Ascend310P3``, ``Ascend950PR`` ...). ascendgraph reasons about four
generations (``ascendgraph.config.SOCS``): A2, A3, 310P, A5. `SOC_PREFIXES` maps name
prefixes to a generation — longest prefix wins, case and surrounding blanks ignored —
and `SOC_CAPABILITIES` says what each generation supports (docs/semantics.md §2, §10). A real
stack's versions and memory come from torch_npu at run time (`hw.device`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ascendgraph.config import SOCS
from ascendgraph.device import DeviceProfile
from ascendgraph.errors import ConfigError
from ascendgraph.resolve import Capabilities
from ascendgraph.sizes import DEFAULT_MAX_STREAMS

__all__ = ["SOC_PREFIXES", "SOC_CAPABILITIES", "SocCapabilities", "soc_from_device_name", "npu_profile"]

# (name prefix, generation). Prefixes are CANN's SoC names; more specific first is not
# required: the longest matching prefix wins.
SOC_PREFIXES: tuple[tuple[str, str], ...] = (
    ("Ascend910B", "A2"),  # Atlas A2: 910B1 .. 910B4, 910B4-1
    ("Ascend910_93", "A3"),  # Atlas A3: 910_9391, 910_9392, 910_9381, 910_9372, 910_9362 ...
    ("Ascend310P", "310P"),  # Atlas 300I inference: 310P1, 310P3
    ("Ascend950", "A5"),  # Ascend 950 (A5): 950PR, 950DT
)


@dataclass(frozen=True)
class SocCapabilities:
    supports_npugraph_ex: bool = True
    supports_static_kernel: bool = True
    supports_super_kernel: bool = True
    max_piecewise_sizes: Optional[int] = None


# What each generation can run is the mode resolution's SoC table (`ascendgraph.resolve.Capabilities.of`,
# with SOC_DISABLED's reasons: 310P has no npugraph_ex, static or super kernel; A2 no super kernel,
# whose torch_npu calls reach CANN's A3-only aclsk API; A5 at most 4 piecewise sizes), read here so
# the backend and the resolution cannot disagree.
def _capabilities(soc: str) -> SocCapabilities:
    caps = Capabilities.of(soc)
    return SocCapabilities(supports_npugraph_ex=caps.npugraph_ex, supports_static_kernel=caps.static_kernel,
                           supports_super_kernel=caps.super_kernel, max_piecewise_sizes=caps.max_piecewise_sizes)


SOC_CAPABILITIES: dict[str, SocCapabilities] = {soc: _capabilities(soc) for soc in SOCS}


def soc_from_device_name(device_name: str) -> str:
    """The generation (A2, A3, 310P, A5) of a CANN SoC name; ConfigError for names we do not know."""
    if not isinstance(device_name, str) or not device_name.strip():
        raise ConfigError(f"expected an Ascend SoC name such as 'Ascend910B3', got {device_name!r}", key="soc")
    name = device_name.strip().lower()
    matches = [(len(prefix), soc) for prefix, soc in SOC_PREFIXES if name.startswith(prefix.lower())]
    if not matches:
        known = ", ".join(f"{prefix}* ({soc})" for prefix, soc in SOC_PREFIXES)
        raise ConfigError(
            f"unknown Ascend SoC {device_name.strip()!r}: ascendgraph knows {known}; pass soc='A2'|'A3'|'310P'|'A5' "
            "to the npu device to say which generation it behaves like",
            key="soc",
        )
    return max(matches)[1]


def npu_profile(
    device_name: str,
    *,
    soc: Optional[str] = None,
    stream_limit: Optional[int] = None,
    cann_version: str = "unknown",
    hdk_version: str = "unknown",
    memory_bytes: int = 0,
    supports_task_update: bool = True,
    supports_super_kernel_api: bool = True,
) -> DeviceProfile:
    """The DeviceProfile of a real NPU from what torch_npu reports.

    ``soc`` overrides the generation read from the name; ``stream_limit`` is the planning
    budget (the stack enforces its own, which the calibration test measures).
    """
    if soc is None:
        generation = soc_from_device_name(device_name)
    else:
        generation = str(soc).strip().upper()
        if generation not in SOC_CAPABILITIES:
            raise ConfigError(f"soc must be one of {', '.join(SOCS)}, got {soc!r}", key="soc")
    caps = SOC_CAPABILITIES[generation]
    return DeviceProfile(
        name=generation,
        soc=device_name.strip(),
        stream_limit=int(stream_limit) if stream_limit is not None else DEFAULT_MAX_STREAMS,
        hdk_version=hdk_version,
        cann_version=cann_version,
        old_hdk=_older_than(hdk_version, (25, 5, 1)),
        supports_npugraph_ex=caps.supports_npugraph_ex,
        supports_static_kernel=caps.supports_static_kernel,
        supports_super_kernel=caps.supports_super_kernel and supports_super_kernel_api,
        supports_task_update=supports_task_update,
        max_piecewise_sizes=caps.max_piecewise_sizes,
        memory_bytes=int(memory_bytes),
        description=f"{device_name.strip()} through torch_npu",
    )


def _older_than(version: str, floor: tuple[int, ...]) -> bool:
    """True only for a parseable version below ``floor`` (HDK 25.5.1 fixes `Alloc sq cq fail`)."""
    parts = []
    for piece in version.replace("-", ".").split("."):
        digits = "".join(ch for ch in piece if "0" <= ch <= "9")  # ASCII: isdigit also takes "²"
        if not digits:
            break
        parts.append(int(digits))
    return bool(parts) and tuple(parts) < floor
