"""SoC profiles: the table, and loading calibrated profiles from JSON."""

from __future__ import annotations

import json

import pytest

from ascendgraph.device import DeviceProfile
from ascendgraph.errors import ConfigError
from sim import SimDevice
from sim.profiles import PROFILES, get_profile, load_profile


def test_the_table_holds_the_five_socs():
    assert set(PROFILES) == {"A2", "A3", "310P", "A5", "A2-old-hdk"}


@pytest.mark.parametrize(
    "name, field, value",
    [
        ("310P", "supports_npugraph_ex", False),
        ("310P", "supports_static_kernel", False),
        ("A5", "max_piecewise_sizes", 4),
        ("A2-old-hdk", "old_hdk", True),
        ("A2", "old_hdk", False),
        ("A2", "stream_limit", 1800),
    ],
)
def test_profiles_carry_their_capabilities(name, field, value):
    assert getattr(get_profile(name).device, field) == value


def test_lookup_is_case_insensitive_and_unknown_names_list_the_valid_ones():
    assert get_profile("a3").name == "A3"
    with pytest.raises(ConfigError, match="A2, A3, 310P, A5, A2-old-hdk"):
        get_profile("A9")


def test_a_device_profile_gets_the_cost_of_its_table_entry():
    custom = DeviceProfile(name="A2", soc="Ascend910B", stream_limit=99)
    profile = get_profile(custom)
    assert profile.device.stream_limit == 99 and profile.cost == PROFILES["A2"].cost


def test_a_json_profile_overrides_its_base(tmp_path):
    path = tmp_path / "lab.json"
    path.write_text(json.dumps({"base": "A3", "name": "A3-lab", "stream_limit": 1500, "cost": {"host_launch_us": 7.5}}))
    profile = load_profile(path)
    assert profile.name == "A3-lab" and profile.device.soc == "Ascend910_93"
    assert profile.device.stream_limit == 1500 and profile.cost.host_launch_us == 7.5
    assert profile.cost.bandwidth_gbps == PROFILES["A3"].cost.bandwidth_gbps
    device = SimDevice(profile=profile)
    assert device.stats().stream_limit == 1500


def test_a_json_profile_without_base_needs_name_and_soc(tmp_path):
    path = tmp_path / "bare.json"
    path.write_text(json.dumps({"name": "X"}))
    with pytest.raises(ConfigError, match="needs 'name' and 'soc'"):
        load_profile(path)
    path.write_text(json.dumps({"name": "X", "soc": "Ascend910B"}))
    assert load_profile(path).device.stream_limit == 1800


@pytest.mark.parametrize(
    "content, fragment",
    [
        ('{"base": "A2", "streams": 3}', "unknown keys streams"),
        ('{"base": "A2", "cost": {"speed": 1}}', "cost.speed"),
        ("[1, 2]", "expected a JSON object"),
        ("{not json", "invalid JSON"),
    ],
)
def test_bad_profile_files_are_config_errors(tmp_path, content, fragment):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=fragment):
        load_profile(path)


def test_a_missing_profile_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read profile file"):
        load_profile(tmp_path / "absent.json")


def test_get_profile_accepts_a_json_file_path(tmp_path):
    import json

    from sim.profiles import get_profile

    source = tmp_path / "calibrated.json"
    source.write_text(json.dumps({"name": "A3-calibrated", "soc": "A3", "stream_limit": 1234}))
    for spelling in (str(source), source):
        loaded = get_profile(spelling)
        assert (loaded.name, loaded.device.soc, loaded.device.stream_limit) == ("A3-calibrated", "A3", 1234)


def test_get_profile_with_a_missing_json_file_names_the_file(tmp_path):
    import pytest

    from ascendgraph.errors import ConfigError
    from sim.profiles import get_profile

    with pytest.raises(ConfigError, match="cannot read profile file"):
        get_profile(str(tmp_path / "missing.json"))
