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


# --------------------------------------------------------------------------- the simulator's facade (sim.facade)
# Every name the facade provides exists in the wheel, and every keyword it accepts is one
# the wheel accepts: code written against the facade runs against torch_npu unchanged.

import inspect  # noqa: E402

from sim.facade import kernels as facade_kernels  # noqa: E402
from sim.facade import model_kernels as facade_model_kernels  # noqa: E402
from sim.facade import npu as facade_npu  # noqa: E402
from sim.facade import profiler as facade_profiler  # noqa: E402

# libtorch_npu.so registers these names where the yaml differs (wheel notes §1.2): the
# first argument of npu_rms_norm / npu_quantize is `input`, .out takes `Tensor[] out`.
REGISTERED_RENAMES = {"npu_rms_norm": {"input"}, "npu_quantize": {"input"},
                      "npu_fused_infer_attention_score.out": {"out"},
                      "npu_fused_infer_attention_score_v2.out": {"out"}}
ATB_KERNELS = ("_npu_reshape_and_cache", "_npu_rotary_embedding", "_npu_paged_attention",
               "_npu_paged_attention_get_workspace")
# What the facade adds for tests: not torch_npu names, and never reached by code under test.
FACADE_ONLY = {"sim_graph"}


def _facade_api(path: str, function: object, *, constructor: bool = False) -> NpuApi:
    """An NpuApi declaring every parameter of a facade function as hw would pass it
    (``self`` counts as a positional argument of a method, not of a constructor)."""
    parameters = list(inspect.signature(function).parameters.values())[1 if constructor else 0:]
    names = tuple(p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                  and not p.name.startswith("_"))
    positional = sum(1 for p in parameters if p.kind == p.POSITIONAL_OR_KEYWORD)
    return NpuApi(path, positional, names)


def _facade_npu_apis() -> list[NpuApi]:
    found = []
    for name in facade_npu.__all__:
        value = getattr(facade_npu, name)
        path = f"torch_npu.npu.{name}"
        if inspect.isclass(value):
            found.append(_facade_api(path, value.__init__, constructor=True) if name != "ExternalEvent" else NpuApi(path))
            for member, method in vars(value).items():
                if member.startswith("_") or member in FACADE_ONLY or isinstance(method, property):
                    continue
                if callable(method):
                    found.append(_facade_api(f"{path}.{member}", method))
        else:
            found.append(_facade_api(path, value))
    return found


def _without_self(api: NpuApi) -> NpuApi:
    keywords = tuple(k for k in api.keywords if k not in ("self", "cls"))
    return NpuApi(api.path, api.positional, keywords)


@pytest.mark.parametrize("declared", _facade_npu_apis(), ids=lambda a: a.path)
def test_every_facade_name_in_torch_npu_npu_exists_in_the_wheel_with_its_keywords(
    wheel: TorchNpuWheel, declared: NpuApi
) -> None:
    if declared.path.endswith("ExternalEvent"):
        assert wheel.resolve(declared.path) is not None
        return
    problems = wheel.check(_without_self(declared))
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("name", sorted({**facade_kernels.SCHEMAS, **facade_model_kernels.SCHEMAS}))
def test_every_facade_kernel_exists_in_the_wheel_and_its_keywords_are_schema_keywords(
    wheel: TorchNpuWheel, name: str
) -> None:
    if name in ATB_KERNELS:
        assert name in wheel.atb_names
        return
    import torch

    facade_model_kernels.register()
    base, _, overload = name.partition(".")
    schema = getattr(getattr(torch.ops.npu_facade, base), overload or "default")._schema
    keywords = {a.name for a in schema.arguments}
    wheel_schemas = wheel.op_schemas.get(name)
    assert wheel_schemas, f"{name} is not an op of the wheel"
    allowed = set().union(*(s.names for s in wheel_schemas)) | REGISTERED_RENAMES.get(name, set())
    assert keywords <= allowed, sorted(keywords - allowed)


@pytest.mark.parametrize("name", sorted(set(facade_kernels.SCHEMAS) - set(ATB_KERNELS)))
def test_every_facade_kernel_has_a_schema_of_the_wheel_verbatim(wheel: TorchNpuWheel, name: str) -> None:
    # The op YAML's or the registered one (.out: the YAML's Tensor(a!) attention_out, Tensor(b!)
    # softmax_lse; the registered Tensor[] out is the FacadeOpPacket's calling convention).
    import torch

    ours = str(torch._C.parse_schema(name + facade_kernels.SCHEMAS[name]))
    theirs = {str(torch._C.parse_schema(text)) for text in wheel.schema_strings(name)}
    assert theirs, f"{name}: no schema in the wheel"
    assert ours in theirs, f"{ours}\nis none of\n" + "\n".join(sorted(theirs))


def test_the_out_overloads_take_the_registered_out_list_and_the_yaml_keywords() -> None:
    import torch

    from sim import facade

    facade.install(quiet=True)
    try:
        import torch_npu

        query = torch.randn(2, 2, 16).bfloat16().npu()
        cache = torch.randn(2, 128, 32).bfloat16().npu()

        def call(**outs: object) -> tuple:
            return torch_npu.npu_fused_infer_attention_score.out(
                query, cache, cache, actual_seq_lengths=[1, 2], actual_seq_lengths_kv=[3, 5],
                block_table=torch.tensor([[0], [1]], dtype=torch.int32, device="npu"), num_heads=2,
                num_key_value_heads=2, input_layout="TND", block_size=128, scale=0.25, **outs)

        attention_out, lse = torch.empty(2, 2, 16, dtype=torch.bfloat16, device="npu"), torch.empty(1, device="npu")
        listed = call(out=[attention_out, lse])
        assert listed[0] is attention_out and listed[1] is lse  # returns the out tensors, as registered
        again = torch.empty_like(attention_out)
        named = call(attention_out=again, softmax_lse=torch.empty(1, device="npu"))
        assert named[0] is again and torch.equal(again, attention_out)
    finally:
        facade.uninstall()


def test_every_facade_module_level_name_exists_in_the_wheel(wheel: TorchNpuWheel) -> None:
    from sim.facade.modules import FACADE_MARK, NPU_DTYPE_CODES, facade_modules

    top = facade_modules()["torch_npu"]
    missing = []
    for name in vars(top):
        if name.startswith("__") or name == FACADE_MARK:
            continue
        if name in facade_kernels.SCHEMAS or name in facade_model_kernels.SCHEMAS or name in ATB_KERNELS:
            continue  # checked above
        if name in NPU_DTYPE_CODES:  # C-level dtypes: checked against the wheel's code map below
            continue
        if wheel.resolve(f"torch_npu.{name}") is None and name not in wheel.op_schemas:
            missing.append(name)
    for name in ("_weak_ref_tensor", "_NPUTaskGroupHandle"):
        if not wheel.c_binding_exists(name):
            missing.append(f"_C.{name}")
    for name in facade_profiler.__all__[:-1]:
        if wheel.resolve(f"torch_npu.profiler.{name}") is None:
            missing.append(f"profiler.{name}")
    assert not missing, missing


def test_the_facade_npu_dtypes_are_the_wheels_codes(wheel: TorchNpuWheel) -> None:
    """torch_npu.hifloat8 & co. are C-level names; their codes are in the wheel's meta map."""
    from sim.facade.modules import NPU_DTYPE_CODES

    tree = wheel.tree("torch_npu/op_plugin/meta/_meta_registrations.py")
    table = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", "") == "TORCH_NPU_DTYPE_TO_STRING_MAP" for t in node.targets))
    assert {f"torch_npu.{name}": code for name, code in NPU_DTYPE_CODES.items()} == {v: k for k, v in table.items()}


def test_every_name_the_facade_adds_to_torch_npu_npu_exists_in_the_wheel(wheel: TorchNpuWheel) -> None:
    from sim.facade.modules import NPU_MODULE_EXTRAS

    missing = [name for name in NPU_MODULE_EXTRAS if wheel.resolve(f"torch_npu.npu.{name}") is None]
    assert not missing, missing


def test_the_names_the_facade_adds_to_torch_distributed_are_torch_npus(wheel: TorchNpuWheel) -> None:
    """torch_npu aliases these onto torch.distributed when imported (_PUBLIC_API_ALIASES in
    torch_npu/_init/patches/distributed_patches.py); the facade's C-level placeholders are
    bindings of the wheel's extension."""
    from sim.facade.modules import C_DISTRIBUTED_PLACEHOLDERS, TORCH_DISTRIBUTED_ALIASES

    text = wheel.text("torch_npu/_init/patches/distributed_patches.py")
    for name in TORCH_DISTRIBUTED_ALIASES:
        assert wheel.resolve(f"torch_npu.distributed.{name}") is not None, name
        assert f'"distributed.{name}"' in text, name
    for name in C_DISTRIBUTED_PLACEHOLDERS:
        assert wheel.c_binding_exists(name), name


def test_a_placeholder_says_the_simulator_does_not_model_it() -> None:
    from sim.facade.modules import PLACEHOLDERS, facade_modules

    top = facade_modules()["torch_npu"]
    for name in PLACEHOLDERS:
        with pytest.raises(NotImplementedError, match=rf"^torch_npu\.{name} is not modelled by the simulator"):
            getattr(top, name)(1, key=2)


def test_every_api_hw_declares_resolves_on_the_facade() -> None:
    from sim.facade.modules import torch_npu_module

    npu = api.TorchNpu(torch_npu_module())
    missing = [a.path for a in APIS if not npu.has(a)]
    assert not missing, f"hw/api.py declares names the facade does not provide: {missing}"


# The op-doc lines the fused attention's rules cite (ascendgraph/kernel_contracts/) and a few words
# each must hold: which Q_S branch a line sits in decides whom its rule applies to.
OP_DOCS = "torch_npu/_op_plugin_docs.py"
FIA_CITED_LINES = {
    8064: ("T表示", "D=H/N"),  # tnd_query_rank and _head_dim: the layout letters, D = H/N
    8201: ("当Q_S大于1时",),  # the Q_S > 1 branch opens
    8204: ("D轴小于等于512", "BSH"),  # head_dim_limit (Q_S > 1)
    8210: ("D轴需16对齐", "32对齐"),  # head_dim_16_aligned
    8220: ("(blocknum, blocksize, H)", "65535", "(blocknum, KV_N, blocksize, D)"),  # kv_hidden_limit (Q_S > 1)
    8224: ("query为int8",),  # query_dtype (Q_S > 1, page attention)
    8269: ("当Q_S等于1时",),  # the Q_S == 1 branch opens
    8271: ("D轴小于等于512",),  # head_dim_limit (Q_S == 1)
    8272: ("均为int8",),  # query_dtype (Q_S == 1)
    8280: ("16对齐", "int8时需要32对齐"),  # paged_block_size (Q_S == 1)
    8287: ("(blocknum, blocksize, H)", "64k"),  # kv_hidden_limit (Q_S == 1)
}
FIA_RULE_LINES = {
    "tnd_query_rank": (8064,), "head_dim_16_aligned": (8210, 8201), "head_dim_limit": (8204, 8271),
    "kv_hidden_limit": (8220, 8287), "query_dtype": (8224, 8272), "paged_block_size": (8280,),
}


def test_the_attention_rules_cite_op_doc_lines_that_say_what_the_rules_check(wheel: TorchNpuWheel) -> None:
    from ascendgraph import kernel_contracts as kc

    lines = wheel.text(OP_DOCS).splitlines()
    for number, words in FIA_CITED_LINES.items():
        assert all(word in lines[number - 1] for word in words), (number, lines[number - 1][:120])
    sources = {rule.name: rule.source for rule in kc.rules_for(kc.FIA)}
    for name, cited in FIA_RULE_LINES.items():
        for number in cited:
            assert f":{number}" in sources[name] or f", {number}" in sources[name], (name, number, sources[name])
