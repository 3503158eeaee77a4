"""`ascendgraph scenario run --ray`: the items as tasks on a local Ray instance give the report
the serial run gives (marked ``ray`` and ``slow``: `make ray` runs it in its own environment,
scripts/ray-env.sh; docs/ranks.md "Many machines")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.slow]

TESTS = Path(__file__).parents[1]
# Single-rank files of both kinds (engine, device; passing and failing on purpose) and two
# multi-rank files (a row per side): 2 + 2 * 2 rows.
FILES = [
    TESTS / "scenarios" / "device_capture_replay_ok.toml",
    TESTS / "scenarios" / "planner_n_sizes_fit.toml",
    TESTS / "ranks" / "scenario_files" / "draft_steps_differ.toml",
    TESTS / "ranks" / "scenario_files" / "sync_tensors_differ.toml",
]


def _scenario_run(*flags: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, "-m", "ascendgraph", "scenario", "run", "--json", *flags,
                           *map(str, FILES)], capture_output=True, text=True, timeout=600)
    assert done.stdout, done.stderr
    return done.returncode, json.loads(done.stdout)


def _without_times(document: dict) -> dict:
    summary = {k: v for k, v in document["summary"].items() if k != "seconds"}
    rows = [{k: v for k, v in row.items() if k != "seconds"} for row in document["scenarios"]]
    return {**document, "summary": summary, "scenarios": rows}


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")  # here, not at import: the default suite deselects this module's tests
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_the_ray_report_equals_the_serial_report(local_ray):
    serial_code, serial = _scenario_run()
    ray_code, on_ray = _scenario_run("--ray", local_ray)
    assert serial["summary"]["scenarios"] == len(FILES) + 2
    assert (ray_code, _without_times(on_ray)) == (serial_code, _without_times(serial))
