"""Read the torch-npu wheel's API without importing it: Python sources by ``ast``, op
schemas from the op-plugin YAML, C bindings and ATB ops by name in the shared libraries.

`cached_wheel()` finds the wheel in ``$ASCENDGRAPH_CACHE_DIR/wheels`` (default
``~/.cache/ascendgraph/wheels``) or fetches it there with ``pip download --no-deps``;
`TorchNpuWheel.check(api)` returns the problems of one ``hw.api.NpuApi`` (empty = fine).
"""

from __future__ import annotations

import ast
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Iterator, Optional, Union

from ascendgraph.readers import user_cache_root
from hw.api import TORCH_NPU_VERSION, NpuApi

PACKAGE = "torch_npu"
OP_YAML = "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml"
ATB_OPS = "torch_npu/op_plugin/atb/_atb_ops.py"
ATB_LIBRARY = "torch_npu/lib/libop_plugin_atb.so"
C_LIBRARIES = ("torch_npu/lib/libtorch_npu.so", "torch_npu/lib/libnpu_profiler.so")
# The Python sources are the same in every build; pin one that exists so `pip download`
# works from any machine (this one: CPython 3.11, x86_64).
PIP_PLATFORM = ("--platform", "manylinux_2_28_x86_64", "--python-version", "3.11", "--implementation", "cp",
                "--abi", "cp311", "--only-binary=:all:")


def cache_dir() -> Path:
    # The per-test cache (conftest) would re-download the wheel for every test: downloads
    # go to the persistent cache the root conftest names.
    root = os.environ.get("ASCENDGRAPH_DOWNLOAD_CACHE_DIR") or user_cache_root()
    return Path(root) / "wheels"


def _find(directory: Path, version: str) -> Optional[Path]:
    found = sorted(directory.glob(f"torch_npu-{version}-*.whl"))
    return found[0] if found else None


@contextlib.contextmanager
def _locked(directory: Path) -> Iterator[None]:
    """One downloader at a time (pytest-xdist workers share the cache)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as handle:
        try:
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - no flock on this platform: downloads are still atomic
            pass
        yield


def cached_wheel(version: str = TORCH_NPU_VERSION, *, timeout: float = 600) -> tuple[Optional[Path], str]:
    """(path, "") from the cache or a fresh ``pip download``; (None, why) when offline."""
    directory = cache_dir()
    existing = _find(directory, version)
    if existing is not None:
        return existing, ""
    with _locked(directory):
        existing = _find(directory, version)
        if existing is not None:
            return existing, ""
        with tempfile.TemporaryDirectory(dir=directory) as staging:
            command = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "--quiet",
                       f"torch-npu=={version}", "--dest", staging, *PIP_PLATFORM]
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                return None, f"`pip download torch-npu=={version}` could not run: {exc}"
            wheel = _find(Path(staging), version)
            if done.returncode != 0 or wheel is None:
                lines = (done.stderr or done.stdout or "no output").strip().splitlines()
                return None, (f"`pip download torch-npu=={version}` failed (offline?): "
                              f"{lines[-1] if lines else 'no output'}; to run offline, put the wheel in {directory}")
            target = directory / wheel.name
            os.replace(wheel, target)  # atomic: readers never see a partial wheel
    return target, ""


# --------------------------------------------------------------------------- op schemas


@dataclass(frozen=True)
class OpSchema:
    name: str  # "npu_fused_infer_attention_score" or "...score.out"
    positional: tuple[str, ...]
    keyword_only: tuple[str, ...]
    out_arguments: tuple[str, ...]  # mutable keyword-only arguments (the out= targets)

    @property
    def names(self) -> set[str]:
        return set(self.positional) | set(self.keyword_only)


def _split_top_level(text: str) -> list[str]:
    parts, depth, current = [], 0, []
    for char in text:
        if char in "([":
            depth += 1
        elif char in ")]":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current).strip())
            current = []
        else:
            current.append(char)
    if "".join(current).strip():
        parts.append("".join(current).strip())
    return parts


_FUNC = re.compile(r"^\s*(?:-\s*)?func:\s*([A-Za-z0-9_]+(?:\.[A-Za-z0-9_]+)?)\((.*)\)\s*->")


def parse_op_schemas(yaml_text: str) -> dict[str, list[OpSchema]]:
    """name -> schemas (an op may be listed more than once) from the op-plugin YAML."""
    schemas: dict[str, list[OpSchema]] = {}
    for line in yaml_text.splitlines():
        match = _FUNC.match(line)
        if not match:
            continue
        name, arguments = match.group(1), match.group(2)
        positional: list[str] = []
        keyword_only: list[str] = []
        outs: list[str] = []
        seen_star = False
        for argument in _split_top_level(arguments):
            if argument == "*":
                seen_star = True
                continue
            declaration = argument.split("=", 1)[0].strip()
            arg_type, _, arg_name = declaration.rpartition(" ")
            (keyword_only if seen_star else positional).append(arg_name)
            if seen_star and "!" in arg_type:
                outs.append(arg_name)
        schemas.setdefault(name, []).append(OpSchema(name, tuple(positional), tuple(keyword_only), tuple(outs)))
    return schemas


# --------------------------------------------------------------------------- python resolution


@dataclass(frozen=True)
class Found:
    """What a dotted path resolves to in the wheel."""

    kind: str  # "module" | "function" | "class" | "value" | "binding"
    where: str  # wheel member (file) or library for bindings
    node: Optional[ast.AST] = None
    is_method: bool = False


class TorchNpuWheel:
    def __init__(self, path: Union[str, Path]) -> None:
        self.path = Path(path)
        self.zip = zipfile.ZipFile(self.path)
        self.members = set(self.zip.namelist())

    # -- raw content
    def text(self, member: str) -> str:
        return self.zip.read(member).decode("utf-8")

    @lru_cache(maxsize=None)
    def tree(self, member: str) -> ast.Module:
        return ast.parse(self.text(member), filename=member)

    @cached_property
    def op_schemas(self) -> dict[str, list[OpSchema]]:
        return parse_op_schemas(self.text(OP_YAML))

    @cached_property
    def atb_names(self) -> set[str]:
        names: set[str] = set()
        for node in self.tree(ATB_OPS).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("API_LIST",) for t in node.targets):
                names.update(ast.literal_eval(node.value))
        return names

    @lru_cache(maxsize=None)
    def library(self, member: str) -> bytes:
        return self.zip.read(member) if member in self.members else b""

    def library_has_symbol(self, library: str, name: str) -> bool:
        """``name`` as a NUL-terminated string: how pybind / torch.library keep names."""
        return b"\0" + name.encode() + b"\0" in self.library(library)

    def schema_strings(self, name: str) -> list[str]:
        """The schemas of op ``name`` (with its overload) as the wheel writes them: the op
        YAML's ``func:`` lines, then the strings libtorch_npu.so registers (the two can differ)."""
        found = [match.group(1) for match in re.finditer(rf"^\s*-\s*func:\s*({re.escape(name)}\(.*\)\s*->.*)$",
                                                         self.text(OP_YAML), re.M)]
        pattern = re.compile(rb"\0(" + re.escape(name.encode()) + rb"\([\x20-\x7e]*\) -> [\x20-\x7e]+)\0")
        found += [match.group(1).decode() for match in pattern.finditer(self.library(C_LIBRARIES[0]))]
        return found

    def c_binding_exists(self, name: str) -> bool:
        extensions = [m for m in self.members if m.startswith("torch_npu/_C.") and m.endswith(".so")]
        return any(self.library_has_symbol(lib, name) for lib in (*C_LIBRARIES, *extensions))

    # -- modules
    def module_member(self, dotted: str) -> Optional[str]:
        """The wheel file of a module, "<extension>" for a C extension (or a module inside
        one, like torch_npu._C._profiler), None when there is no such module."""
        base = dotted.replace(".", "/")
        for candidate in (f"{base}.py", f"{base}/__init__.py"):
            if candidate in self.members:
                return candidate
        parts = dotted.split(".")
        for end in range(len(parts), 1, -1):
            prefix = "/".join(parts[:end])
            if any(m.startswith(prefix + ".") and m.endswith(".so") for m in self.members):
                return "<extension>"
        return None

    def _module_found(self, dotted: str) -> Found:
        member = self.module_member(dotted)
        if member == "<extension>":
            return Found("binding", dotted)
        return Found("module", member or dotted)

    @staticmethod
    def _absolute(module: str, member: str, level: int, target: Optional[str]) -> str:
        if level == 0:
            return target or ""
        package = module if member.endswith("__init__.py") else module.rpartition(".")[0]
        for _ in range(level - 1):
            package = package.rpartition(".")[0]
        return f"{package}.{target}" if target else package

    def _top_level(self, tree: ast.Module) -> list[ast.stmt]:
        """Module statements, descending into if/try blocks (conditional definitions)."""
        statements: list[ast.stmt] = []
        pending = list(tree.body)
        while pending:
            node = pending.pop(0)
            statements.append(node)
            if isinstance(node, ast.If):
                pending.extend(node.body + node.orelse)
            elif isinstance(node, ast.Try):
                pending.extend(node.body + node.orelse + node.finalbody)
                for handler in node.handlers:
                    pending.extend(handler.body)
        return statements

    def find_in_module(self, module: str, name: str, _seen: Optional[set[tuple[str, str]]] = None) -> Optional[Found]:
        seen = _seen if _seen is not None else set()
        if (module, name) in seen:
            return None
        seen.add((module, name))
        member = self.module_member(module)
        if member is None:
            return None
        if member == "<extension>":
            return Found("binding", module) if self.c_binding_exists(name) else None
        tree = self.tree(member)
        star_sources: list[str] = []
        for node in self._top_level(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return Found("function", member, node)
            if isinstance(node, ast.ClassDef) and node.name == name:
                return Found("class", member, node)
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return Found("value", member, node)
            if isinstance(node, ast.ImportFrom):
                source = self._absolute(module, member, node.level, node.module)
                for alias in node.names:
                    if alias.name == "*":
                        star_sources.append(source)
                    elif (alias.asname or alias.name) == name:
                        sub = f"{source}.{alias.name}"
                        if self.module_member(sub) not in (None, "<extension>"):
                            return self._module_found(sub)
                        return self.find_in_module(source, alias.name, seen)
        submodule = f"{module}.{name}"
        if self.module_member(submodule) is not None:
            return self._module_found(submodule)
        for source in star_sources:
            found = self.find_in_module(source, name, seen)
            if found is not None:
                return found
        return None

    def python_method(self, found: Found, name: str) -> Optional[Found]:
        """A method defined in Python by the class or its Python bases (C bases ignored)."""
        assert isinstance(found.node, ast.ClassDef)
        for node in found.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return Found("function", found.where, node, is_method=not _is_static(node))
        module = found.where[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for base in found.node.bases:
            dotted = ast.unparse(base)
            if dotted.startswith("torch_npu._C") or dotted in ("object", "Generic"):
                continue
            base_found = self.resolve_name(module, dotted)
            if base_found is not None and base_found.kind == "class":
                result = self.python_method(base_found, name)
                if result is not None:
                    return result
        return None

    def find_in_class(self, found: Found, name: str) -> Optional[Found]:
        assert isinstance(found.node, ast.ClassDef)
        for node in found.node.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                return Found("function", found.where, node, is_method=not _is_static(node))
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return Found("value", found.where, node)
        module = found.where[: -len(".py")].replace("/", ".").removesuffix(".__init__")
        for base in found.node.bases:
            dotted = ast.unparse(base)
            if dotted.startswith("torch_npu._C") or dotted.split(".")[0] in ("_C",):
                # A C++ base class: its methods are bindings.
                if self.c_binding_exists(name):
                    return Found("binding", dotted)
                continue
            base_found = self.resolve_name(module, dotted)
            if base_found is not None and base_found.kind == "class":
                result = self.find_in_class(base_found, name)
                if result is not None:
                    return result
        return None

    def resolve_name(self, module: str, dotted: str) -> Optional[Found]:
        """A dotted name as seen from inside ``module`` (for base classes)."""
        head, *rest = dotted.split(".")
        found = self.find_in_module(module, head)
        for part in rest:
            found = self.step(found, part)
        return found

    def step(self, found: Optional[Found], name: str) -> Optional[Found]:
        if found is None:
            return None
        if found.kind == "module":
            module = found.where[: -len(".py")].replace("/", ".").removesuffix(".__init__") if found.where.endswith(".py") else found.where
            return self.find_in_module(module, name)
        if found.kind == "class":
            return self.find_in_class(found, name)
        if found.kind == "binding":
            return Found("binding", found.where) if self.c_binding_exists(name) else None
        return None

    def resolve(self, dotted: str) -> Optional[Found]:
        parts = dotted.split(".")
        found: Optional[Found] = Found("module", "torch_npu/__init__.py")
        for part in parts[1:]:
            found = self.step(found, part)
            if found is None:
                return None
        return found

    # -- checking one declaration
    def check(self, api: NpuApi) -> list[str]:
        if api.kind == "op":
            return self._check_op(api)
        if api.kind == "atb":
            return self._check_atb(api)
        return self._check_python(api)

    def _check_op(self, api: NpuApi) -> list[str]:
        parts = api.attribute_path
        name = parts[0] if len(parts) == 1 else f"{parts[0]}.{parts[1]}"
        schemas = self.op_schemas.get(name)
        if not schemas:
            return [f"{api.path}: no `func: {name}(...)` in {OP_YAML}"]
        problems = []
        for schema in schemas:
            allowed = schema.names | ({"out"} if schema.out_arguments else set())
            wrong = [k for k in api.keywords if k not in allowed]
            issues = []
            if wrong:
                issues.append(f"keywords {wrong} not in the schema")
            if api.positional > len(schema.positional):
                issues.append(f"{api.positional} positional arguments, the schema has {len(schema.positional)}")
            if not issues:
                return []
            problems.append(f"{api.path} ({schema.name}): " + "; ".join(issues))
        return problems

    def _check_atb(self, api: NpuApi) -> list[str]:
        name = api.attribute_path[-1]
        problems = []
        if name not in self.atb_names:
            problems.append(f"{api.path}: {name} is not in API_LIST of {ATB_OPS}")
        if not self.library_has_symbol(ATB_LIBRARY, name):
            problems.append(f"{api.path}: {ATB_LIBRARY} does not register {name}")
        return problems

    def _check_python(self, api: NpuApi) -> list[str]:
        found = self.resolve(api.path)
        if found is None:
            return [f"{api.path}: not found in the wheel's Python modules or C bindings"]
        if found.kind in ("binding", "value", "module"):
            if api.keywords:
                return [f"{api.path} is a {found.kind} ({found.where}): keywords {list(api.keywords)} cannot be checked"]
            return []
        if found.kind == "class":
            init = self.python_method(found, "__init__") or self.python_method(found, "__new__")
            if init is None:
                return [] if not api.keywords and api.positional == 0 else [
                    f"{api.path}: class without a Python __init__/__new__; cannot check its arguments"]
            return _signature_problems(api, init.node, skip_first=True)  # type: ignore[arg-type]
        return _signature_problems(api, found.node, skip_first=False)  # type: ignore[arg-type]


def _is_static(node: ast.AST) -> bool:
    return any(isinstance(d, ast.Name) and d.id == "staticmethod" for d in getattr(node, "decorator_list", []))


def _signature_problems(api: NpuApi, node: ast.FunctionDef, *, skip_first: bool) -> list[str]:
    """Keywords and positional count of a declaration against a def's parameters.

    Method calls count ``self`` as a positional (hw passes the instance first); a class
    constructor's ``self``/``cls`` is skipped.
    """
    arguments = node.args
    positional = [a.arg for a in arguments.posonlyargs + arguments.args]
    if skip_first:
        positional = positional[1:]
    names = set(positional[len(arguments.posonlyargs):]) | {a.arg for a in arguments.kwonlyargs}
    problems = []
    wrong = [k for k in api.keywords if k not in names]
    if wrong and arguments.kwarg is None:
        problems.append(f"{api.path}: keywords {wrong} are not parameters of {node.name}{_params(node)}")
    if api.positional > len(positional) and arguments.vararg is None:
        problems.append(f"{api.path}: {api.positional} positional arguments, {node.name}{_params(node)} takes {len(positional)}")
    return problems


def _params(node: ast.FunctionDef) -> str:
    return "(" + ast.unparse(node.args) + ")"
