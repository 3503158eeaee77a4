"""hw/ against the real torch_npu API, on CPU: every torch_npu attribute hw/ declares
(hw/api.py) exists in the torch-npu 2.13.0 wheel with the keyword names and positional
count hw/ passes, and hw/ calls torch_npu only through those declarations.

The wheel is read, never imported: Python sources with ``ast``, op schemas from its
op-plugin YAML, C bindings and ATB ops by name in its shared libraries. It is cached in
``$ASCENDGRAPH_CACHE_DIR/wheels`` (default ~/.cache/ascendgraph/wheels) after a first
``pip download --no-deps torch-npu==2.13.0``; without network and without a cached
wheel the wheel tests skip and say so — except in CI (``ASCENDGRAPH_CI=1``, exported by
.ci/run), where an unavailable wheel fails them: a CI run must not turn green by skipping.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

import hw
from hw import api
from hw.api import APIS, NpuApi

from torch_npu_wheel import TorchNpuWheel, cached_wheel

HW_DIR = Path(hw.__file__).parent
API_MODULE = HW_DIR / "api.py"
API_NAMES = {name: value for name, value in vars(api).items() if isinstance(value, NpuApi)}


@pytest.fixture(scope="module")
def wheel() -> TorchNpuWheel:
    path, reason = cached_wheel()
    if path is None:
        message = f"torch-npu {api.TORCH_NPU_VERSION} wheel unavailable: {reason}"
        if os.environ.get("ASCENDGRAPH_CI") == "1":
            pytest.fail(f"{message} (ASCENDGRAPH_CI=1: the contract tests must run in CI)", pytrace=False)
        pytest.skip(message)
    return TorchNpuWheel(path)


def test_the_cached_wheel_is_the_release_hw_targets(wheel: TorchNpuWheel) -> None:
    version = wheel.find_in_module("torch_npu.version", "__version__")
    assert version is not None and version.node is not None
    assert ast.literal_eval(version.node.value) == api.TORCH_NPU_VERSION  # type: ignore[attr-defined]


@pytest.mark.parametrize("declared", APIS, ids=lambda a: a.path)
def test_every_declared_torch_npu_attribute_exists_with_the_arguments_hw_passes(
    wheel: TorchNpuWheel, declared: NpuApi
) -> None:
    problems = wheel.check(declared)
    assert not problems, "\n".join(problems)


def test_graph_capture_error_mode_is_never_positional_because_npu_and_cuda_orders_differ(wheel: TorchNpuWheel) -> None:
    found = wheel.resolve("torch_npu.npu.graph")
    init = wheel.python_method(found, "__init__")  # type: ignore[arg-type]
    params = [a.arg for a in init.node.args.args]  # type: ignore[union-attr]
    assert params[4] == "auto_dispatch_capture", params  # CUDA has capture_error_mode here
    assert api.GRAPH.positional == 1 and "capture_error_mode" in api.GRAPH.keywords


# --------------------------------------------------------------------------- hw/ uses only what it declares


def _hw_sources() -> dict[Path, ast.Module]:
    return {path: ast.parse(path.read_text(encoding="utf-8"), filename=str(path)) for path in sorted(HW_DIR.glob("*.py"))}


def _api_constant(node: ast.AST) -> NpuApi | None:
    """``api.X`` or a bare ``X`` naming a declaration."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "api":
        return API_NAMES.get(node.attr)
    if isinstance(node, ast.Name):
        return API_NAMES.get(node.id)
    return None


def _declared_calls() -> list[tuple[Path, ast.Call, NpuApi]]:
    """Every ``<namespace>.call(api.X, *args, **kwargs)`` in hw/."""
    calls = []
    for path, tree in _hw_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "call":
                declared = _api_constant(node.args[0]) if node.args else None
                if declared is not None:
                    calls.append((path, node, declared))
    return calls


def test_hw_calls_torch_npu_within_the_declared_positional_count_and_keywords() -> None:
    problems = []
    for path, node, declared in _declared_calls():
        where = f"{path.name}:{node.lineno}"
        positional = node.args[1:]
        if any(isinstance(arg, ast.Starred) for arg in positional):
            problems.append(f"{where}: *args in a call of {declared.path}; pass arguments explicitly")
        if len(positional) > declared.positional:
            problems.append(f"{where}: {len(positional)} positional arguments to {declared.path}, declared {declared.positional}")
        for keyword in node.keywords:
            if keyword.arg is None:
                if not _splat_of_declared_keywords(keyword.value, declared):
                    problems.append(f"{where}: **kwargs in a call of {declared.path} that hw/api.py cannot vouch for")
            elif keyword.arg not in declared.keywords:
                problems.append(f"{where}: keyword {keyword.arg!r} to {declared.path} is not declared in hw/api.py")
    assert not problems, "\n".join(problems)


def _splat_of_declared_keywords(value: ast.AST, declared: NpuApi) -> bool:
    """``**options`` is fine when options is a dict(...) literal of declared keywords in the same function."""
    if not isinstance(value, ast.Name):
        return False
    for path, tree in _hw_sources().items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == value.id for t in node.targets):
                literal = node.value
                if isinstance(literal, ast.Call) and isinstance(literal.func, ast.Name) and literal.func.id == "dict":
                    return all(k.arg in declared.keywords for k in literal.keywords)
    return False


def test_only_hw_api_touches_the_torch_npu_module() -> None:
    offenders = []
    for path, tree in _hw_sources().items():
        if path == API_MODULE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if any(n == "torch_npu" or n.startswith("torch_npu.") for n in names):
                    offenders.append(f"{path.name}:{node.lineno} imports torch_npu")
            if isinstance(node, ast.Attribute) and node.attr == "npu" and isinstance(node.value, ast.Name) and node.value.id == "torch":
                offenders.append(f"{path.name}:{node.lineno} uses torch.npu directly")
            if isinstance(node, ast.Name) and node.id == "torch_npu":
                offenders.append(f"{path.name}:{node.lineno} names torch_npu directly")
    assert not offenders, "reach torch_npu through hw.api declarations:\n" + "\n".join(offenders)


def test_every_declaration_is_used_by_hw_or_handed_to_the_core() -> None:
    used: set[str] = set()
    for tree in _hw_sources().values():
        for node in ast.walk(tree):
            declared = _api_constant(node)
            if declared is not None and isinstance(getattr(node, "ctx", None), ast.Load):
                used.add(declared.path)
    stale = [a.path for a in APIS if a.role != "protocol" and a.path not in used]
    assert not stale, f"declared in hw/api.py but used nowhere in hw/ (remove or use them): {stale}"
