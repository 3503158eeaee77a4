"""No silent green (issue 18): CI exports ASCENDGRAPH_CI=1, and with it the wheel-based
contract tests fail instead of skipping when the wheel cannot be fetched."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.inner_pytest import UNUSED_PLUGINS_OFF

REPO = Path(__file__).resolve().parents[2]


def test_ci_script_exports_the_ci_signal_before_running_the_suite():
    text = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "export ASCENDGRAPH_CI=1" in text
    assert text.index("export ASCENDGRAPH_CI=1") < text.index("make test")


def _contract_run(tmp_path: Path, ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ASCENDGRAPH_CI"}
    # an empty cache and no index: the wheel cannot be fetched
    (tmp_path / "empty").mkdir(exist_ok=True)
    env.update(ASCENDGRAPH_CACHE_DIR=str(tmp_path), ASCENDGRAPH_DOWNLOAD_CACHE_DIR=str(tmp_path), PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1",
               PIP_FIND_LINKS=str(tmp_path / "empty"),
               PIP_INDEX_URL="http://127.0.0.1:9/simple", PYTHONPATH=str(REPO))
    if ci:
        env["ASCENDGRAPH_CI"] = "1"
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *UNUSED_PLUGINS_OFF, "-n", "0",
                           "tests/hw/test_torch_npu_contract.py::test_the_cached_wheel_is_the_release_hw_targets"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_without_the_wheel_the_contract_tests_skip_outside_ci_and_fail_in_ci(tmp_path):
    outside = _contract_run(tmp_path, ci=False)
    assert outside.returncode == 0 and "skipped" in outside.stdout, outside.stdout[-500:]
    inside = _contract_run(tmp_path, ci=True)
    assert inside.returncode == 1 and "must run in CI" in inside.stdout, inside.stdout[-500:]
