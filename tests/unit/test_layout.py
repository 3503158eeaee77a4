"""docs/ARCHITECTURE.md: the core (`ascendgraph/`) never imports `sim`, `hw` or `torch_npu`; it
reaches the backends through the `ascendgraph.devices` entry points only."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ascendgraph.device import check_device_options
from ascendgraph.errors import ConfigError

CORE = Path(__file__).resolve().parents[2] / "ascendgraph"
FORBIDDEN = {"sim", "hw", "torch_npu"}


def _imported_roots(tree: ast.AST) -> set[str]:
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_the_core_never_imports_a_backend_or_torch_npu():
    offenders = {
        str(path.relative_to(CORE.parent)): sorted(_imported_roots(ast.parse(path.read_text(encoding="utf-8"))) & FORBIDDEN)
        for path in CORE.rglob("*.py")
    }
    assert {path: roots for path, roots in offenders.items() if roots} == {}


def test_backend_options_are_checked_through_the_registry_without_a_device():
    check_device_options("sim", profile="A3", faults="capture_begin=1*off->raise(207008)")
    check_device_options("sim", profile={"base": "A2", "stream_limit": 64})
    with pytest.raises(ConfigError, match="unknown site"):
        check_device_options("sim", faults="bogus=1")
    with pytest.raises(ConfigError, match="stream_limit"):
        check_device_options("sim", profile={"base": "A2", "stream_limit": 0})


# --------------------------------------------------------------------------- layers (docs/ARCHITECTURE.md)

RULES_MODULES = ("modes", "config", "sizes", "resolve", "dispatch")
LINE_LIMIT = 600
# Files allowed over LINE_LIMIT, each with the reason; everything else outside tests/ stays under it.
LONG_FILES: dict[str, str] = {
    "ascendgraph/resolve.py": "the resolution pipeline is one ordered sequence of rules; a split "
                              "is planned with the next rule change",
    "hw/kernels.py": "the torch_npu kernel table grew past the limit with the task-group and stale-"
                     "parameter rules; to be split (launchers / reference fallbacks) by its owner",
}
REPO = CORE.parent


def _imported_modules(path: Path) -> set[str]:
    """Every module a file imports (absolute names; relative imports resolved), lazy ones included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def _offenders(paths: list[Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for path in paths:
        bad = sorted(m for m in _imported_modules(path) if any(m == f or m.startswith(f + ".") for f in forbidden))
        if bad:
            found[str(path.relative_to(REPO))] = bad
    return found


def test_the_rules_modules_import_neither_the_cli_nor_the_tools_nor_the_runtime():
    paths = [CORE / f"{name}.py" for name in RULES_MODULES]
    assert all(path.is_file() for path in paths)
    forbidden = ("ascendgraph.cli", "ascendgraph.tools", "ascendgraph.runtime")
    assert _offenders(paths, forbidden) == {}


# The building blocks below the runtime: the forward context (vLLM: vllm/forward_context.py), the
# models, the compile backend with its graph wrapper (vLLM: vllm/compilation/cuda_graph.py), the
# xlite routing rules, the device protocol and the Ascend profile formats (the backends write them
# too). None of them may reach up into the engine.
BELOW_THE_RUNTIME = ("forward_context.py", "xlite.py", "models", "compile", "device.py", "profile_formats.py")


def _below_the_runtime() -> list[Path]:
    paths = []
    for name in BELOW_THE_RUNTIME:
        target = CORE / name
        paths.extend(sorted(target.rglob("*.py")) if target.is_dir() else [target])
    return paths


def test_the_rules_the_models_and_compile_never_import_the_runtime():
    paths = [CORE / f"{name}.py" for name in RULES_MODULES] + _below_the_runtime()
    assert all(path.is_file() for path in paths) and len(paths) > 20
    forbidden = ("ascendgraph.runtime", "ascendgraph.cli", "ascendgraph.tools", "ascendgraph.api")
    assert _offenders(paths, forbidden) == {}


def test_the_forward_context_sits_below_the_models_and_the_graph_wrapper():
    # The models and the wrappers read it; it names neither (FullGraphParams is its own protocol).
    assert _offenders([CORE / "forward_context.py"], ("ascendgraph.models", "ascendgraph.compile")) == {}


def test_moved_modules_stay_importable_under_their_old_names_as_the_same_module():
    import importlib

    from ascendgraph.moved_modules import MOVED_MODULES

    for old, (new, reason) in MOVED_MODULES.items():
        assert reason.strip()
        old_file = REPO.joinpath(*old.split(".")).with_suffix(".py")
        assert not old_file.exists(), f"{old_file} is back: remove {old} from MOVED_MODULES or the file"
        moved = importlib.import_module(new)
        assert importlib.import_module(old) is moved  # one module: monkeypatching either name patches both
        assert moved.__spec__.name == new and moved.__name__ == new


def test_the_runtime_never_imports_the_command_line_and_the_tools_only_its_shared_flags():
    runtime = list((CORE / "runtime").rglob("*.py"))
    tools = list((CORE / "tools").rglob("*.py"))
    assert len(runtime) > 10 and len(tools) > 20
    assert _offenders(runtime, ("ascendgraph.cli",)) == {}
    # Scenario files describe configurations in vLLM's flag spelling: the tools may reuse those
    # flag definitions (ascendgraph.cli.args), nothing else of the command line.
    beyond_args = {
        path: [m for m in modules if m != "ascendgraph.cli.args" and not m.startswith("ascendgraph.cli.args.")]
        for path, modules in _offenders(tools, ("ascendgraph.cli",)).items()
    }
    assert {path: modules for path, modules in beyond_args.items() if modules} == {}


def test_the_import_checker_sees_lazy_and_relative_imports(tmp_path):
    probe = CORE / "tools" / "_layout_probe.py"
    try:
        probe.write_text("def f():\n    from ascendgraph.cli.app import main\n    from ..cli import args\n")
        assert _offenders([probe], ("ascendgraph.cli",)) == {
            "ascendgraph/tools/_layout_probe.py": ["ascendgraph.cli", "ascendgraph.cli.app", "ascendgraph.cli.app.main",
                                                   "ascendgraph.cli.args"],
        }
    finally:
        probe.unlink()


def test_every_subcommand_is_a_module_of_the_cli_package():
    from ascendgraph.cli.app import commands

    listed = commands()
    assert [c.name for c in listed] == ["explain", "run", "plan", "scenario", "profile", "doctor", "diagnose"]
    for command in listed:
        assert command.run.__module__ == f"ascendgraph.cli.{command.name}", command.name


def _source_files() -> list[Path]:
    roots = [CORE, REPO / "sim", REPO / "hw", REPO / "bench", REPO / "scripts"]
    files = [path for root in roots if root.is_dir() for path in root.rglob("*.py")]
    return [*files, REPO / "conftest.py"]


def test_every_long_file_listed_exists():
    assert [name for name in LONG_FILES if not (REPO / name).is_file()] == []


def test_no_file_outside_tests_is_longer_than_the_limit_unless_listed_with_a_reason():
    too_long = {}
    for path in _source_files():
        lines = len(path.read_text(encoding="utf-8").splitlines())
        name = str(path.relative_to(REPO))
        if lines > LINE_LIMIT and name not in LONG_FILES:
            too_long[name] = lines
    assert too_long == {}, f"split these (or list them in LONG_FILES with a reason): {too_long}"
    assert all(reason.strip() for reason in LONG_FILES.values())


# --------------------------------------------------------------------------- the kernel-contract table

# ascendgraph/kernel_contracts/: a module per kernel family, and the kernels whose rules it holds.
CONTRACT_FAMILIES: dict[str, set[str]] = {
    "fused_attention": {"npu_fused_infer_attention_score"},
    "fused_attention_v2": {"npu_fused_infer_attention_score_v2"},
    "paged_attention": {"ascendgraph::paged_attention", "_npu_paged_attention"},
    "kv_cache": {"_npu_reshape_and_cache", "npu_scatter_pa_kv_cache"},
    "norms": {"npu_rms_norm", "npu_add_rms_norm"},
    "quantisation": {"npu_dynamic_quant", "npu_quantize", "npu_add_rms_norm_quant",
                     "npu_add_rms_norm_dynamic_quant"},
    "model_layers": {"_npu_rotary_embedding", "npu_mrope", "npu_swiglu"},
    "moe": {"npu_moe_gating_top_k", "_C_ascend::moe_gating_top_k", "npu_moe_init_routing_v2", "npu_grouped_matmul",
            "npu_moe_token_unpermute"},
}


def test_the_kernel_contract_table_is_a_module_per_kernel_family():
    import importlib

    from ascendgraph import kernel_contracts
    from ascendgraph.kernel_contracts.common import KernelRule

    assert not (CORE / "kernel_contracts.py").exists()
    home: dict[int, str] = {}
    for family, kernels in CONTRACT_FAMILIES.items():
        module = importlib.import_module(f"ascendgraph.kernel_contracts.{family}")
        rules = [rule for value in vars(module).values() if isinstance(value, tuple)
                 for rule in value if isinstance(rule, KernelRule)]
        assert {rule.kernel for rule in rules} == kernels, family
        home.update({id(rule): family for rule in rules})
    homeless = [f"{rule.kernel} {rule.name}" for rule in kernel_contracts.RULES if id(rule) not in home]
    assert homeless == [], "every rule lives in the module of its kernel family"
    assert set(kernel_contracts.KERNELS) == set().union(*CONTRACT_FAMILIES.values())


# --------------------------------------------------------------------------- sim/ as components (docs/simulator.md)

DEVICE_NAMES = {"device", "_device", "dev", "sim_device"}
SIM_COMPONENTS = ("memory", "pools", "queues", "stream_order", "clock", "tracing", "budget", "capturing", "replay",
                  "task_groups", "pool_memory", "pool_checks")


def _private_device_accesses(path: Path) -> list[str]:
    """``<something>.device._name`` and ``device._name``: a private part of a device, reached from outside it."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")):
            continue
        base = node.value
        name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else None
        if name in DEVICE_NAMES:
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_device_reaches_into_a_devices_private_parts():
    paths = [path for root in ("sim", "hw", "ascendgraph") for path in sorted((REPO / root).rglob("*.py"))
             if path != REPO / "sim" / "device.py"]
    assert len(paths) > 100
    assert [hit for path in paths for hit in _private_device_accesses(path)] == []


def test_the_simulated_device_is_assembled_from_components_not_mixins():
    from sim.device import SimDevice

    assert SimDevice.__mro__ == (SimDevice, object)
    device = SimDevice()
    for attribute, module in (("memory", "sim.memory"), ("pools", "sim.pools"), ("queues", "sim.queues"),
                              ("virtual_clock", "sim.clock"), ("trace", "sim.tracing"), ("ledger", "sim.budget"),
                              ("captures", "sim.capturing"), ("replays", "sim.replay"),
                              ("task_groups", "sim.task_groups")):
        assert type(getattr(device, attribute)).__module__ == module, attribute
    for name in SIM_COMPONENTS:
        docstring = ast.get_docstring(ast.parse((REPO / "sim" / f"{name}.py").read_text(encoding="utf-8"))) or ""
        assert "Theory of operation" in docstring, f"sim/{name}.py needs a theory-of-operation docstring"


# --------------------------------------------------------------------------- backends below the runtime


def test_the_backends_never_import_the_runtime():
    # sim/ and hw/ implement the device layer; what they share with the runtime (the profile
    # formats, the device protocol, the ops) sits below both (docs/ARCHITECTURE.md "Layers").
    backends = [path for root in ("sim", "hw") for path in sorted((REPO / root).rglob("*.py"))]
    assert len(backends) > 30
    assert _offenders(backends, ("ascendgraph.runtime", "ascendgraph.cli", "ascendgraph.tools")) == {}


# --------------------------------------------------------------------------- the engine's stages

RUNTIME = CORE / "runtime"
STAGES = RUNTIME / "stages"


def _engine_and_stages() -> list[Path]:
    return [RUNTIME / "engine.py", *sorted(STAGES.glob("*.py"))]


def _private_reaches(path: Path) -> list[str]:
    """Where a file reaches into another object's or module's privates: ``x._name`` for any
    receiver but ``self`` / ``cls`` (dunders aside), and ``from m import _name`` of the runtime."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            name = node.attr
            private = name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            own = isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")
            if private and not own:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ascendgraph.runtime"):
            found += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names
                      if a.name.startswith("_")]
    return found


def test_no_stage_reaches_into_another_stage_or_the_engine():
    # Each stage is an object: what it needs comes through its constructor, what it offers are
    # its public methods (ascendgraph/runtime/engine.py "Theory of operation").
    paths = _engine_and_stages()
    assert len(paths) > 7
    reaches = {str(p.relative_to(REPO)): found for p in paths if (found := _private_reaches(p))}
    assert reaches == {}


def test_stages_are_composed_not_inherited():
    from ascendgraph.runtime import engine
    from ascendgraph.runtime.stages import capture, check, forward, report, serve

    stages = [capture.CaptureStage, check.CheckStage, forward.ForwardPlumbing, report.ReportStage, serve.ServeStage]
    assert engine.Engine.__bases__ == (object,)
    assert {stage: stage.__bases__ for stage in stages} == {stage: (object,) for stage in stages}


def test_the_engine_only_composes_its_stages():
    # Engine.__init__ builds the state and the stages and hands each what it needs: nothing else.
    tree = ast.parse((RUNTIME / "engine.py").read_text(encoding="utf-8"))
    engine = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Engine")
    init = next(node for node in engine.body if isinstance(node, ast.FunctionDef) and node.name == "__init__")
    assert init.end_lineno is not None and init.end_lineno - init.lineno + 1 < 60


def test_the_stages_never_import_the_engine():
    assert _offenders(sorted(STAGES.glob("*.py")), ("ascendgraph.runtime.engine",)) == {}


def _runtime_import_cycles() -> list[list[str]]:
    modules = {
        ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): path
        for path in RUNTIME.rglob("*.py")
    }
    graph = {name: sorted(m for m in _imported_modules(path) if m in modules and m != name)
             for name, path in modules.items()}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(name: str) -> None:
        state[name] = 1
        stack.append(name)
        for other in graph[name]:
            if state.get(other) == 1:
                cycles.append(stack[stack.index(other):] + [other])
            elif other not in state:
                visit(other)
        stack.pop()
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return cycles


def test_the_runtime_has_no_import_cycles():
    # Lazy and TYPE_CHECKING imports count: a cycle hidden behind either is still one to untangle.
    assert _runtime_import_cycles() == []


def test_the_stage_checks_see_a_planted_violation(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text(
        "from ascendgraph.runtime.stages.capture import _helper\n"
        "class ServeStage:\n"
        "    def step(self, batch):\n"
        "        self.check._judge(batch)\n"
        "        return self._own(batch)\n"
    )
    assert _private_reaches(planted) == [
        "line 1: from ascendgraph.runtime.stages.capture import _helper", "line 4: self.check._judge",
    ]


# --------------------------------------------------------------------------- type checking (docs/decisions.md)


def test_every_type_ignore_names_its_error_code_and_says_why():
    import re

    ignore = re.compile(r"#\s*type:\s*ignore(?P<code>\[[a-z, -]+\])?(?P<rest>.*)$")
    bare = {}
    for root in ("ascendgraph", "sim", "hw"):
        for path in sorted((REPO / root).rglob("*.py")):
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                found = ignore.search(line)
                if found and (not found.group("code") or not re.match(r"\s+#\s*\S", found.group("rest"))):
                    bare[f"{path.relative_to(REPO)}:{number}"] = line.strip()
    assert bare == {}, "write `# type: ignore[code]  # why`"


def test_the_type_checker_is_configured_as_decided():
    import tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["mypy"]
    assert config["files"] == ["ascendgraph", "ascendgraph_npu_facade", "sim", "hw"]
    assert config["check_untyped_defs"] and config["disallow_incomplete_defs"] and config["warn_unused_ignores"]
    assert "ignore_missing_imports" not in config, "only per module, for torch_npu and vllm"
    missing_ok = [o for o in config.get("overrides", []) if o.get("ignore_missing_imports")]
    assert {m.split(".")[0] for o in missing_ok for m in o["module"]} == {"torch_npu", "vllm"}
    assert "typecheck:" in (REPO / "Makefile").read_text() and "make typecheck" in (REPO / ".ci" / "run").read_text()


# Standard-library modules newer than some Python 3 the project could claim, with the version
# that added them: requires-python must not promise a Python the code cannot import on.
NEW_STDLIB_MODULES = {"tomllib": (3, 11), "graphlib": (3, 9), "zoneinfo": (3, 9)}


def test_requires_python_admits_only_pythons_the_code_runs_on():
    import re
    import tomllib

    spec = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["requires-python"]
    found = re.fullmatch(r">=\s*(\d+)\.(\d+)", spec)
    assert found, f"requires-python {spec!r}: state the lowest version as >=X.Y"
    lowest = (int(found.group(1)), int(found.group(2)))
    files = [path for root in ("ascendgraph", "sim", "hw") for path in sorted((REPO / root).rglob("*.py"))]
    imported = {module.split(".")[0] for path in files for module in _imported_modules(path)}
    needed = {name: version for name, version in NEW_STDLIB_MODULES.items() if name in imported}
    assert "tomllib" in needed
    assert {name: version for name, version in needed.items() if version > lowest} == {}

