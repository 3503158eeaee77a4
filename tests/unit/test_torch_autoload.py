"""`import ascendgraph` leaves the caller's environment as it found it
(ascendgraph/torch_autoload.py): torch's first import runs with device-backend autoload off,
and ``TORCH_DEVICE_BACKEND_AUTOLOAD`` is back to the caller's value (or absent) right after.

Each case runs a fresh interpreter with a fake out-of-tree backend installed (a
``torch.backends`` entry point, the one torch_npu registers) that leaves a marker file when
torch autoloads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parents[2]
VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"

REPORT = (
    "import json, os, sys\n"
    "{imports}\n"
    "import torch\n"
    "print(json.dumps({{'variable': os.environ.get('{variable}', 'absent'),\n"
    "                  'autoloaded': os.path.exists(os.environ['MARKER']),\n"
    "                  'loader': type(torch.__spec__.loader).__name__,\n"
    "                  'finders': [type(f).__name__ for f in sys.meta_path]}}))\n"
)


@pytest.fixture
def fake_backend(tmp_path: Path) -> Path:
    """A folder with an installed distribution whose torch.backends entry point writes $MARKER."""
    site = tmp_path / "site"
    dist = site / "fake_npu_backend-0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-npu-backend\nVersion: 0\n")
    (dist / "entry_points.txt").write_text("[torch.backends]\nfake = fake_npu_backend:autoload\n")
    (site / "fake_npu_backend.py").write_text(
        "import os\n\ndef autoload():\n    open(os.environ['MARKER'], 'w').close()\n")
    return site


def _report(site: Path, imports: str, value: Optional[str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(site)]), MARKER=str(site / "autoloaded"))
    if value is not None:
        env[VARIABLE] = value
    done = subprocess.run([sys.executable, "-c", REPORT.format(imports=imports, variable=VARIABLE)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_without_ascendgraph_torch_autoloads_the_fake_backend(fake_backend: Path) -> None:
    # The control: the fake backend is what torch_npu would be.
    report = _report(fake_backend, "", None)
    assert report == {"variable": "absent", "autoloaded": True, "loader": "SourceFileLoader",
                      "finders": report["finders"]}  # the finders are whatever the interpreter has


@pytest.mark.parametrize("imports", ["import ascendgraph", "import ascendgraph.cli", "import hw"])
def test_torch_imported_after_ascendgraph_does_not_autoload_and_the_variable_is_left_unset(
        fake_backend: Path, imports: str) -> None:
    report = _report(fake_backend, imports, None)
    assert report["variable"] == "absent"
    assert report["autoloaded"] is False
    assert report["loader"] == "SourceFileLoader"  # torch keeps its own loader
    assert "_TorchImportWithoutAutoload" not in report["finders"]  # the finder is gone after torch's import


@pytest.mark.parametrize("value, autoloads", [("1", True), ("0", False)])
def test_the_callers_own_value_is_kept_and_obeyed(fake_backend: Path, value: str, autoloads: bool) -> None:
    report = _report(fake_backend, "import ascendgraph", value)
    assert report["variable"] == value and report["autoloaded"] is autoloads


def test_right_after_import_ascendgraph_nothing_is_set(fake_backend: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != VARIABLE}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run([sys.executable, "-c", "import os, ascendgraph; print(os.environ.get('%s', 'absent'))"
                           % VARIABLE], env=env, capture_output=True, text=True, timeout=300)
    assert done.stdout.strip() == "absent", done.stderr
