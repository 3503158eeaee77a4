"""The README cannot rot: every command it shows is run here (issue 11).

* every ``ascendgraph ...`` line in a ```bash block runs through the CLI in-process and must
  exit as documented (``# exit N`` at the end of the line; 0 otherwise);
* the Python API block is executed;
* every other shell command in the README must be listed in `COVERED_ELSEWHERE` with the
  test that exercises it, so a new README command cannot go untested.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from ascendgraph.cli.app import main

# Engine runs that never look at the compile cache: they share the worker's (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("worker_compile_cache")

README = Path(__file__).resolve().parents[2] / "README.md"

# Shell commands in the README that are not `ascendgraph ...`, and where they are exercised.
COVERED_ELSEWHERE = {
    "make run": "test_make_run_runs_the_first_readme_command (this file)",
    "make test": ".ci/run runs it on every submission",
    ".venv/bin/python -m pytest -m slow": "the slow-marked tests themselves (tests/fuzz, tests/engine)",
    ".venv/bin/python -m pytest -m npu": "tests/hw/test_npu_marker.py (usage error without an NPU)",
    "make bench": "tests/unit/test_bench.py (the quick bench writes results.json)",
    "make test-all": "test_every_readme_make_target_has_a_recipe (this file); the slow tests themselves",
    "make parity": ".ci/run runs `make parity` on every submission",
    "make typecheck": ".ci/run runs it on every submission; tests/unit/test_layout.py checks its configuration",
}


def _blocks(language: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.S)


def _shell_commands() -> list[str]:
    commands = []
    for block in _blocks("bash"):
        for line in block.splitlines():
            line = line.strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def _documented_exit(line: str) -> int:
    match = re.search(r"#\s*exit\s+(\d+)", line)
    return int(match.group(1)) if match else 0


ASCENDGRAPH_COMMANDS = [line for line in _shell_commands() if line.startswith("ascendgraph ")]


def test_the_readme_shows_the_tour_commands():
    joined = "\n".join(ASCENDGRAPH_COMMANDS)
    for command in ("ascendgraph run", "ascendgraph explain", "ascendgraph plan", "ascendgraph scenario run", "ascendgraph scenario list",
                    "ascendgraph doctor", "ascendgraph diagnose", "ascendgraph profile"):
        assert command in joined


# The default `ascendgraph run` (4 layers, 35 sizes, 210 graphs: the main job, `make run`) is the
# costliest line by far; it runs under -m slow (.ci/run step 1b), the others by default.
SLOW_COMMANDS = {"ascendgraph run"}
README_COMMAND_ROWS = [
    pytest.param(line, marks=[pytest.mark.slow] if line in SLOW_COMMANDS else []) for line in ASCENDGRAPH_COMMANDS
]


@pytest.mark.parametrize("line", README_COMMAND_ROWS)
def test_every_readme_command_runs_and_exits_as_documented(line, tmp_path, capsys):
    argv = shlex.split(line, comments=True)[1:]
    # Keep files the README writes to /tmp inside this test's own directory.
    argv = [str(tmp_path / Path(a).name) if a.startswith("/tmp/") else a for a in argv]
    code = main(argv)
    captured = capsys.readouterr()
    assert code == _documented_exit(line), f"{line}\nstderr:\n{captured.err[-2000:]}"
    if "--json" in argv:
        assert captured.out.lstrip().startswith("{")


def test_every_other_readme_shell_command_is_covered_elsewhere():
    others = [line for line in _shell_commands() if not line.startswith("ascendgraph ")]
    for line in others:
        command = line.split("#", 1)[0].strip()
        assert command in COVERED_ELSEWHERE, f"README command {command!r} is not exercised by any test"


def test_make_run_runs_the_first_readme_command():
    makefile = (README.parent / "Makefile").read_text(encoding="utf-8")
    run_target = makefile.split("\nrun:", 1)[1].split("\n\n", 1)[0]
    assert "ascendgraph run" in run_target
    assert ASCENDGRAPH_COMMANDS[0] == "ascendgraph run"


def test_the_python_api_example_runs(capsys):
    examples = [block for block in _blocks("python") if block.lstrip().startswith("import ascendgraph")]
    assert len(examples) == 1
    namespace: dict = {}
    exec(compile(examples[0], str(README), "exec"), namespace)  # noqa: S102 - our own README
    report = namespace["report"]
    assert report.exit_code == 0 and report.requests_completed == 8
    assert namespace["resolution"].mode.name == "FULL_DECODE_ONLY"
    assert "FULL_DECODE_ONLY" in capsys.readouterr().out


def test_every_readme_make_target_has_a_recipe():
    """A target listed in .PHONY without a rule prints "Nothing to be done" and exits 0: catch it."""
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    targets = sorted({line.split()[1] for line in _shell_commands() if line.startswith("make ")})
    assert {"run", "test", "test-all", "parity"} <= set(targets)
    for target in targets:
        # -n prints the recipe without running it; -o keeps the venv stamp from being rebuilt
        done = subprocess.run(["make", "-n", "-o", ".venv/.ascendgraph-installed", target],
                              cwd=README.parent, capture_output=True, text=True, check=True)
        assert "Nothing to be done" not in done.stdout + done.stderr, target
        assert any(tool in done.stdout for tool in ("pytest", "ascendgraph", "bench", "mypy")), (target, done.stdout)
