"""One error hierarchy (ascendgraph/errors.py, docs/decisions.md "One error hierarchy, three exit
codes"): every exception class ascendgraph defines lives in errors.py and derives from
AscendGraphError (Terminated, a signal, alone from BaseException); run-wide fields are
constructor fields."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ascendgraph import errors

CORE = Path(__file__).resolve().parents[2] / "ascendgraph"
_EXCEPTION_BASES = {"Exception", "BaseException", "RuntimeError", "ValueError", "AssertionError", "OSError",
                    "KeyError", "TypeError", "LookupError"}
# Raised and caught inside one function's module, never seen by a caller (the reader's parse hook).
PRIVATE_CONTROL_FLOW = {"ascendgraph/readers.py": {"_TooLong"}}


def _exception_classes_outside_errors() -> dict[str, list[str]]:
    names_in_errors = {name for name, value in vars(errors).items()
                       if isinstance(value, type) and issubclass(value, BaseException)}
    found: dict[str, list[str]] = {}
    for path in sorted(CORE.rglob("*.py")):
        if path.name == "errors.py" and path.parent == CORE:
            continue
        relative = str(path.relative_to(CORE.parent))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = {ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases}
            if bases & (_EXCEPTION_BASES | names_in_errors) and node.name not in PRIVATE_CONTROL_FLOW.get(relative, ()):
                found.setdefault(relative, []).append(node.name)
    return found


def test_every_exception_class_is_defined_in_errors():
    assert _exception_classes_outside_errors() == {}


def test_every_exception_class_in_errors_derives_from_the_hierarchy():
    classes = [value for value in vars(errors).values()
               if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__]
    assert len(classes) > 25
    outside = [cls.__name__ for cls in classes if not issubclass(cls, errors.AscendGraphError)]
    assert outside == ["Terminated"]
    assert not issubclass(errors.Terminated, Exception), "SIGTERM must unwind past every `except Exception`"
    assert set(errors.__all__) >= {cls.__name__ for cls in classes}


@pytest.mark.parametrize("module, name", [
    ("ascendgraph.forward_context", "NoForwardContext"),
    ("ascendgraph.compile.graph_wrapper", "CaptureNotAllowed"),
    ("ascendgraph.runtime.params", "GraphParamsNotSet"),
    ("ascendgraph.runtime.workload", "OutOfKVBlocks"),
    ("ascendgraph.xlite", "XliteBudgetExceeded"),
    ("ascendgraph.cli.app", "CliUsageError"),
    ("ascendgraph.cli.streams", "Terminated"),
    ("ascendgraph.testing.scenarios", "ScenarioFailed"),
    ("ascendgraph.tools.scenario", "ScenarioError"),
    ("ascendgraph.tools.diagnose.classes", "UnreadableLog"),
    ("ascendgraph.parallel.coordination", "RedispatchFailed"),
    ("ascendgraph.tools.scenario.ray_items", "RayTaskFailed"),
])
def test_moved_exception_classes_stay_importable_where_they_were(module, name):
    import importlib

    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_rank_and_peer_abort_are_constructor_fields():
    abort = errors.CaptureError("capture aborted on every rank together", peer_abort=True, rank=2)
    assert (abort.peer_abort, abort.rank) == (True, 2)
    assert (errors.CaptureError("x").peer_abort, errors.CaptureError("x").rank) == (False, None)
    assert errors.GraphHang("hang", rank=1).rank == 1
    assert errors.ConfigError("bad", key="k", rank=0).rank == 0
    assert errors.CollectiveTimeout("late", straggler=3, ranks=(0,), rank=0).rank == 0
    assert errors.KernelContractError("no", kernel="k", rank=5).rank == 5


def test_the_planted_exception_outside_errors_is_found(tmp_path, monkeypatch):
    probe = CORE / "tools" / "_errors_probe.py"
    try:
        probe.write_text("class Planted(RuntimeError):\n    pass\n\nclass AlsoPlanted(errors.ConfigError):\n    pass\n")
        assert _exception_classes_outside_errors() == {"ascendgraph/tools/_errors_probe.py": ["Planted", "AlsoPlanted"]}
    finally:
        probe.unlink()
