"""Mutation testing of the rule modules (`make mutation-rules`), not a CI step (docs/testing.md).

Each mutant changes one operator or constant of a module (comparison, arithmetic, boolean
operator, ``not``, boolean or integer constant, a returned value), is written into a copy
of the package, and the module's tests run against it (``-x``, ``-n 0``). A mutant the
tests fail on is *killed*; one they pass is a *survivor*, to be killed with a test or
listed as equivalent with the reason. Standard library only (plus pytest to run the tests).

    python scripts/mutate.py                       # every module in MODULES
    python scripts/mutate.py ascendgraph/sizes.py  # one module
    python scripts/mutate.py --max 40 --json out.json

``--max N`` keeps N mutants per module, sampled evenly over the file (deterministic).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

ROOT = Path(__file__).resolve().parent.parent

# module -> the tests that cover it (the rule modules of issue 18; the capture modules are mutmut's,
# [tool.mutmut] in pyproject.toml)
MODULES: dict[str, list[str]] = {
    "ascendgraph/modes.py": ["tests/unit/test_modes.py", "tests/unit/test_recorded_vllm_answers.py"],
    "ascendgraph/sizes.py": ["tests/unit/test_sizes.py", "tests/unit/test_recorded_vllm_answers.py"],
    "ascendgraph/resolve.py": ["tests/unit/test_resolve.py", "tests/unit/test_rule_order.py",
                               "tests/unit/test_recorded_vllm_answers.py"],
    "ascendgraph/dispatch.py": ["tests/unit/test_dispatch.py", "tests/unit/test_recorded_vllm_answers.py"],
}

_COMPARE_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
                  ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BINOP_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.FloorDiv, ast.FloorDiv: ast.Mult,
                ast.Div: ast.Mult, ast.Mod: ast.FloorDiv}


@dataclass
class Mutant:
    module: str
    index: int
    line: int
    description: str
    status: str = "pending"  # killed | survived | timeout | invalid
    seconds: float = 0.0


def _in_docstring_or_annotation(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    current: Optional[ast.AST] = node
    while current is not None:
        parent = parents.get(current)
        if isinstance(parent, ast.Expr) and isinstance(current, ast.Constant) and isinstance(current.value, str):
            return True
        if isinstance(parent, (ast.AnnAssign, ast.arg)) and getattr(parent, "annotation", None) is current:
            return True
        if isinstance(parent, ast.FunctionDef) and parent.returns is current:
            return True
        current = parent
    return False


def _sites(tree: ast.AST) -> Iterator[tuple[ast.AST, str, str]]:
    """(node, kind, description) of every mutation site, in source order."""
    parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if _in_docstring_or_annotation(node, parents):
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _COMPARE_SWAPS:
                    yield node, f"compare:{i}", f"{type(op).__name__} -> {_COMPARE_SWAPS[type(op)].__name__}"
        elif isinstance(node, ast.BinOp) and type(node.op) in _BINOP_SWAPS:
            yield node, "binop", f"{type(node.op).__name__} -> {_BINOP_SWAPS[type(node.op)].__name__}"
        elif isinstance(node, ast.BoolOp):
            yield node, "boolop", f"{type(node.op).__name__} -> {'Or' if isinstance(node.op, ast.And) else 'And'}"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "not", "drop `not`"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, "bool", f"{node.value} -> {not node.value}"
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, "int", f"{node.value} -> {node.value + 1}"


def _mutate(source: str, index: int) -> tuple[str, int, str]:
    tree = ast.parse(source)
    for position, (node, kind, description) in enumerate(_sites(tree)):
        if position != index:
            continue
        if kind.startswith("compare:"):
            i = int(kind.split(":")[1])
            node.ops[i] = _COMPARE_SWAPS[type(node.ops[i])]()  # type: ignore[attr-defined]
        elif kind == "binop":
            node.op = _BINOP_SWAPS[type(node.op)]()  # type: ignore[attr-defined]
        elif kind == "boolop":
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()  # type: ignore[attr-defined]
        elif kind == "not":
            node.op = ast.UAdd()  # type: ignore[attr-defined]  # +x of a bool is its truth as an int
        elif kind == "bool":
            node.value = not node.value  # type: ignore[attr-defined]
        elif kind == "int":
            node.value = node.value + 1  # type: ignore[attr-defined]
        return ast.unparse(tree), getattr(node, "lineno", 0), description
    raise IndexError(index)


def count_sites(source: str) -> int:
    return sum(1 for _ in _sites(ast.parse(source)))


def _run_tests(tree_root: Path, tests: list[str], timeout: float) -> str:
    env = dict(os.environ, PYTHONPATH=str(tree_root), PYTHONDONTWRITEBYTECODE="1")
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:cacheprovider", "-p", "no:randomly",
               *[str(tree_root / t) for t in tests if (ROOT / t).exists()]]
    try:
        done = subprocess.run(command, cwd=tree_root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return "timeout"
    return "survived" if done.returncode == 0 else "killed"


def run(modules: list[str], *, max_per_module: Optional[int], timeout: float) -> list[Mutant]:
    results: list[Mutant] = []
    with tempfile.TemporaryDirectory(prefix="ascendgraph-mutants-") as scratch:
        tree_root = Path(scratch) / "tree"
        shutil.copytree(ROOT, tree_root, ignore=shutil.ignore_patterns(".git", ".venv", "__pycache__", "*.pyc",
                                                                        ".hypothesis", "mutants"))
        for module in modules:
            original = (ROOT / module).read_text(encoding="utf-8")
            total = count_sites(original)
            indices = list(range(total))
            if max_per_module is not None and total > max_per_module:
                step = total / max_per_module
                indices = sorted({int(i * step) for i in range(max_per_module)})
            target = tree_root / module
            for index in indices:
                mutated, line, description = _mutate(original, index)
                mutant = Mutant(module, index, line, description)
                try:
                    compile(mutated, module, "exec")
                except SyntaxError:
                    mutant.status = "invalid"
                    results.append(mutant)
                    continue
                target.write_text(mutated, encoding="utf-8")
                start = time.perf_counter()
                mutant.status = _run_tests(tree_root, MODULES.get(module, []), timeout)
                mutant.seconds = round(time.perf_counter() - start, 1)
                results.append(mutant)
                print(f"{module}:{line} [{index}] {description}: {mutant.status} ({mutant.seconds}s)",
                      file=sys.stderr, flush=True)
            target.write_text(original, encoding="utf-8")
    return results


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("modules", nargs="*", default=list(MODULES))
    parser.add_argument("--max", type=int, default=None, help="mutants per module (even sample)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's test run")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args(argv)
    results = run(args.modules, max_per_module=args.max, timeout=args.timeout)
    summary: dict[str, dict[str, int]] = {}
    for mutant in results:
        summary.setdefault(mutant.module, {}).setdefault(mutant.status, 0)
        summary[mutant.module][mutant.status] += 1
    for module, counts in summary.items():
        print(f"{module}: {sum(counts.values())} mutants, " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
    for mutant in results:
        if mutant.status == "survived":
            print(f"  survivor {mutant.module}:{mutant.line} {mutant.description}")
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(m) for m in results], indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
