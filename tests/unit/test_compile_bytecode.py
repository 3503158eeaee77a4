"""scripts/compile_bytecode.py: the bytecode `make run` / `make test` compile is the one Python
reads under PYTHONDONTWRITEBYTECODE, and an edited module never runs stale."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compile_bytecode", ROOT / "scripts" / "compile_bytecode.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _import_verbose(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(root)}
    return subprocess.run([sys.executable, "-v", "-c", "import sim.probe as p; print(p.VALUE)"], env=env, cwd=root,
                          capture_output=True, text=True, check=True)


def test_python_reads_the_compiled_bytecode_and_recompiles_an_edited_module(tmp_path: Path) -> None:
    package = tmp_path / "sim"
    package.mkdir()
    (package / "__init__.py").write_text("")
    source = package / "probe.py"
    source.write_text("VALUE = 1\n")
    assert _script().compile_project(str(tmp_path)) is True
    assert list((package / "__pycache__").glob("probe.*.pyc"))

    first = _import_verbose(tmp_path)
    assert first.stdout.strip() == "1"
    assert f"matches {source}" in first.stderr  # the compiled bytecode, not the source

    source.write_text("VALUE = 22\n")  # another size: the cached bytecode no longer matches
    second = _import_verbose(tmp_path)
    assert second.stdout.strip() == "22"
    assert f"code object from {source}" in second.stderr


def test_a_module_that_does_not_compile_fails_the_script(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    package = tmp_path / "hw"
    package.mkdir()
    (package / "broken.py").write_text("def f(:\n")
    assert _script().compile_project(str(tmp_path)) is False
    out, err = capfd.readouterr()
    assert out == "" and "broken.py" in err  # the message is a log: stderr


def test_the_script_takes_no_arguments() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "compile_bytecode.py"), "--tree", "x"],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unrecognized arguments: --tree x" in done.stderr


@pytest.mark.parametrize("target", ["run", "test", "test-all"])
def test_make_compiles_the_bytecode_before_running(target: str) -> None:
    makefile = (ROOT / "Makefile").read_text()
    line = next(line for line in makefile.splitlines() if line.startswith(f"{target}:"))
    assert "bytecode" in line.split(":", 1)[1].split()
