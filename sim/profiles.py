"""SoC profiles the simulator can play: a data table, plus loading one from JSON.

Each entry pairs an `ascendgraph.device.DeviceProfile` (what the stack is and can do:
stream limit, HDK/CANN versions, capabilities) with the `CostParams` of the virtual clock.
The cost figures are rough public numbers, not measurements; ``load_profile`` reads a
calibrated profile from a JSON file:

    {"name": "A2-lab", "base": "A2", "stream_limit": 1700, "hdk_version": "25.5.1",
     "cost": {"host_launch_us": 9.5, "bandwidth_gbps": 1500}}

``base`` (optional) names a table entry, or another profile JSON file (a path as given,
relative to the working folder), whose values the file overrides; a chain of files that
loops back on itself is refused. Every value is checked at load (type and range; JSON
``true`` is not a number), and a bad one is a ConfigError naming the file, the key, the
value and what is expected.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Mapping, Union

from ascendgraph.device import DeviceProfile
from ascendgraph.errors import ConfigError
from ascendgraph.readers import check_tree, load_json, open_input, read_text_file
from sim.cost import CostParams

__all__ = ["SimProfile", "PROFILES", "DEFAULT_PROFILE", "get_profile", "load_profile", "profile_from_dict"]


@dataclass(frozen=True)
class SimProfile:
    device: DeviceProfile
    cost: CostParams

    @property
    def name(self) -> str:
        return self.device.name


def _entry(device: DeviceProfile, **cost: Any) -> tuple[str, SimProfile]:
    return device.name, SimProfile(device, CostParams(**cost))


PROFILES: Mapping[str, SimProfile] = MappingProxyType(
    dict(
        [
            _entry(
                DeviceProfile(
                    name="A2", soc="Ascend910B", stream_limit=1800, hdk_version="25.5.1",
                    cann_version="8.5.0", supports_super_kernel=False, memory_bytes=64 * 1024**3,
                    # No super kernel: CANN's aclskScopeBegin / aclskOptimize list Atlas A2 as not supported
                    # (CANN API reference, "aclskScopeBegin", product support), as hw/soc.py's SoC table says.
                    description="Atlas A2 training/inference series (910B), current HDK: no super kernel",
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


# --------------------------------------------------------------------------- field checks
# Each field's rule: (accepts, what a valid value is). A JSON (or TOML) value is checked
# before it reaches a dataclass, so a wrong type fails at load, naming the file and the key,
# not later inside the simulator's clock. Bools are not numbers here (JSON true is not 1).


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


_Rule = tuple[Callable[[Any], bool], str]

_NON_EMPTY_STR: _Rule = (lambda v: isinstance(v, str) and bool(v.strip()), "a non-empty string")
_STR: _Rule = (lambda v: isinstance(v, str), "a string")
_BOOL: _Rule = (lambda v: isinstance(v, bool), "true or false")


def _number_within(low: float, high: float, unit: str = "") -> _Rule:
    """A finite number in a physical range: a cost of 1e308 us or a bandwidth of 1e-300 GB/s is
    no device, and would overflow the simulator's clock to inf/NaN (a report must never show NaN)."""
    return (lambda v: _is_number(v) and low <= v <= high, f"a number from {low:g} to {high:g}{unit}")


def _int_within(low: int, high: int, unit: str = "") -> _Rule:
    return (lambda v: _is_int(v) and low <= v <= high, f"an integer from {low} to {high}{unit}")


# Physical ranges (generous: a thousand times beyond any Ascend part, yet far from overflow).
_MICROSECONDS = _number_within(0, 1e6, " (microseconds, at most one second)")
_TFLOPS = _number_within(1e-3, 1e5, " (TFLOPS)")
_GBPS = _number_within(1e-3, 1e6, " (GB/s)")

_DEVICE_RULES: Mapping[str, _Rule] = MappingProxyType(
    {
        "name": _NON_EMPTY_STR,
        "soc": _NON_EMPTY_STR,
        "stream_limit": _int_within(1, 10**6),
        "hdk_version": _NON_EMPTY_STR,
        "cann_version": _NON_EMPTY_STR,
        "old_hdk": _BOOL,
        "supports_npugraph_ex": _BOOL,
        "supports_static_kernel": _BOOL,
        "supports_super_kernel": _BOOL,
        "supports_task_update": _BOOL,
        "max_piecewise_sizes": (lambda v: v is None or (_is_int(v) and 1 <= v <= 10**6),
                                "an integer from 1 to 1000000, or null for no limit"),
        "memory_bytes": _int_within(1, 2**50, " (bytes, at most 1 PiB)"),
        "reserved_streams": _int_within(0, 10**6),
        "description": _STR,
    }
)
_COST_RULES: Mapping[str, _Rule] = MappingProxyType(
    {
        "host_launch_us": _MICROSECONDS,
        "graph_launch_us": _MICROSECONDS,
        "graph_launch_per_task_us": _MICROSECONDS,
        "task_overhead_us": _MICROSECONDS,
        "peak_tflops": _TFLOPS,
        "bandwidth_gbps": _GBPS,
        "capture_base_us": _MICROSECONDS,
        "capture_per_task_us": _MICROSECONDS,
        "ai_cores": _int_within(1, 65536),
        "elements_per_block": _int_within(1, 2**24),
        "static_kernel_overhead_factor": _number_within(0, 100),
        "super_kernel_sync_us": _MICROSECONDS,
    }
)
assert set(_DEVICE_RULES) == _DEVICE_FIELDS and set(_COST_RULES) == _COST_FIELDS, "a profile field has no rule"

_MAX_BASE_DEPTH = 16  # profile files naming profile files as base: deeper than this is a mistake


def _show(value: Any) -> str:
    """A value as the user wrote it (JSON spelling), shortened for a one-line message."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_fields(origin: str, values: Mapping[str, Any], rules: Mapping[str, _Rule], prefix: str = "") -> None:
    for key, value in values.items():
        accepts, expected = rules[key]
        if not accepts(value):
            raise ConfigError(f"{origin}: {prefix}{key} must be {expected}, got {_show(value)}", key=f"profile.{prefix}{key}")


def get_profile(name: Union[str, SimProfile, DeviceProfile] = DEFAULT_PROFILE) -> SimProfile:
    """A profile by table name (case-insensitive), or wrap a DeviceProfile with default costs."""
    return _get_profile(name, chain=())


def _is_json_path(name: Any) -> bool:
    return isinstance(name, os.PathLike) or (isinstance(name, str) and name.strip().lower().endswith(".json"))


def _get_profile(name: Any, *, chain: tuple[Path, ...]) -> SimProfile:
    if isinstance(name, SimProfile):
        return name
    if isinstance(name, DeviceProfile):
        base = PROFILES.get(name.name)
        return SimProfile(name, base.cost if base else CostParams())
    if _is_json_path(name):
        return _load_profile(Path(name), chain=chain)
    if isinstance(name, Mapping):  # a profile written inline (a scenario's [device] profile table)
        return profile_from_dict(check_tree(name, "profile table", key="profile"), origin="profile table")
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
    """Build a profile from a mapping (the JSON form described in the module docstring).

    Every value is checked (type and range) before use; a bad one is a ConfigError naming
    ``origin``, the key, the value and what is expected.
    """
    return _profile_from_dict(data, origin=origin, chain=())


def _base_profile(origin: str, base_name: Any, chain: tuple[Path, ...]) -> SimProfile:
    if not isinstance(base_name, str) or not base_name.strip():
        raise ConfigError(
            f"{origin}: base must be a profile name ({', '.join(PROFILES)}) or a profile JSON file, "
            f"got {_show(base_name)}",
            key="profile.base",
        )
    return _get_profile(base_name, chain=chain)


def _profile_from_dict(data: Any, *, origin: str, chain: tuple[Path, ...]) -> SimProfile:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{origin}: expected a JSON object, got {type(data).__name__}", key="profile")
    values = dict(data)
    base_name = values.pop("base", None)
    cost_values = values.pop("cost", {})
    if not isinstance(cost_values, Mapping):
        raise ConfigError(
            f"{origin}: cost must be an object of cost overrides such as {{\"host_launch_us\": 9.5}}, "
            f"got {_show(cost_values)}",
            key="profile.cost",
        )
    cost_values = dict(cost_values)
    unknown = sorted(map(str, set(values) - _DEVICE_FIELDS)) + [
        f"cost.{k}" for k in sorted(map(str, set(cost_values) - _COST_FIELDS))
    ]
    if unknown:
        raise ConfigError(
            f"{origin}: unknown keys {', '.join(unknown)}; device keys: {', '.join(sorted(_DEVICE_FIELDS))}; "
            f"cost keys: {', '.join(sorted(_COST_FIELDS))}",
            key="profile",
        )
    _check_fields(origin, values, _DEVICE_RULES)
    _check_fields(origin, cost_values, _COST_RULES, prefix="cost.")
    if base_name is None and ("name" not in values or "soc" not in values):
        raise ConfigError(f"{origin}: a profile without 'base' needs 'name' and 'soc'", key="profile")
    base = _base_profile(origin, base_name, chain) if base_name is not None else None
    device = dataclasses.replace(base.device, **values) if base else DeviceProfile(**values)
    cost = dataclasses.replace(base.cost if base else CostParams(), **cost_values)
    return SimProfile(device, cost)


def load_profile(path: Union[str, Path]) -> SimProfile:
    """Read a profile (e.g. a calibration result) from a JSON file."""
    return _load_profile(Path(path), chain=())


def _load_profile(source: Path, *, chain: tuple[Path, ...]) -> SimProfile:
    identity = _identity(source)
    if identity in chain:
        cycle = " -> ".join(str(p) for p in (*chain[chain.index(identity):], identity))
        raise ConfigError(
            f"profile file {source}: its base chain loops ({cycle}); make one of them name a table profile "
            f"({', '.join(PROFILES)}) as base",
            key="profile.base",
        )
    if len(chain) >= _MAX_BASE_DEPTH:
        raise ConfigError(
            f"profile file {source}: more than {_MAX_BASE_DEPTH} profile files chained through 'base'",
            key="profile.base",
        )
    if source.is_dir():
        raise ConfigError(f"cannot read profile file {source}: it is a folder", key="profile")
    open_input(source, f"cannot read profile file {source}", key="profile").close()  # regular files only
    where = f"profile file {source}"
    data = load_json(read_text_file(source, where, key="profile", kind="JSON object"), where, key="profile")
    return _profile_from_dict(data, origin=f"profile file {source}", chain=(*chain, identity))


def _identity(source: Path) -> Path:
    """The file a path names, for cycle detection (symlinks and ``..`` resolved when possible)."""
    try:
        return source.resolve()
    except (OSError, RuntimeError):
        return source.absolute()
