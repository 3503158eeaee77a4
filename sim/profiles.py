"""SoC profiles the simulator can play: a data table, plus loading one from JSON.

Each entry pairs an `ascendgraph.device.DeviceProfile` (what the stack is and can do:
stream limit, HDK/CANN versions, capabilities) with the `CostParams` of the virtual clock.
The cost figures are rough public numbers, not measurements; ``load_profile`` reads a
calibrated profile from a JSON file:

    {"name": "A2-lab", "base": "A2", "stream_limit": 1700, "hdk_version": "25.5.1",
     "cost": {"host_launch_us": 9.5, "bandwidth_gbps": 1500}}

``base`` (optional) names a table entry whose values the file overrides.
"""

from __future__ import annotations

import os

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Union

from ascendgraph.device import DeviceProfile
from ascendgraph.errors import ConfigError
from sim.cost import CostParams

__all__ = ["SimProfile", "PROFILES", "DEFAULT_PROFILE", "get_profile", "load_profile", "profile_from_dict"]


@dataclass(frozen=True)
class SimProfile:
    device: DeviceProfile
    cost: CostParams

    @property
    def name(self) -> str:
        return self.device.name


def _entry(device: DeviceProfile, **cost: float) -> tuple[str, SimProfile]:
    return device.name, SimProfile(device, CostParams(**cost))


PROFILES: Mapping[str, SimProfile] = MappingProxyType(
    dict(
        [
            _entry(
                DeviceProfile(
                    name="A2", soc="Ascend910B", stream_limit=1800, hdk_version="25.5.1",
                    cann_version="8.5.0", memory_bytes=64 * 1024**3,
                    description="Atlas A2 training/inference series (910B), current HDK",
                ),
                peak_tflops=280.0, bandwidth_gbps=1600.0, host_launch_us=12.0,
            ),
            _entry(
                DeviceProfile(
                    name="A3", soc="Ascend910_93", stream_limit=1800, hdk_version="25.5.1",
                    cann_version="8.5.0", memory_bytes=64 * 1024**3,
                    description="Atlas A3 series (910_93), current HDK",
                ),
                peak_tflops=350.0, bandwidth_gbps=1800.0, host_launch_us=11.0,
            ),
            _entry(
                DeviceProfile(
                    name="310P", soc="Ascend310P3", stream_limit=1800, hdk_version="25.5.1",
                    cann_version="8.5.0", supports_npugraph_ex=False, supports_static_kernel=False,
                    supports_super_kernel=False, memory_bytes=24 * 1024**3,
                    description="Atlas 300I inference card (310P): no npugraph_ex, no static kernel",
                ),
                peak_tflops=70.0, bandwidth_gbps=200.0, host_launch_us=15.0,
            ),
            _entry(
                DeviceProfile(
                    name="A5", soc="Ascend950", stream_limit=1800, hdk_version="26.0.0",
                    cann_version="9.0.0", max_piecewise_sizes=4, memory_bytes=128 * 1024**3,
                    description="Ascend 950 (A5): at most 4 piecewise capture sizes",
                ),
                peak_tflops=900.0, bandwidth_gbps=4000.0, host_launch_us=10.0,
            ),
            _entry(
                DeviceProfile(
                    name="A2-old-hdk", soc="Ascend910B", stream_limit=1800, hdk_version="24.1.0",
                    cann_version="8.0.0", old_hdk=True, memory_bytes=64 * 1024**3,
                    description="A2 on an HDK older than 25.5.1: stream exhaustion reads "
                    "`Alloc sq cq fail`",
                ),
                peak_tflops=280.0, bandwidth_gbps=1600.0, host_launch_us=12.0,
            ),
        ]
    )
)
DEFAULT_PROFILE = "A2"

_DEVICE_FIELDS = {f.name for f in dataclasses.fields(DeviceProfile)}
_COST_FIELDS = {f.name for f in dataclasses.fields(CostParams)}


def get_profile(name: Union[str, SimProfile, DeviceProfile] = DEFAULT_PROFILE) -> SimProfile:
    """A profile by table name (case-insensitive), or wrap a DeviceProfile with default costs."""
    if isinstance(name, SimProfile):
        return name
    if isinstance(name, DeviceProfile):
        base = PROFILES.get(name.name)
        return SimProfile(name, base.cost if base else CostParams())
    if isinstance(name, os.PathLike) or (isinstance(name, str) and name.strip().lower().endswith(".json")):
        return load_profile(name)
    if not isinstance(name, str):
        raise ConfigError(f"profile must be a name or a DeviceProfile, got {name!r}", key="profile")
    for key, profile in PROFILES.items():
        if key.lower() == name.strip().lower():
            return profile
    raise ConfigError(
        f"unknown SoC profile {name!r}: expected one of {', '.join(PROFILES)} (or a JSON file via load_profile)",
        key="profile",
    )


def profile_from_dict(data: Mapping[str, Any], *, origin: str = "profile") -> SimProfile:
    """Build a profile from a mapping (the JSON form described in the module docstring)."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: expected a JSON object, got {type(data).__name__}", key="profile")
    values = dict(data)
    base_name = values.pop("base", None)
    base = get_profile(base_name) if base_name is not None else None
    cost_values = values.pop("cost", {}) or {}
    unknown = sorted(set(values) - _DEVICE_FIELDS) + [f"cost.{k}" for k in sorted(set(cost_values) - _COST_FIELDS)]
    if unknown:
        raise ConfigError(
            f"{origin}: unknown keys {', '.join(unknown)}; device keys: {', '.join(sorted(_DEVICE_FIELDS))}; "
            f"cost keys: {', '.join(sorted(_COST_FIELDS))}",
            key="profile",
        )
    if base is None and ("name" not in values or "soc" not in values):
        raise ConfigError(f"{origin}: a profile without 'base' needs 'name' and 'soc'", key="profile")
    try:
        device = dataclasses.replace(base.device, **values) if base else DeviceProfile(**values)
        cost = dataclasses.replace(base.cost if base else CostParams(), **cost_values)
    except TypeError as exc:
        raise ConfigError(f"{origin}: {exc}", key="profile") from None
    return SimProfile(device, cost)


def load_profile(path: Union[str, Path]) -> SimProfile:
    """Read a profile (e.g. a calibration result) from a JSON file."""
    source = Path(path)
    try:
        data = json.loads(source.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read profile file {source}: {exc.strerror or exc}", key="profile") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"profile file {source} is not valid JSON: {exc}", key="profile") from None
    return profile_from_dict(data, origin=str(source))
