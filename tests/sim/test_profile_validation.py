"""Profile JSON values are checked at load: type, range, base cycles, non-text files.

Each bad file is a ConfigError naming the file, the key, the value and what is expected,
so `--sim-profile FILE` fails with exit 2 before anything runs.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from ascendgraph.device import DeviceProfile
from ascendgraph.errors import ConfigError
from hw.calibrate import CostMeasurement, StreamMeasurement, profile_document, write_profile
from sim.cost import CostParams
from sim.profiles import PROFILES, load_profile, profile_from_dict


def _write(tmp_path: Path, document: object, name: str = "profile.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(document), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "document, fragments",
    [
        ({"base": "A2", "memory_bytes": None}, ["memory_bytes", "null", "integer from 1 to"]),
        ({"base": "A2", "memory_bytes": 0}, ["memory_bytes", "got 0"]),
        ({"base": "A2", "cost": {"host_launch_us": "fast"}}, ["cost.host_launch_us", '"fast"', "number from 0 to"]),
        ({"base": "A2", "cost": {"host_launch_us": -1}}, ["cost.host_launch_us", "got -1"]),
        ({"base": "A2", "cost": {"peak_tflops": 0}}, ["cost.peak_tflops", "number from 0.001 to"]),
        ({"base": "A2", "cost": {"ai_cores": 2.5}}, ["cost.ai_cores", "integer from 1 to"]),
        ({"base": "A2", "cost": {"ai_cores": True}}, ["cost.ai_cores", "got true"]),
        ({"base": "A2", "stream_limit": "x"}, ["stream_limit", '"x"', "integer from 1 to"]),
        ({"base": "A2", "stream_limit": -5}, ["stream_limit", "got -5"]),
        ({"base": "A2", "stream_limit": 0}, ["stream_limit", "got 0"]),
        ({"base": "A2", "stream_limit": True}, ["stream_limit", "got true"]),
        ({"base": "A2", "stream_limit": 1.5}, ["stream_limit", "got 1.5"]),
        ({"base": "A2", "old_hdk": 1}, ["old_hdk", "true or false"]),
        ({"base": "A2", "max_piecewise_sizes": 0}, ["max_piecewise_sizes", "or null"]),
        ({"base": "A2", "name": ""}, ["name", "non-empty string"]),
        ({"base": "A2", "description": 3}, ["description", "a string"]),
        ({"base": "A2", "cost": [1]}, ["cost must be an object", "[1]"]),
        ({"base": "A2", "cost": None}, ["cost must be an object", "null"]),
        ({"base": 5}, ["base must be a profile name", "got 5"]),
        ({"name": "X", "soc": 7}, ["soc", "non-empty string", "got 7"]),
    ],
)
def test_bad_values_name_the_file_the_key_the_value_and_the_expectation(tmp_path, document, fragments):
    path = _write(tmp_path, document)
    with pytest.raises(ConfigError) as info:
        load_profile(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_non_finite_numbers_are_refused(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text('{"base": "A2", "cost": {"bandwidth_gbps": NaN}}', encoding="utf-8")
    # The bounded reader refuses a non-finite number before any field is looked at, naming the file.
    with pytest.raises(ConfigError, match=r"nan\.json: numbers must be finite, got NaN"):
        load_profile(path)


def test_null_max_piecewise_sizes_means_no_limit(tmp_path):
    path = _write(tmp_path, {"base": "A5", "max_piecewise_sizes": None})
    assert load_profile(path).device.max_piecewise_sizes is None


def test_a_profile_naming_itself_as_base_is_a_cycle_not_a_recursion_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {"base": "self.json"}, "self.json")
    with pytest.raises(ConfigError, match=r"self\.json: its base chain loops"):
        load_profile("self.json")


def test_a_two_file_base_cycle_is_reported(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {"base": "b.json"}, "a.json")
    _write(tmp_path, {"base": "a.json"}, "b.json")
    with pytest.raises(ConfigError, match=r"loops .*a\.json -> .*b\.json -> .*a\.json"):
        load_profile("a.json")


def test_a_chain_of_profile_files_still_loads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, {"base": "A3", "stream_limit": 900}, "lab.json")
    _write(tmp_path, {"base": "lab.json", "name": "A3-lab-2", "cost": {"host_launch_us": 3}}, "top.json")
    loaded = load_profile("top.json")
    assert (loaded.name, loaded.device.soc, loaded.device.stream_limit) == ("A3-lab-2", "Ascend910_93", 900)
    assert loaded.cost.host_launch_us == 3


def test_a_binary_profile_file_is_not_a_text_file(tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(ConfigError, match=r"bin\.json: not a text file"):
        load_profile(path)


def test_a_profile_table_is_checked_the_same_way():
    with pytest.raises(ConfigError, match=r"profile table: stream_limit must be an integer from 1 to 1000000, got 0"):
        profile_from_dict({"base": "A2", "stream_limit": 0}, origin="profile table")


def test_every_table_profile_passes_its_own_rules():
    for profile in PROFILES.values():
        device = {f.name: getattr(profile.device, f.name) for f in dataclasses.fields(DeviceProfile)}
        assert profile_from_dict({**device, "cost": profile.cost.as_dict()}) == profile


def test_every_field_default_passes_the_rules():
    assert profile_from_dict({"name": "X", "soc": "Y", "cost": CostParams().as_dict()}).cost == CostParams()


@pytest.mark.parametrize("zero_costs", [False, True])
def test_a_calibration_document_still_loads(tmp_path, zero_costs):
    streams = StreamMeasurement(graphs_captured=7, refused=True, signature="stream_exhaustion", error="207008")
    value = 0.0 if zero_costs else 12.3456
    costs = CostMeasurement(capture_base_us=value, capture_per_task_us=value, graph_launch_us=value, host_launch_us=value)
    document = profile_document(PROFILES["A2"].device, streams, costs, name="A2-lab")
    loaded = load_profile(write_profile(tmp_path / "lab.json", document))
    assert loaded.device.stream_limit == 7 and loaded.cost.capture_per_task_us == round(value, 3)
