"""SoC generation from the device name torch_npu reports, and the profile built from it."""

from __future__ import annotations

import pytest

from ascendgraph.config import SOCS
from ascendgraph.errors import ConfigError
from hw.soc import SOC_CAPABILITIES, npu_profile, soc_from_device_name

NAMES = [
    ("Ascend910B1", "A2"),
    ("Ascend910B2C", "A2"),
    ("Ascend910B3", "A2"),
    ("Ascend910B4", "A2"),
    ("Ascend910B4-1", "A2"),
    ("Ascend910_9391", "A3"),
    ("Ascend910_9392", "A3"),
    ("Ascend910_9381", "A3"),
    ("Ascend910_9372", "A3"),
    ("Ascend910_9362", "A3"),
    ("Ascend310P1", "310P"),
    ("Ascend310P3", "310P"),
    ("Ascend950PR", "A5"),
    ("Ascend950DT", "A5"),
    ("  ascend910b3 ", "A2"),
]


@pytest.mark.parametrize("name, generation", NAMES)
def test_device_names_map_to_their_generation(name: str, generation: str) -> None:
    assert soc_from_device_name(name) == generation


@pytest.mark.parametrize("name", ["Ascend910A", "Ascend910ProB", "Ascend310B4", "Ascend910_9591x", "", "   "])
def test_unknown_device_names_are_refused_naming_the_known_prefixes_and_the_override(name: str) -> None:
    with pytest.raises(ConfigError) as caught:
        soc_from_device_name(name)
    message = str(caught.value)
    assert "Ascend910B" in message or "Ascend SoC name" in message
    if name.strip():
        assert "soc=" in message


def test_every_generation_ascendgraph_knows_has_capabilities() -> None:
    assert set(SOC_CAPABILITIES) == set(SOCS)


def test_310p_profile_has_no_npugraph_ex_static_or_super_kernel() -> None:
    profile = npu_profile("Ascend310P3")
    assert profile.name == "310P" and profile.soc == "Ascend310P3"
    assert not (profile.supports_npugraph_ex or profile.supports_static_kernel or profile.supports_super_kernel)


def test_a5_profile_caps_piecewise_sizes_at_four() -> None:
    assert npu_profile("Ascend950PR").max_piecewise_sizes == 4
    assert npu_profile("Ascend910B3").max_piecewise_sizes is None


def test_profile_carries_what_the_stack_reports() -> None:
    profile = npu_profile("Ascend910_9391", stream_limit=1700, cann_version="8.5.0", hdk_version="25.5.1",
                          memory_bytes=64 << 30, supports_task_update=False, supports_super_kernel_api=False)
    assert (profile.name, profile.stream_limit, profile.cann_version, profile.memory_bytes) == ("A3", 1700, "8.5.0", 64 << 30)
    assert not profile.supports_task_update and not profile.supports_super_kernel and not profile.old_hdk


@pytest.mark.parametrize("hdk, old", [("24.1.0", True), ("24.1.rc3", True), ("25.5.1", False), ("25.5.2", False),
                                      ("26.0.0", False), ("unknown", False), ("", False), ("24.²", True),
                                      ("²", False), ("٢٤.1", False)])
def test_old_hdk_is_only_a_parseable_version_below_25_5_1(hdk: str, old: bool) -> None:
    assert npu_profile("Ascend910B3", hdk_version=hdk).old_hdk is old


def test_an_explicit_soc_overrides_the_name_and_is_validated() -> None:
    assert npu_profile("Ascend910ProB", soc="a2").name == "A2"
    with pytest.raises(ConfigError, match="soc must be one of"):
        npu_profile("Ascend910B3", soc="A9")
