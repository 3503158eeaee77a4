"""pytest collection of fault scenarios (`ascendgraph.tools.scenario`): one test item per file.

Every ``*.toml`` file inside a folder named ``scenarios`` (below the rootdir, e.g.
``tests/scenarios/``) becomes one item named after the file:
``tests/scenarios/task_queue_enable_2.toml::task_queue_enable_2``. The item runs the
scenario on the simulator and fails with the scenario's own explanation (what was expected,
what was observed, which invariant broke); a bad file fails its item with the file, the key
and what was expected, without stopping the collection of the others. Items carry the
``scenario`` marker plus the file's ``marks`` (``-m "not scenario"`` skips them all).

`ascendgraph.testing.plugin` registers this module when it is importable. Items hold no
shared state, so they run under pytest-xdist (``-n auto``) like any test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Union

import pytest

from ascendgraph.errors import ScenarioFailed
from ascendgraph.tools.scenario import Scenario, ScenarioError, load_scenario, run_scenario

__all__ = ["ScenarioFile", "ScenarioItem", "is_scenario_file", "SCENARIO_FOLDER"]

SCENARIO_FOLDER = "scenarios"
SCENARIO_MARKER = "scenario: a fault-scenario file (tests/scenarios/*.toml) run on the simulator"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", SCENARIO_MARKER)


def is_scenario_file(file_path: Path, rootpath: Optional[Path] = None) -> bool:
    """A ``.toml`` file with a folder named ``scenarios`` among its parents (below the rootdir)."""
    if file_path.suffix != ".toml":
        return False
    parents = file_path.parent
    if rootpath is not None:
        try:
            parents = file_path.parent.relative_to(rootpath)
        except ValueError:
            pass
    return SCENARIO_FOLDER in parents.parts


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional["ScenarioFile"]:
    if is_scenario_file(file_path, parent.config.rootpath):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    """A scenario file: it holds exactly one item, named after the file."""

    def collect(self) -> list["ScenarioItem"]:
        return [ScenarioItem.from_parent(self, name=self.path.stem)]


class ScenarioItem(pytest.Item):
    """Runs one scenario file."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scenario: Optional[Scenario] = None
        self.load_error: Optional[ScenarioError] = None
        try:
            self.scenario = load_scenario(self.path)
        except ScenarioError as exc:
            self.load_error = exc
        self.add_marker("scenario")
        for mark in self.scenario.marks if self.scenario is not None else ():
            self.add_marker(mark)

    def runtest(self) -> None:
        if self.load_error is not None:
            raise self.load_error
        assert self.scenario is not None
        result = run_scenario(self.scenario)
        self.user_properties.append(("outcome", result.outcome))
        self.user_properties.append(("expected", self.scenario.expect.outcome))
        if not result.passed:
            raise ScenarioFailed(result)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Union[str, Any]:
        if isinstance(excinfo.value, (ScenarioFailed, ScenarioError)):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self) -> tuple[Path, Optional[int], str]:
        expected = self.scenario.expected_text if self.scenario is not None else "(bad file)"
        return self.path, None, f"scenario {self.name}: expects {expected}"
