"""The calibration works through the Device protocol alone, so it is checked on the
simulator: it finds the stream limit a stack refuses at, releases what it captured, and
writes a profile ``sim.profiles.load_profile`` reads back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ascendgraph.errors import ConfigError
from hw.calibrate import measure_costs, measure_streams, profile_document, write_profile
from sim import SimDevice, load_profile


def test_capturing_until_refused_finds_the_stack_stream_limit_and_releases_everything() -> None:
    device = SimDevice(stream_limit=12)
    result = measure_streams(device, ceiling=100)
    assert (result.graphs_captured, result.refused, result.signature) == (12, True, "stream_exhaustion")
    assert "207008" in result.error
    stats = device.stats()
    assert stats.graphs_alive == 0 and stats.streams_in_use == 0


def test_an_old_hdk_refusal_is_recognised() -> None:
    result = measure_streams(SimDevice(profile="A2-old-hdk", stream_limit=5), ceiling=50)
    assert result.refused and result.old_hdk and result.graphs_captured == 5


def test_the_ceiling_stops_the_search_without_a_refusal() -> None:
    result = measure_streams(SimDevice(stream_limit=40), ceiling=7)
    assert (result.graphs_captured, result.refused, result.stream_limit) == (7, False, 7)


def test_progress_is_reported_per_captured_graph() -> None:
    seen: list[int] = []
    measure_streams(SimDevice(stream_limit=3), ceiling=10, progress=seen.append)
    assert seen == [1, 2, 3]


def test_the_written_profile_loads_in_the_simulator_with_the_measured_limit(tmp_path: Path) -> None:
    device = SimDevice(stream_limit=9)
    streams = measure_streams(device, ceiling=50)
    costs = measure_costs(device, repeats=3, long_graph_ops=4)
    path = write_profile(tmp_path / "lab" / "a2-lab.json", profile_document(device.profile, streams, costs, name="A2-lab"))
    loaded = load_profile(path)
    assert loaded.name == "A2-lab" and loaded.device.stream_limit == 9 and loaded.device.soc == device.profile.soc
    assert loaded.cost.capture_per_task_us >= 0 and loaded.cost.host_launch_us > 0
    assert "9 one-stream graphs held, refused at graph 10" in loaded.device.description
    document = json.loads(path.read_text())
    assert document["base"] == "A2" and set(document["cost"]) == {
        "capture_base_us", "capture_per_task_us", "graph_launch_us", "host_launch_us"}


def test_a_calibration_that_captured_nothing_gives_no_profile() -> None:
    result = measure_streams(SimDevice(stream_limit=1), ceiling=10)
    assert result.graphs_captured == 1
    empty = type(result)(graphs_captured=0, refused=True)
    with pytest.raises(ValueError, match="captured no graph"):
        profile_document(SimDevice().profile, empty)


def test_bad_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match="ceiling"):
        measure_streams(SimDevice(), ceiling=0)


def test_a_profile_document_has_only_keys_the_simulator_accepts(tmp_path: Path) -> None:
    document = profile_document(SimDevice(profile="A3").profile, measure_streams(SimDevice(stream_limit=2), ceiling=5))
    try:
        load_profile(write_profile(tmp_path / "p.json", document))
    except ConfigError as exc:  # pragma: no cover - the assertion message is the point
        pytest.fail(f"sim.profiles rejects the calibration document: {exc}")
