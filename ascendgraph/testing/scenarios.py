"""pytest collection of fault scenarios (`ascendgraph.tools.scenario`): one test item per file.

Only where the project opts in: every ``*.toml`` file below a folder named in the
``ascendgraph_scenarios`` ini option (paths relative to the ini file) becomes one item named
after the file, e.g. with ``ascendgraph_scenarios = ["tests/scenarios"]`` in
``[tool.pytest.ini_options]``: ``tests/scenarios/task_queue_enable_2.toml::task_queue_enable_2``.
The plugin is installed with ascendgraph in every environment, and another project's own
``tests/scenarios/*.toml`` are not ours to run. The item runs the scenario on the simulator
and fails with the scenario's own explanation (what was expected, what was observed, which
invariant broke); a bad file fails its item with the file, the key and what was expected,
without stopping the collection of the others. Items carry the ``scenario`` marker plus the
file's ``marks`` (``-m "not scenario"`` skips them all).

`ascendgraph.testing.plugin` registers this module when it is importable (and declares the
ini option). Items hold no shared state, so they run under pytest-xdist (``-n auto``) like
any test.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional, Sequence, Union

import pytest

from ascendgraph.errors import ScenarioFailed
from ascendgraph.tools.scenario import Scenario, ScenarioError, load_scenario, run_scenario

__all__ = ["ScenarioFile", "ScenarioItem", "is_scenario_file", "scenario_folders", "SCENARIO_INI"]

SCENARIO_INI = "ascendgraph_scenarios"
SCENARIO_MARKER = "scenario: a fault-scenario file (a folder of the ascendgraph_scenarios ini option) run on the simulator"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", SCENARIO_MARKER)


def scenario_folders(config: pytest.Config) -> list[Path]:
    """The folders the project opted in (``ascendgraph_scenarios``; none when it did not)."""
    try:
        return [Path(folder) for folder in config.getini(SCENARIO_INI)]
    except ValueError:  # the option is not declared (the plugin module was not loaded)
        return []


def is_scenario_file(file_path: Path, folders: Sequence[Path]) -> bool:
    """A ``.toml`` file below one of ``folders``."""
    return file_path.suffix == ".toml" and any(file_path.is_relative_to(folder) for folder in folders)


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Optional["ScenarioFile"]:
    if file_path.suffix == ".toml" and is_scenario_file(file_path, scenario_folders(parent.config)):
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
