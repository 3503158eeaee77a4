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


def _exception_fields() -> set[str]:
    """The keyword fields errors.py's exception classes take in their constructors."""
    import inspect

    fields = set()
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, BaseException) and "__init__" in vars(value):
            fields |= {p.name for p in inspect.signature(value.__init__).parameters.values()
                       if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return fields


def _exceptions_annotated(path: Path, fields: set[str]) -> list[str]:
    """Where a file sets an attribute on an exception after it was built: ``setattr`` of an
    exception field by name, or on a name an ``except ... as`` clause bound (dunders aside)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    caught = {node.name for node in ast.walk(tree) if isinstance(node, ast.ExceptHandler) and node.name}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2:
            target, name = node.args[0], node.args[1]
            if (isinstance(name, ast.Constant) and name.value in fields) or \
                    (isinstance(target, ast.Name) and target.id in caught):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) \
                        and target.value.id in caught and not target.attr.startswith("__"):
                    found.append(f"line {node.lineno}: {ast.unparse(target)} = ...")
    return found


def test_no_code_sets_fields_on_an_exception_after_it_is_built():
    # rank, peer_abort and the rest are constructor fields; who failed is told by the one who
    # knows (sim.fabric.FabricStats.failed_rank), never by annotating a raised exception.
    fields = _exception_fields()
    assert {"rank", "peer_abort", "straggler", "key"} <= fields
    files = [path for root in ("ascendgraph", "sim", "hw") for path in sorted((CORE.parent / root).rglob("*.py"))]
    found = {str(path.relative_to(CORE.parent)): hits for path in files if (hits := _exceptions_annotated(path, fields))}
    assert found == {}


def test_the_annotation_check_sees_a_planted_setattr(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "def run(failures, rank):\n"
        "    setattr(failures[rank], 'rank', rank)\n"
        "    try:\n"
        "        pass\n"
        "    except RuntimeError as exc:\n"
        "        exc.peer_abort = True\n"
        "        setattr(exc, name, 1)\n"
        "        exc.__cause__ = None\n"
    )
    assert _exceptions_annotated(planted, _exception_fields()) == [
        "line 2: setattr(failures[rank], 'rank', rank)", "line 6: exc.peer_abort = ...", "line 7: setattr(exc, name, 1)",
    ]


def test_the_planted_exception_outside_errors_is_found(tmp_path, monkeypatch):
    probe = CORE / "tools" / "_errors_probe.py"
    try:
        probe.write_text("class Planted(RuntimeError):\n    pass\n\nclass AlsoPlanted(errors.ConfigError):\n    pass\n")
        assert _exception_classes_outside_errors() == {"ascendgraph/tools/_errors_probe.py": ["Planted", "AlsoPlanted"]}
    finally:
        probe.unlink()


# Backend classes raised and caught inside the backend, never seen by a caller, with where.
BACKEND_PRIVATE_CONTROL_FLOW = {
    "sim.recorder.NoSignature": "raised by sim.recorder's signature readers, caught by sim.cost's memo",
}


def _backend_exception_classes() -> list[type]:
    import importlib
    import inspect

    root = CORE.parent
    found = []
    for package in ("sim", "hw"):
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            names = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
            if not names:
                continue
            module = importlib.import_module(".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__"))
            found += [cls for name in names if inspect.isclass(cls := getattr(module, name))
                      and issubclass(cls, BaseException) and cls.__module__ == module.__name__]
    return found


def test_every_exception_class_of_the_backends_derives_from_the_hierarchy():
    # errors.py cannot re-export a backend's classes (the core never imports sim or hw), so a
    # backend's own classes live beside their code and derive from a class of errors.py.
    classes = _backend_exception_classes()
    assert len(classes) >= 5
    outside = [f"{cls.__module__}.{cls.__name__}" for cls in classes if not issubclass(cls, errors.AscendGraphError)]
    assert sorted(set(outside) - set(BACKEND_PRIVATE_CONTROL_FLOW)) == []
