"""ascendgraph's pytest plugin in a project that is not ascendgraph (docs/testing.md, "In your own
project"): a project that installs ascendgraph and marks tests ``npu`` gets the marker
registered and the npu gate, without a conftest or a ``markers`` entry of its own.

Each case runs pytest in-process (pytester) on a tiny outside project. Whether an NPU is
usable is the plugin's `npu_unusable_reason()`, replaced here so every case is the same on a
laptop and on an Ascend node (tests/hw/test_npu_marker.py covers the real answer).
"""

from __future__ import annotations

from importlib.metadata import entry_points

import pytest

import ascendgraph.testing.fixtures  # noqa: F401  (imported before any in-process inner session)
import ascendgraph.testing.scenarios  # noqa: F401
from ascendgraph.testing import plugin
from tests.inner_pytest import UNUSED_PLUGINS_OFF

pytest_plugins = ["pytester"]

# `-p` only where the plugin is not already a pytest11 entry point (an installed ascendgraph
# registers it, and registering it twice is an error).
PLUGIN_ARGS = (
    () if "ascendgraph.testing.plugin" in {ep.value for ep in entry_points(group="pytest11")}
    else ("-p", "ascendgraph.testing.plugin")
)
STRICT = ("-p", "no:cacheprovider", "-p", "no:xdist", "--strict-markers", "-W", "error::pytest.PytestUnknownMarkWarning")
NO_CARD = "no card in this test"

# An outside project: its own package name, no conftest, no markers declared.
PROJECT = {
    "pyproject.toml": '[project]\nname = "outside"\nversion = "0"\n\n[tool.pytest.ini_options]\naddopts = "-ra"\n',
    "tests/test_model.py": (
        "import pytest\n\n"
        "def test_on_cpu():\n    assert 1 + 1 == 2\n\n"
        "@pytest.mark.npu\n"
        "def test_on_a_card():\n    import torch_npu  # noqa: F401\n"
    ),
}


@pytest.fixture
def outside(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    pytester.makefile(".toml", pyproject=PROJECT["pyproject.toml"])
    pytester.mkdir("tests")
    (pytester.path / "tests" / "test_model.py").write_text(PROJECT["tests/test_model.py"])
    monkeypatch.setattr(plugin, "npu_unusable_reason", lambda: NO_CARD)
    return pytester


def _run(project: pytest.Pytester, *args: str) -> pytest.RunResult:
    # pytester restores sys.modules after each inline run, so a plugin the inner session loads is
    # imported (and assertion-rewritten) again by every case: UNUSED_PLUGINS_OFF spares that.
    return project.runpytest_inprocess(*PLUGIN_ARGS, *STRICT, *UNUSED_PLUGINS_OFF, *args)


def test_the_npu_marker_is_registered_for_a_project_that_declares_none(outside: pytest.Pytester) -> None:
    result = _run(outside, "--markers")
    assert result.ret == 0
    npu_lines = [line for line in result.outlines if line.startswith("@pytest.mark.npu:")]
    assert npu_lines == ["@pytest.mark.npu: " + plugin.NPU_MARKER.split(": ", 1)[1]]


def test_a_plain_run_passes_the_cpu_tests_and_deselects_the_npu_ones_with_one_notice(outside: pytest.Pytester) -> None:
    result = _run(outside)
    result.assert_outcomes(passed=1, deselected=1)
    assert result.ret == 0
    output = result.stdout.str() + result.stderr.str()
    assert "PytestUnknownMarkWarning" not in output
    assert output.count(f"ascendgraph: 1 npu test(s) deselected: no usable NPU here ({NO_CARD})") == 1


def test_m_npu_without_an_npu_is_a_usage_error_not_a_green_run(outside: pytest.Pytester) -> None:
    result = _run(outside, "-m", "npu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = result.stderr.str()
    assert f"pytest -m npu needs a usable Ascend NPU, and this machine has none: {NO_CARD}." in errors
    assert " passed" not in result.stdout.str()


def test_a_selection_of_npu_tests_alone_is_a_usage_error(outside: pytest.Pytester) -> None:
    result = _run(outside, "tests/test_model.py::test_on_a_card")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "the selected tests all need an Ascend NPU (marked npu)" in result.stderr.str()


def test_with_an_npu_the_npu_tests_run(outside: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugin, "npu_unusable_reason", lambda: None)
    outside.makepyfile(torch_npu="")  # the card's torch_npu, as far as this test needs it
    outside.syspathinsert()
    result = _run(outside, "-m", "npu")
    result.assert_outcomes(passed=1, deselected=1)


def test_a_project_that_declares_its_own_npu_marker_keeps_its_text(outside: pytest.Pytester) -> None:
    (outside.path / "pyproject.toml").write_text(
        PROJECT["pyproject.toml"] + 'markers = ["npu: runs on our Ascend cluster"]\n'
    )
    result = _run(outside, "--markers")
    assert [line for line in result.outlines if line.startswith("@pytest.mark.npu:")] == [
        "@pytest.mark.npu: runs on our Ascend cluster"
    ]


def test_a_project_without_npu_tests_is_not_gated_and_never_asks_for_an_npu(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked: list[bool] = []
    monkeypatch.setattr(plugin, "npu_unusable_reason", lambda: asked.append(True) or NO_CARD)
    pytester.makepyfile(test_plain="def test_plain():\n    pass\n")
    result = _run(pytester, "-m", "npu or not npu")
    result.assert_outcomes(passed=1)
    assert asked == []


# --------------------------------------------------------------------------- a third-party project
#
# Installed with ascendgraph, the plugin loads in every project of that environment. A project
# that has its own tests/scenarios/*.toml and its own --device option must run as if the plugin
# were not there. These cases run pytest in a subprocess (the plugin loads from its entry point,
# or with -p where ascendgraph is not installed), on a project written to tmp_path.

import os  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402


ROOT = Path(__file__).resolve().parents[2]
THEIR_CONFTEST = (
    "def pytest_addoption(parser):\n"
    "    parser.addoption('--device', default='cpu', help='our accelerator (cpu, cuda)')\n"
    "    parser.addoption('--expect-device', default='cpu')\n"
)
THEIR_TESTS = (
    "def test_our_device_option(request):\n"
    "    assert request.config.getoption('--device') == request.config.getoption('--expect-device', 'cpu')\n"
)
THEIR_SCENARIO = '[scenario]\nname = "a load test of our own"\nusers = 10\n'


def _third_party(tmp_path: Path, *, ini: str = "", conftest: str = THEIR_CONFTEST) -> Path:
    project = tmp_path / "theirs"
    (project / "tests" / "scenarios").mkdir(parents=True)
    (project / "pyproject.toml").write_text(f'[project]\nname = "theirs"\nversion = "0"\n\n[tool.pytest.ini_options]\n{ini}')
    (project / "conftest.py").write_text(conftest)
    (project / "tests" / "test_theirs.py").write_text(THEIR_TESTS)
    (project / "tests" / "scenarios" / "x.toml").write_text(THEIR_SCENARIO)
    return project


def _pytest(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run([sys.executable, "-m", "pytest", *PLUGIN_ARGS, "-p", "no:cacheprovider", "-p", "no:xdist",
                           *UNUSED_PLUGINS_OFF, "-q", *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=600)


def test_a_project_with_its_own_scenarios_and_device_option_runs_as_without_the_plugin(tmp_path: Path) -> None:
    project = _third_party(tmp_path)
    result = _pytest(project, "--device", "cuda", "--expect-device", "cuda")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "1 passed" in result.stdout and "x.toml" not in result.stdout
    plain = _pytest(project)
    assert plain.returncode == 0 and "1 passed" in plain.stdout, plain.stdout[-3000:] + plain.stderr[-3000:]


def test_the_plugins_device_flag_stays_reachable_beside_the_projects_own(tmp_path: Path) -> None:
    project = _third_party(tmp_path)
    (project / "tests" / "test_sim.py").write_text(
        "def test_the_device_fixture_is_the_simulator(device):\n    assert device.name == 'sim'\n")
    result = _pytest(project, "--ascendgraph-device", "sim", "--device", "cuda", "--expect-device", "cuda")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 passed" in result.stdout
    help_text = _pytest(project, "--help").stdout
    assert "--ascendgraph-device" in help_text and "our accelerator (cpu, cuda)" in help_text


def test_without_a_device_option_of_its_own_the_project_gets_device(tmp_path: Path) -> None:
    project = _third_party(tmp_path, conftest="")
    (project / "tests" / "test_theirs.py").write_text(
        "def test_the_device_fixture_is_the_simulator(device):\n    assert device.name == 'sim'\n")
    result = _pytest(project, "--device", "sim")
    assert result.returncode == 0 and "1 passed" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    refused = _pytest(project, "--device", "cuda")
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR and "invalid choice: 'cuda'" in refused.stderr


def test_scenario_files_are_collected_only_in_the_folders_a_project_opts_in(tmp_path: Path) -> None:
    project = _third_party(tmp_path, ini='ascendgraph_scenarios = ["tests/ours"]\n')
    (project / "tests" / "ours").mkdir()
    (project / "tests" / "ours" / "launch_blocking.toml").write_text(
        (ROOT / "tests" / "scenarios" / "ascend_launch_blocking.toml").read_text())
    result = _pytest(project, "-rA")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "2 passed" in result.stdout
    assert "tests/ours/launch_blocking.toml::launch_blocking" in result.stdout
    assert "x.toml" not in result.stdout


def test_loading_the_plugins_imports_neither_torch_nor_the_simulator() -> None:
    """pytest loads every pytest11 entry point in every run of the environment, also in
    projects that never use torch: both plugins stay inert and light until asked (the facade's
    is a package outside ``sim`` for this reason; importing ``sim`` costs about 1.7 s of CPU)."""
    import subprocess
    import sys

    probe = ("import sys, ascendgraph.testing.plugin, ascendgraph_npu_facade; "
             "print(sorted(m for m in ('torch', 'sim', 'hw', 'numpy') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert {"ascendgraph.testing.plugin", "ascendgraph_npu_facade"} <= {ep.value for ep in entry_points(group="pytest11")}


FREEZE_PROBE = (
    "import gc\n\n"
    "def test_probe(request):\n"
    "    frozen = gc.get_freeze_count()\n"
    "    if request.config.getoption('--npu-facade'):\n"
    "        assert frozen > 50_000, frozen  # torch and the simulator, imported by the plugin\n"
    "    else:\n"
    "        assert frozen == 0, frozen\n"
)


def test_the_facade_plugin_freezes_what_importing_torch_and_the_simulator_made_and_only_under_the_switch(
        tmp_path: Path) -> None:
    project = tmp_path / "theirs"
    project.mkdir()
    (project / "test_probe.py").write_text(FREEZE_PROBE)
    for switch in ((), ("--npu-facade",)):
        done = _pytest(project, *switch)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
