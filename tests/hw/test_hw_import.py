"""hw/ on a machine without torch_npu: it imports cleanly, says why the NPU is unusable
(and what to do), and ``--device npu`` is a one-line error with exit code 2."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import hw
from ascendgraph.cli import app as cli
from ascendgraph.device import backend_availability, get_device
from ascendgraph.errors import ConfigError, DeviceUnavailable
from hw import api
from hw.api import TorchNpu
from hw.device import create_npu_device

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(
    api.load_torch_npu()[0] is not None, reason="torch_npu is importable here: these tests are for machines without it"
)


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != api.AUTOLOAD_VARIABLE}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, timeout=120)


@pytest.fixture(scope="module")
def fresh_import() -> dict:
    """`import hw` in a fresh interpreter (torch not imported yet), then its availability."""
    done = _python(
        "import json, os, sys, hw\n"
        "usable, reason = hw.BACKEND.availability()\n"
        "print(json.dumps({'usable': usable, 'reason': reason, 'torch_npu_imported': 'torch_npu' in sys.modules,\n"
        "                  'autoload': os.environ.get('TORCH_DEVICE_BACKEND_AUTOLOAD')}))\n"
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hw_imports_without_torch_npu_and_reports_why_it_is_unavailable(fresh_import: dict) -> None:
    assert fresh_import["usable"] is False and fresh_import["torch_npu_imported"] is False
    assert "torch_npu is not installed" in fresh_import["reason"] and "--device sim" in fresh_import["reason"]


def test_hw_leaves_the_autoload_variable_as_it_found_it(fresh_import: dict) -> None:
    # Autoload is off only while torch's first import runs (tests/unit/test_torch_autoload.py).
    assert fresh_import["autoload"] is None


def test_an_explicit_autoload_setting_is_respected() -> None:
    env = dict(os.environ, TORCH_DEVICE_BACKEND_AUTOLOAD="1")
    done = subprocess.run([sys.executable, "-c", "import os, hw; print(os.environ['TORCH_DEVICE_BACKEND_AUTOLOAD'])"],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert done.stdout.strip() == "1", done.stderr


def test_availability_is_false_with_the_reason_through_the_registry() -> None:
    usable, reason = backend_availability("npu")
    assert not usable and "torch_npu is not installed" in reason
    assert hw.availability() == (usable, reason)


def test_get_device_npu_raises_device_unavailable_on_one_line() -> None:
    with pytest.raises(DeviceUnavailable) as caught:
        get_device("npu")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("device 'npu' is not usable here: torch_npu is not installed")


def test_cli_device_npu_is_a_one_line_error_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["run", "--device", "npu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "device 'npu' is not usable here" in err[0] and "Traceback" not in err[0]


# --------------------------------------------------------------------------- the import guard


def _failing(exc: BaseException):
    def importer(name: str):
        raise exc

    return importer


@pytest.mark.parametrize(
    "exc, expected",
    [
        (ModuleNotFoundError("No module named 'torch_npu'", name="torch_npu"), "torch_npu is not installed"),
        (ImportError("libhccl.so: cannot open shared object file: No such file or directory"), "libhccl.so"),
        (OSError("libascend_hal.so: cannot open shared object file"), "libascend_hal.so"),
    ],
)
def test_every_import_failure_becomes_a_one_line_reason_with_what_to_do(exc: BaseException, expected: str) -> None:
    module, reason = api._import_torch_npu(_failing(exc))
    assert module is None and expected in reason and "\n" not in reason
    assert "--device sim" in reason


def test_torch_backend_autoload_errors_keep_their_cause_in_the_reason() -> None:
    cause = ImportError("libhccl.so: cannot open shared object file")
    wrapped = RuntimeError(
        "Failed to load the backend extension: torch_npu. You can disable extension auto-loading with "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0."
    )
    wrapped.__cause__ = cause
    _, reason = api._import_torch_npu(_failing(wrapped))
    assert "Failed to load the backend extension" in reason and "libhccl.so" in reason
    assert "set_env.sh" in reason


def test_a_missing_module_inside_torch_npu_is_not_reported_as_torch_npu_missing() -> None:
    _, reason = api._import_torch_npu(_failing(ModuleNotFoundError("No module named 'yaml'", name="yaml")))
    assert "installed but cannot be imported" in reason and "yaml" in reason


@pytest.mark.parametrize(
    "namespace, expected",
    [
        (SimpleNamespace(npu=SimpleNamespace(is_available=lambda: False, device_count=lambda: 0)), "no NPU is visible"),
        (SimpleNamespace(npu=SimpleNamespace(is_available=lambda: True, device_count=lambda: 0)), "sees 0 NPUs"),
        (SimpleNamespace(npu=SimpleNamespace(is_available=lambda: 1 / 0, device_count=lambda: 1)), "ZeroDivisionError"),
    ],
)
def test_an_installed_torch_npu_without_usable_npus_gives_a_reason_and_never_raises(namespace, expected) -> None:
    reason = api.unavailable_reason(TorchNpu(namespace))
    assert expected in reason and "--device sim" in reason


def test_an_installed_torch_npu_with_npus_is_usable() -> None:
    assert api.unavailable_reason(TorchNpu(SimpleNamespace(npu=SimpleNamespace(is_available=lambda: True, device_count=lambda: 8)))) == ""


# --------------------------------------------------------------------------- device options


def test_simulator_fault_injection_is_refused_by_the_npu_device() -> None:
    with pytest.raises(ConfigError, match="simulator-only"):
        create_npu_device(faults="capture_begin=raise(207008)")


def test_unknown_npu_device_options_are_named_with_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="unknown npu device option.*bogus.*device_index, soc, stream_limit"):
        create_npu_device(bogus=1)


def test_simulator_options_that_ask_for_nothing_pass_through_to_the_availability_check() -> None:
    with pytest.raises(DeviceUnavailable):
        create_npu_device(profile="A2", seed=0, faults=None, stream_limit=1800)


# --------------------------------------------------------------------------- layering


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_hw_never_imports_the_simulator() -> None:
    offenders = [p.name for p in (REPO / "hw").glob("*.py") if "sim" in _imports(p)]
    assert not offenders


def test_the_core_never_imports_hw_or_torch_npu() -> None:
    offenders = [str(p.relative_to(REPO)) for p in (REPO / "ascendgraph").rglob("*.py")
                 if _imports(p) & {"hw", "torch_npu"}]
    assert not offenders
