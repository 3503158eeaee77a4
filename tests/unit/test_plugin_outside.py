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
    return project.runpytest_inprocess(*PLUGIN_ARGS, *STRICT, *args)


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
