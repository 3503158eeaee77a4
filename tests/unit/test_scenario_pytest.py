"""The pytest side: scenario files collected as items, and the ``fault`` marker on ``device``.

Collection is checked in-process (pytester). Running items happens in one pytest
subprocess shared by the module: pytester's in-process runs unload the modules first
imported inside them, and torch's lazily imported submodules cannot be imported twice in
one process. The slow test repeats the run under pytest-xdist (``-n 2``).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import ascendgraph.testing.scenarios  # noqa: F401  (imported before any in-process inner session)
import sim.faults  # noqa: F401
import sim.profiles  # noqa: F401

from tests.inner_pytest import UNUSED_PLUGINS_OFF

pytest_plugins = ["pytester"]

# `-p` only where the plugin is not already a pytest11 entry point (a fresh install registers it; twice is an error).
from importlib.metadata import entry_points as _entry_points

PLUGIN = (
    () if "ascendgraph.testing.plugin" in {ep.value for ep in _entry_points(group="pytest11")}
    else ("-p", "ascendgraph.testing.plugin")
) + ("-p", "no:cacheprovider")

SCENARIOS = {
    "refused_replay": """
        kind = "device"
        description = "replay before capture is refused"
        [action]
        name = "replay_before_capture"
        [expect]
        outcome = "error"
        error_type = "CaptureConstraintError"
    """,
    "wrong_expectation": """
        kind = "device"
        description = "expects ok from a refused replay"
        [action]
        name = "replay_before_capture"
        [expect]
        outcome = "ok"
    """,
    "typo": """
        kind = "device"
        description = "a typo in the action name"
        [action]
        name = "replay_befor_capture"
        [expect]
        outcome = "error"
        error_type = "CaptureConstraintError"
    """,
}

MARKER_TESTS = '''
import pytest
import torch

from ascendgraph.errors import StreamResourceExhausted, rewrite_capture_error


def capture(device):
    x = torch.ones(2)
    graph = device.new_graph()
    with device.graph(graph):
        x + 1
    return graph


@pytest.mark.fault("capture_begin=1*off->raise(207008)")
def test_second_capture_is_refused(device, fault_plan):
    assert "capture_begin" in fault_plan.rules
    capture(device)
    with pytest.raises(RuntimeError) as caught:
        capture(device)
    assert isinstance(rewrite_capture_error(caught.value), StreamResourceExhausted)


@pytest.mark.fault(plan="replay=raise(device_lost)")
def test_plan_keyword(device):
    graph = capture(device)
    with pytest.raises(Exception, match="device lost"):
        graph.replay()


@pytest.mark.fault("capture_begin=raise(207005)")
class TestClassMarker:
    def test_applies_to_methods(self, device):
        with pytest.raises(RuntimeError, match="207005"):
            capture(device)


def test_without_marker_nothing_is_injected(device, fault_plan):
    assert fault_plan is None
    capture(device)


@pytest.mark.fault("capture_begin=raise(207008)")
def test_marker_without_device(sim_device):
    capture(sim_device)


@pytest.mark.fault("captur_begin=raise(207008)")
def test_bad_plan(device):
    pass
'''


def write_project(root: Path) -> None:
    folder = root / "scenarios"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in SCENARIOS.items():
        (folder / f"{name}.toml").write_text(textwrap.dedent(text))
    (folder / "notes.txt").write_text("not a scenario")
    (root / "other.toml").write_text("not collected: not under the opted-in folder")
    (root / "pytest.ini").write_text("[pytest]\nascendgraph_scenarios = scenarios\n")  # the project opts in
    (root / "test_marker.py").write_text(MARKER_TESTS)


def run_inner(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", *UNUSED_PLUGINS_OFF, *PLUGIN, "--strict-markers", "-v", "-rfE", *args],
        cwd=root, capture_output=True, text=True, timeout=900,
    )


# --------------------------------------------------------------------------- collection (in-process)


def test_scenario_files_are_collected_one_item_each_named_after_the_file(pytester):
    write_project(pytester.path)
    result = pytester.runpytest_inprocess(*UNUSED_PLUGINS_OFF, *PLUGIN, "--collect-only", "-q", "scenarios")
    result.stdout.fnmatch_lines([
        "scenarios/refused_replay.toml::refused_replay",
        "scenarios/typo.toml::typo",
        "scenarios/wrong_expectation.toml::wrong_expectation",
        "3 tests collected*",
    ])


def test_the_scenario_marker_selects_and_deselects_scenario_items(pytester):
    write_project(pytester.path)
    result = pytester.runpytest_inprocess(*UNUSED_PLUGINS_OFF, *PLUGIN, "--collect-only", "-q", "-m", "not scenario")
    result.stdout.fnmatch_lines(["test_marker.py::test_second_capture_is_refused", "*6/9 tests collected (3 deselected)*"])


# --------------------------------------------------------------------------- running (one subprocess)
# One inner session for every check below: a subprocess costs seconds (torch imports), and a
# module-scoped fixture would run once per xdist worker.

RUN_CHECKS = [
    ("a scenario that meets its expectation passes", ["scenarios/refused_replay.toml::refused_replay PASSED"]),
    ("a scenario that misses fails with its explanation", [
        "scenarios/wrong_expectation.toml::wrong_expectation FAILED",
        "expected ok, observed error",
        "- outcome: expected ok, got error (CaptureConstraintError: Called NPUGraph::replay",
    ]),
    ("a bad file fails its item naming the key", [
        "scenarios/typo.toml::typo FAILED",
        "typo.toml: [action] name: expected one of",
        "did you mean 'replay_before_capture'",
    ]),
    ("the fault marker applies its plan to `device`", [
        "test_marker.py::test_second_capture_is_refused PASSED",
        "test_marker.py::test_plan_keyword PASSED",
        "test_marker.py::TestClassMarker::test_applies_to_methods PASSED",
        "test_marker.py::test_without_marker_nothing_is_injected PASSED",
    ]),
    ("a fault marker without `device` is an error, not a silent pass", [
        "test_marker.py::test_marker_without_device ERROR",
        "@pytest.mark.fault applies its plan to the `device` fixture, which this test does not use",
    ]),
    ("a bad fault plan is an error naming the bad token", [
        "test_marker.py::test_bad_plan ERROR",
        "bad @pytest.mark.fault plan 'captur_begin=raise(207008)'",
        "unknown site 'captur_begin'",
    ]),
]


def test_scenario_items_and_fault_marked_tests_run_as_specified(tmp_path):
    write_project(tmp_path)
    output = run_inner(tmp_path, "-p", "no:xdist").stdout
    for behaviour, fragments in RUN_CHECKS:
        for fragment in fragments:
            assert fragment in output, f"{behaviour}: {fragment!r} not in the inner run's output:\n{output}"
    assert "raise ScenarioError" not in output, "a bad scenario file is reported without a traceback"
    assert output.strip().splitlines()[-1].startswith("=") and "2 failed, 5 passed, 2 errors" in output


@pytest.mark.slow
def test_scenarios_and_the_fault_marker_work_under_xdist(tmp_path):
    write_project(tmp_path)
    output = run_inner(tmp_path, "-n", "2").stdout
    summary = output.strip().splitlines()[-1]
    assert "2 failed, 5 passed, 2 errors" in summary, output
