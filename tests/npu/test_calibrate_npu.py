"""Calibrate the simulator to this stack: capture one-stream graphs until the stack
refuses (ceiling 4096) and write the measured stream limit and costs as a profile JSON
that ``sim.profiles.load_profile`` (``--sim-profile FILE``) reads.

The file goes to ``$ASCENDGRAPH_CALIBRATION_DIR`` (default ``profiles/`` at the repository
root, git-ignored), named after the SoC and the stack versions.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import pytest

from hw.calibrate import DEFAULT_CEILING, measure_costs, measure_streams, profile_document, write_profile
from sim.profiles import load_profile

pytestmark = pytest.mark.npu

REPO = Path(__file__).resolve().parents[2]


def output_path(device: Any) -> Path:
    directory = Path(os.environ.get("ASCENDGRAPH_CALIBRATION_DIR") or REPO / "profiles")
    profile = device.profile
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{profile.soc}-hdk{profile.hdk_version}-cann{profile.cann_version}")
    return directory / f"{stem}.json"


def test_calibration_measures_the_stream_limit_and_writes_a_profile_the_simulator_loads(npu_device: Any) -> None:
    streams = measure_streams(npu_device, ceiling=DEFAULT_CEILING)
    assert streams.graphs_captured > 0
    if streams.refused:
        assert streams.signature in ("stream_exhaustion", "old_hdk", "resource_alloc"), streams.error
    stats = npu_device.stats()
    assert stats.graphs_alive == 0
    costs = measure_costs(npu_device)
    path = write_profile(output_path(npu_device), profile_document(npu_device.profile, streams, costs))
    loaded = load_profile(path)
    assert loaded.device.stream_limit == streams.stream_limit and loaded.device.name.endswith("-calibrated")
    print(f"\ncalibrated profile written to {path}: stream_limit={streams.stream_limit} "
          f"({'refused: ' + streams.error if streams.refused else 'ceiling reached'}), costs={costs}")
