"""The npu gate (docs/decisions.md "The npu gate"): on a machine without an NPU, npu items are deselected with
one notice whatever -m says; a selection of npu items alone (-m npu, --device npu, a path
of npu tests) is a usage error naming --npu-facade; with --npu-facade they run. Checked on
a small suite of its own (the plugins loaded with -p), so each run takes seconds."""

from __future__ import annotations

import os
from importlib.metadata import entry_points
import subprocess
import sys
from pathlib import Path

import pytest

from hw import api

from tests.inner_pytest import UNUSED_PLUGINS_OFF

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(api.load_torch_npu()[0] is not None, reason="torch_npu is importable here")

SUITE = {
    "pytest.ini": "[pytest]\nmarkers =\n    npu: needs an NPU\n    slow: slow\n",
    "test_cpu.py": "def test_cpu():\n    pass\n",
    "npu_only/test_card.py": (
        "import pytest\n\npytestmark = pytest.mark.npu\n\n"
        "def test_card():\n    import torch_npu\n    assert torch_npu.npu.device_count() >= 1\n"
    ),
}


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gated_suite")
    for name, text in SUITE.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def run(root: Path, *args: str) -> tuple[int, str]:
    # The plugins are pytest11 entry points once the project is installed with them; `-p` for
    # an entry-point plugin would register it twice, so it is given only where it is missing.
    registered = {ep.value for ep in entry_points(group="pytest11")}
    plugins = [arg for name in ("ascendgraph.testing.plugin", "ascendgraph_npu_facade")
               if name not in registered for arg in ("-p", name)]
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *UNUSED_PLUGINS_OFF, *plugins, *args]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command, capture_output=True, text=True, cwd=root, env=env, timeout=300)
    return done.returncode, done.stdout + done.stderr


def test_m_npu_without_an_npu_is_a_usage_error_naming_the_reason_and_the_facade(suite: Path) -> None:
    code, output = run(suite, "-m", "npu")
    assert code == pytest.ExitCode.USAGE_ERROR, output
    assert "pytest -m npu needs a usable Ascend NPU" in output and "torch_npu is not installed" in output
    assert "--npu-facade" in output and " passed" not in output


def test_device_npu_says_so_in_its_own_words(suite: Path) -> None:
    code, output = run(suite, "--device", "npu")
    assert code == pytest.ExitCode.USAGE_ERROR, output
    assert "pytest --device npu needs a usable Ascend NPU" in output and "pytest -m npu" not in output


def test_a_path_of_npu_tests_alone_is_a_usage_error(suite: Path) -> None:
    code, output = run(suite, "npu_only")
    assert code == pytest.ExitCode.USAGE_ERROR, output
    assert "--npu-facade" in output


def test_another_m_expression_runs_the_cpu_tests_and_deselects_npu_ones_with_one_notice(suite: Path) -> None:
    code, output = run(suite, "-m", "not slow")
    assert code == 0, output
    assert "1 passed, 1 deselected" in output and output.count("npu test(s) deselected: no usable NPU") == 1


def test_with_the_facade_the_npu_tests_run(suite: Path) -> None:
    code, output = run(suite, "-m", "npu", "--npu-facade")
    assert code == 0 and "1 passed" in output, output
    assert "sim.facade" in output


def test_a_suite_without_an_npu_marker_is_not_gated(tmp_path: Path) -> None:
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    pass\n")
    code, output = run(tmp_path, "-m", "npu or not npu")
    assert code == 0 and "1 passed" in output, output
