"""`pytest -m npu` (or --device npu) on a machine without a usable NPU stops with a usage
error that says why, instead of "0 tests passed"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hw import api

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(api.load_torch_npu()[0] is not None, reason="torch_npu is importable here")


def test_pytest_m_npu_without_an_npu_is_a_usage_error_naming_the_reason() -> None:
    # The guard runs before collection (tests/npu is a small path anyway), so this stays quick.
    # `--device npu` goes through the same check in the plugin.
    command = [sys.executable, "-m", "pytest", "-m", "npu", "tests/npu", "-q", "-p", "no:cacheprovider", "-p", "no:xdist"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=dict(os.environ), timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, output
    assert "pytest -m npu needs a usable Ascend NPU" in output
    assert "torch_npu is not installed" in output
    assert " passed" not in output
