"""The kernel-contract table: every rule refuses its violation and accepts its boundary case."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any, Sequence

import pytest
import torch

from ascendgraph import kernel_contracts as kc
from ascendgraph.errors import KernelContractError
from ascendgraph.kernel_calls import CHECKED_OPS, KernelCall, check_op, kernel_calls
from ascendgraph.kernel_contracts.fused_attention import _head_dim
from ascendgraph.testing.contract_cases import CONTRACT_CASES, missing_cases

CPU = torch.device("cpu")
CASES = sorted(CONTRACT_CASES)


def test_every_rule_has_a_case_and_a_source() -> None:
    assert missing_cases() == []
    names = [(rule.kernel, rule.name) for rule in kc.RULES]
    assert len(names) == len(set(names)), "rule ids must be unique per kernel"
    for rule in kc.RULES:
        assert rule.source.strip(), rule
        assert rule.name == rule.name.lower() and " " not in rule.name


def _source_lines(function) -> set[int]:
    return {line for _, _, line in function.__code__.co_lines() if line is not None}


def test_every_rule_predicate_is_a_one_line_lambda_or_a_named_documented_function() -> None:
    # A rule reads as data: a predicate longer than a line gets a name and says what it checks.
    offenders = []
    for rule in kc.RULES:
        for role in ("applies", "holds"):
            function = getattr(rule, role)
            if function.__name__ == "<lambda>":
                if len(_source_lines(function)) > 1:
                    offenders.append(f"{rule.kernel} {rule.name}: {role} is a lambda over several lines")
            elif not (function.__doc__ or "").strip():
                offenders.append(f"{rule.kernel} {rule.name}: {role} {function.__name__} has no docstring")
    assert offenders == []


def _defined_public_names(path: Path) -> set[str]:
    """The public names a module defines at its top level (assignments, functions, classes)."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(target.id for target in targets if isinstance(target, ast.Name))
    return {name for name in names if not name.startswith("_")}


def test_every_public_name_of_the_family_modules_is_imported_from_the_package() -> None:
    # Callers import from ``ascendgraph.kernel_contracts`` only; the modules are its layout.
    package = Path(kc.__file__).parent
    defined = {name: path.stem for path in sorted(package.glob("*.py")) if path.stem != "__init__"
               for name in _defined_public_names(path)}
    assert len(defined) > 40
    assert {name: module for name, module in defined.items() if name not in kc.__all__} == {}
    assert [name for name in kc.__all__ if not hasattr(kc, name)] == []
    assert kc.KernelContractError is KernelContractError and kc.block_size_problem is not None


@pytest.mark.parametrize("kernel,rule", CASES, ids=[f"{k}-{r}" for k, r in CASES])
def test_rule_refuses_violation(kernel: str, rule: str) -> None:
    args = CONTRACT_CASES[(kernel, rule)].violate(CPU)
    broken = [r.name for r in kc.violations(kernel, args)]
    assert rule in broken


@pytest.mark.parametrize("kernel,rule", CASES, ids=[f"{k}-{r}" for k, r in CASES])
def test_rule_accepts_boundary(kernel: str, rule: str) -> None:
    args = CONTRACT_CASES[(kernel, rule)].boundary(CPU)
    broken = [r.name for r in kc.violations(kernel, args)]
    assert rule not in broken


def test_base_calls_are_fully_valid() -> None:
    for kernel in kc.KERNELS:
        for case in (c for c in CONTRACT_CASES.values() if c.kernel == kernel and c.boundary.__name__.startswith("_")):
            assert kc.violations(kernel, case.boundary(CPU)) == [], (kernel, case.rule)


def test_check_names_rule_values_and_source() -> None:
    args = CONTRACT_CASES[(kc.FIA, "tnd_tokens_equal_last_end")].violate(CPU)
    with pytest.raises(KernelContractError) as info:
        kc.check(kc.FIA, args)
    text = str(info.value)
    assert "tnd_tokens_equal_last_end" in text and "T=5" in text and "actual_seq_lengths[-1]=4" in text
    assert "PR #6357" in text
    assert info.value.kernel == kc.FIA and "tnd_tokens_equal_last_end" in info.value.rules
    assert isinstance(info.value, RuntimeError)


def test_overloads_share_the_base_rules() -> None:
    args = CONTRACT_CASES[(kc.FIA, "block_table_rows")].violate(CPU)
    for name in (kc.FIA, f"{kc.FIA}.out", "_npu_fused_infer_attention_score_get_max_workspace"):
        assert "block_table_rows" in [r.name for r in kc.violations(name, args)]
    assert kc.violations("no_such_kernel", args) == []


def _attention_args(tokens: int, ends: list[int], kv: list[int], rows: int, dtype=torch.bfloat16, block_size=128):
    query = torch.zeros(tokens, 4, 16, dtype=dtype)
    cache = torch.zeros(8, block_size, 2, 16, dtype=dtype)
    table = torch.zeros(rows, 4, dtype=torch.int32)
    return (query, cache, cache.clone(), table, ends, kv, 0.25, torch.zeros_like(query))


def test_paged_attention_maps_like_hw_eager_slices_graph_does_not() -> None:
    args = _attention_args(8, [3, 5], [3, 18], rows=2)
    eager = kernel_calls("paged_attention", args, in_graph=False)
    assert [c.kernel for c in eager] == [kc.PAGED_ATTENTION_OP, kc.FIA]
    assert eager[1].arguments["query"].shape[0] == 5  # hw passes only the real tokens eagerly
    assert eager[1].arguments["key"].shape == (8, 128, 32) and eager[1].arguments["block_size"] == 128
    check_op("paged_attention", args, in_graph=False)
    with pytest.raises(KernelContractError, match="tnd_tokens_equal_last_end"):
        check_op("paged_attention", args, in_graph=True)
    # FULL padding: a dummy request ends at T, with KV length 0 and its own block-table row.
    check_op("paged_attention", _attention_args(8, [3, 5, 8], [3, 18, 0], rows=3), in_graph=True)


def test_paged_attention_block_table_rows_and_block_size() -> None:
    with pytest.raises(KernelContractError, match="block_table_rows"):
        check_op("paged_attention", _attention_args(5, [3, 5], [3, 18], rows=4), in_graph=False)
    with pytest.raises(KernelContractError, match="paged_block_size"):
        check_op("paged_attention", _attention_args(5, [3, 5], [3, 18], rows=2, block_size=8), in_graph=False)
    with pytest.raises(KernelContractError, match="query_dtype"):
        check_op("paged_attention", _attention_args(5, [3, 5], [3, 18], rows=2, dtype=torch.float32), in_graph=False)
    check_op("paged_attention", _attention_args(5, [3, 5], [3, 18], rows=2, dtype=torch.float32), in_graph=False,
             lenient=kc.FLOAT32_LENIENT_RULES)


def test_check_op_remembers_a_passed_call_by_what_the_rules_read() -> None:
    # ascendgraph.kernel_calls.check_op skips the rules for a call whose metadata passed before:
    # each thing a rule reads (contiguity, dtype, host lists, leniency, graph or eager) is in the key.
    args = _attention_args(5, [3, 5], [3, 18], rows=2)
    check_op("paged_attention", args, in_graph=False)
    check_op("paged_attention", _attention_args(5, [3, 5], [3, 18], rows=2), in_graph=False)  # remembered
    query = torch.zeros(4, 5, 16, dtype=torch.bfloat16).transpose(0, 1)  # the same shape, not contiguous
    with pytest.raises(KernelContractError, match="query_contiguous"):
        check_op("paged_attention", (query, *args[1:]), in_graph=False)
    with pytest.raises(KernelContractError, match="block_table_columns"):
        check_op("paged_attention", (*args[:5], [3, 600], *args[6:]), in_graph=False)  # a longer KV: more blocks
    relaxed = _attention_args(5, [3, 5], [3, 18], rows=2, dtype=torch.float32)
    check_op("paged_attention", relaxed, in_graph=False, lenient=kc.FLOAT32_LENIENT_RULES)
    with pytest.raises(KernelContractError, match="query_dtype"):
        check_op("paged_attention", relaxed, in_graph=False)


def test_check_op_remembers_no_call_of_a_kernel_whose_rules_read_values(monkeypatch: pytest.MonkeyPatch) -> None:
    # The MoE kernels' index rules read values (kc.VALUE_READING_KERNELS): two calls with the
    # same metadata can differ in validity, so a passed one must not be remembered. No
    # ascendgraph op maps onto them today; the op mapping is swapped here to make one that does.
    from ascendgraph import kernel_calls

    def unpermute(indices: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.zeros(4, 8, dtype=torch.bfloat16), indices)

    def as_unpermute(op: str, args: Sequence[Any], **_: Any) -> list[KernelCall]:
        tokens, indices = args
        return [KernelCall(kc.TOKEN_UNPERMUTE, {"permuted_tokens": tokens, "sorted_indices": indices, "probs": None,
                                                 "padded_mode": False})]

    monkeypatch.setattr(kernel_calls, "kernel_calls", as_unpermute)
    in_range, past_the_rows = torch.tensor([3, 2, 1, 0]), torch.tensor([3, 2, 1, 4])
    assert kernel_calls.call_metadata(unpermute(in_range)) == kernel_calls.call_metadata(unpermute(past_the_rows))
    check_op("paged_attention", unpermute(in_range), in_graph=False)
    with pytest.raises(KernelContractError, match="unpermute_indices_range"):
        check_op("paged_attention", unpermute(past_the_rows), in_graph=False)


def test_call_metadata_tells_host_types_apart_and_skips_what_it_cannot_key() -> None:
    from torch._dynamo.source import ConstantSource
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    from ascendgraph import kernel_calls

    x = torch.zeros(2, 3)
    keys = {kernel_calls.call_metadata((x, value)) for value in (1, 1.0, True)}
    assert len(keys) == 3 and None not in keys
    assert kernel_calls.call_metadata((x, [1.0, 2.0])) is None  # a list of floats: no memo
    assert kernel_calls.call_metadata((x, object())) is None
    symbolic = StatelessSymbolicContext(dynamic_sizes=[DimDynamic.DYNAMIC, DimDynamic.STATIC])
    fake = FakeTensorMode(shape_env=ShapeEnv()).from_tensor(x, symbolic_context=symbolic, source=ConstantSource("x"))
    assert kernel_calls.call_metadata((fake,)) is None


def test_check_op_keeps_a_bounded_memo(monkeypatch) -> None:
    from ascendgraph import kernel_calls

    monkeypatch.setattr(kernel_calls, "_PASSED", set())
    monkeypatch.setattr(kernel_calls, "PASSED_LIMIT", 3)
    w = torch.ones(32, dtype=torch.bfloat16)
    for tokens in range(1, 8):
        check_op("rms_norm", (torch.zeros(tokens, 32, dtype=torch.bfloat16), w, 1e-6), in_graph=True)
        assert 1 <= len(kernel_calls._PASSED) <= 3


def test_empty_eager_attention_issues_no_kernel() -> None:
    args = _attention_args(4, [0, 0], [0, 0], rows=2)
    assert [c.kernel for c in kernel_calls("paged_attention", args, in_graph=False)] == [kc.PAGED_ATTENTION_OP]


def test_every_checked_op_maps_to_a_contracted_kernel() -> None:
    x = torch.zeros(3, 32, dtype=torch.bfloat16)
    w = torch.ones(32, dtype=torch.bfloat16)
    scale = torch.ones(1, dtype=torch.float32)
    q, k = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 32, dtype=torch.bfloat16)
    samples = {
        "rms_norm": (x, w, 1e-6),
        "add_rms_norm": (x, x, w, 1e-6),
        "dynamic_quant": (x,),
        "quantize": (x, scale, None),
        "add_rms_norm_dynamic_quant": (x, x, w, 1e-6),
        "add_rms_norm_quant": (x, x, w, scale, None, 1e-6),
        "rotary_embedding": (torch.arange(3), q, k, torch.zeros(16, 16, dtype=torch.float32), 16, True),
        "reshape_and_cache": (torch.zeros(3, 2, 16, dtype=torch.bfloat16), torch.zeros(3, 2, 16, dtype=torch.bfloat16),
                              torch.zeros(4, 16, 2, 16, dtype=torch.bfloat16), torch.zeros(4, 16, 2, 16, dtype=torch.bfloat16),
                              torch.arange(3)),
        "paged_attention": _attention_args(5, [3, 5], [3, 18], rows=2),
    }
    assert set(samples) == set(CHECKED_OPS)
    for op, args in samples.items():
        calls = kernel_calls(op, args, in_graph=True)
        assert calls and all(kc.rules_for(c.kernel) for c in calls), op
        check_op(op, args, in_graph=True)


def test_the_workspace_query_maps_onto_the_fused_attentions_rules() -> None:
    # hw's attention_workspace issues FIA's max-workspace query with the whole query and FIA's
    # arguments: the table's FIA rules apply to it (hw's pre-check and its binding ask them).
    args = _attention_args(5, [3, 5], [3, 18], rows=2)[:7]
    (call,) = kernel_calls("attention_workspace", args, in_graph=False)
    assert call.kernel == kc.FIA_MAX_WORKSPACE and call.arguments["query"].shape[0] == 5
    check_op("attention_workspace", args, in_graph=False)
    with pytest.raises(KernelContractError, match="query_dtype"):
        check_op("attention_workspace", _attention_args(5, [3, 5], [3, 18], rows=2, dtype=torch.float32)[:7],
                 in_graph=False)
    assert "attention_workspace" not in CHECKED_OPS  # the simulator's kernels check what they launch


def test_refusal_asks_the_named_rules_of_one_kernel_and_the_ops_own_level() -> None:
    from ascendgraph.kernel_calls import refusal

    float32 = _attention_args(5, [3, 5], [3, 18], rows=2, dtype=torch.float32)
    why = refusal("paged_attention", float32, kernel=kc.FIA, rules=("query_dtype",), in_graph=False)
    assert why is not None and why.startswith(f"{kc.FIA}: kernel contract 'query_dtype' violated")
    assert refusal("paged_attention", float32, kernel=kc.FIA, rules=("gqa_ratio",), in_graph=False) is None
    mixed = list(_attention_args(5, [3, 5], [3, 18], rows=2))
    mixed[1] = mixed[2] = mixed[1].half()  # the op's own level: caches share the query's dtype
    why = refusal("paged_attention", mixed, kernel=kc.FIA, rules=(), in_graph=False)
    assert why is not None and "'cache_dtype_like_query'" in why
    # The KV write asked about either kernel, whatever the SoC would pick.
    key, cache = torch.zeros(3, 2, 16), torch.zeros(4, 16, 2, 16)
    write = (key, key, cache, cache.clone(), torch.arange(3))
    assert refusal("reshape_and_cache", write, kernel=kc.SCATTER_PA_KV_CACHE, rules=("scatter_dtypes_equal",),
                   in_graph=False) is None
    why = refusal("reshape_and_cache", write, kernel=kc.RESHAPE_AND_CACHE, rules=("cache_dtype",), in_graph=False)
    assert why is not None and "'cache_dtype'" in why


@pytest.mark.parametrize("block_size, legal", [(128, True), (256, True), (512, True), (16, False), (64, False),
                                               (4, False), (130, False), (1024, False)])
def test_block_size_is_validated_against_the_attention_contract(block_size, legal):
    from ascendgraph.config import GraphConfig
    from ascendgraph.errors import ConfigError

    assert (kc.block_size_problem(block_size) is None) == legal
    if legal:
        assert GraphConfig.from_vllm_args(block_size=block_size).block_size == block_size
    else:
        with pytest.raises(ConfigError, match="paged_block_size") as info:
            GraphConfig.from_vllm_args(block_size=block_size)
        assert info.value.key == "block_size"


def test_a_dummy_request_with_a_shorter_kv_than_its_query_is_accepted() -> None:
    # vLLM Ascend's mixed-batch dummy request carries the padding tokens with kv_len 1; the
    # op docs' sparse_mode 3 interception (:8248) is for int8 output only (issue 24).
    args = CONTRACT_CASES[(kc.FIA, "tnd_tokens_equal_last_end")].boundary(CPU)
    assert list(args["actual_seq_lengths"]) == [3, 5]  # the last request has 2 query tokens
    kc.check(kc.FIA, {**args, "actual_seq_lengths_kv": [3, 1]})


def test_the_pre_check_issues_no_tensor_op_and_passes_what_hw_sends() -> None:
    # On a card a cast or a contiguous copy in the pre-check is a kernel (inside a task group,
    # an allocation); the mapping hands the rules metadata instead (issue 24).
    from torch.utils._python_dispatch import TorchDispatchMode

    from ascendgraph.kernel_calls import check_op, kernel_calls

    class Issued(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    bf16 = torch.bfloat16
    x, w = torch.randn(3, 32).to(bf16), torch.randn(32)  # a float32 weight: hw casts it
    key = torch.randn(2, 4, 16).to(bf16)
    caches = [torch.zeros(4, 128, 4, 16, dtype=bf16) for _ in range(2)]
    q = torch.randn(5, 4, 16).to(bf16)
    table = torch.zeros(2, 4, dtype=torch.int64)  # hw casts it to int32
    calls = {
        "rms_norm": (x, w, 1e-6),
        "add_rms_norm_dynamic_quant": (x, x, w, 1e-6),
        "quantize": (x, torch.ones(1), None),
        "reshape_and_cache": (key, key, caches[0], caches[1], torch.tensor([[3, -1]], dtype=torch.int32)),
        "paged_attention": (q, caches[0], caches[1], table, [3, 5], [3, 18], 0.25, torch.empty_like(q)),
    }
    with Issued() as issued:
        for op, args in calls.items():
            for in_graph in (False, True):
                check_op(op, args, in_graph=in_graph)
                kernel_calls(op, args, in_graph=in_graph)
    assert issued.ops == []
    (call,) = kernel_calls("add_rms_norm_dynamic_quant", calls["add_rms_norm_dynamic_quant"], in_graph=False)
    assert call.arguments["output_mask"] == [True, False]  # what hw/kernels.py sends


def test_converted_arguments_are_metadata_twins_and_the_rules_still_fire_on_them() -> None:
    """hw's adapters copy (``.to(dtype)``, ``.contiguous()``); the contract check describes those
    arguments (shape, dtype, contiguity) instead of copying them (no copy of the cos/sin cache per
    call), and the rules still fire on the descriptions."""
    q, k = torch.zeros(3, 64, dtype=torch.bfloat16), torch.zeros(3, 32, dtype=torch.bfloat16)
    cache = torch.zeros(16, 16, dtype=torch.float32)
    (rope,) = kernel_calls("rotary_embedding", (torch.arange(3), q, k, cache, 16, True), in_graph=True)
    query, key, converted = rope.arguments["query"], rope.arguments["key"], rope.arguments["cos_sin_cache"]
    assert not any(isinstance(t, torch.Tensor) for t in (query, key, converted))  # descriptions
    assert (tuple(query.shape), query.is_contiguous(), query.dtype) == ((3, 64), True, torch.bfloat16)
    assert (tuple(converted.shape), converted.dtype) == ((16, 16), torch.bfloat16)
    with pytest.raises(KernelContractError, match="rope_dtype"):
        check_op("rotary_embedding", (torch.arange(3), q.float(), k.float(), cache, 16, True), in_graph=True)
    with pytest.raises(KernelContractError, match="rope_layout"):  # 2 positions for 3 tokens
        check_op("rotary_embedding", (torch.arange(2), q, k, cache, 16, True), in_graph=True)
    x = torch.zeros(3, 32, dtype=torch.bfloat16)
    (norm,) = kernel_calls("rms_norm", (x, torch.ones(32, dtype=torch.float32), 1e-6), in_graph=True)
    assert not isinstance(norm.arguments["gamma"], torch.Tensor) and norm.arguments["gamma"].dtype == torch.bfloat16
    same = torch.ones(32, dtype=torch.bfloat16)
    (norm,) = kernel_calls("rms_norm", (x, same, 1e-6), in_graph=True)
    gamma = norm.arguments["gamma"]  # nothing to convert: described as it is
    assert (tuple(gamma.shape), gamma.dtype, gamma.is_contiguous()) == ((32,), torch.bfloat16, True)


def test_the_block_size_rule_follows_the_query_length_branch_of_the_op_docs() -> None:
    # torch-npu 2.13.0 _op_plugin_docs.py:8219 (Q_S > 1: 128..512 in steps of 128) and :8280
    # (Q_S == 1: 16-aligned, <= 512). A decode batch (every request one query token) takes 16;
    # one request of two query tokens makes the batch Q_S > 1 and 16 is refused (issue 24).
    decode = _attention_args(2, [1, 2], [3, 18], rows=2, block_size=16)
    check_op("paged_attention", decode, in_graph=False)
    with pytest.raises(KernelContractError, match="paged_block_size") as info:
        check_op("paged_attention", _attention_args(3, [1, 3], [3, 18], rows=2, block_size=16), in_graph=False)
    assert ":8219" in str(info.value) and "Q_S=2 > 1" in str(info.value)
    check_op("paged_attention", _attention_args(3, [1, 3], [3, 18], rows=2, block_size=256), in_graph=False)


@pytest.mark.parametrize("num_speculative_tokens, legal", [(0, True), (15, True), (16, False)])
def test_decode_requests_of_more_than_16_query_tokens_are_refused_on_the_configuration(num_speculative_tokens, legal):
    # vLLM Ascend's AscendAttentionMetadataBuilder asserts 1 + num_speculative_tokens <= 16
    # (attention_v1.py@182b75ea:252-260, the TND layout's limit of the fused attention).
    from ascendgraph.config import GraphConfig
    from ascendgraph.errors import ConfigError

    assert "tnd_decode_query_len" in kc.CONFIG_RULES
    if legal:
        assert GraphConfig.from_vllm_args(num_speculative_tokens=num_speculative_tokens).num_speculative_tokens == \
            num_speculative_tokens
    else:
        with pytest.raises(ConfigError, match="tnd_decode_query_len") as info:
            GraphConfig.from_vllm_args(num_speculative_tokens=num_speculative_tokens)
        assert info.value.key == "num_speculative_tokens" and "attention_v1.py@182b75ea" in str(info.value)


def test_rules_quote_canns_own_texts_where_vllm_ascend_quotes_them() -> None:
    # vLLM Ascend PR #10769 quotes CANN's FIA tiling texts for the KV lengths and the block-table
    # shape, issue #6076 the TND query-length one (issue 24): a card's message maps to its rule.
    sources = {rule.name: rule.source for rule in kc.rules_for(kc.FIA)}
    assert "PR #10769" in sources["paged_kv_lengths_per_request"] and "actualSeqLengthsKv" in sources[
        "paged_kv_lengths_per_request"]
    for name in ("block_table_rows", "block_table_columns"):
        assert "PR #10769" in sources[name] and "CheckBlockTableShape" in sources[name]
    assert "CheckFAISeqlenDataInTND" in sources["tnd_tokens_equal_last_end"]


# ----------------------------------------------------------------- the attention rules against the op docs' text
# torch-npu 2.13.0 torch_npu/_op_plugin_docs.py: the Q_S > 1 branch opens at :8201, the Q_S == 1
# branch at :8269 (tests/hw/test_torch_npu_contract.py checks that the cited lines say so).

def _broken(args: dict) -> list[str]:
    return [rule.name for rule in kc.violations(kc.FIA, args)]


def _decode(d: torch.device = CPU, **changes) -> dict:
    """A TND decode call (every request one query token: Q_S == 1)."""
    from ascendgraph.testing.contract_cases import _fia

    return _fia(d, **{"query": torch.zeros(2, 4, 16, dtype=torch.bfloat16), "actual_seq_lengths": [1, 2],
                      "actual_seq_lengths_kv": [3, 130], **changes})


def _fia_args(**changes) -> dict:
    from ascendgraph.testing.contract_cases import _fia

    return _fia(CPU, **changes)


def test_the_head_dim_alignment_is_a_rule_of_the_q_s_gt_1_branch_only() -> None:
    # :8210 sits in the Q_S > 1 branch; the Q_S == 1 branch asks only D <= 512 (:8271).
    assert "head_dim_16_aligned" not in _broken(_decode(query=torch.zeros(2, 4, 8, dtype=torch.bfloat16)))
    assert "head_dim_16_aligned" in _broken(_fia_args(query=torch.zeros(5, 4, 8, dtype=torch.bfloat16)))
    assert "head_dim_limit" in _broken(_decode(query=torch.zeros(2, 4, 528, dtype=torch.bfloat16)))
    # with an int8 input, 32-aligned (:8210)
    int8_kv = dict(key=torch.zeros(8, 128, 32, dtype=torch.int8), value=torch.zeros(8, 128, 32, dtype=torch.int8))
    assert "head_dim_16_aligned" in _broken(_fia_args(**int8_kv))  # D 16
    assert "head_dim_16_aligned" not in _broken(_fia_args(query=torch.zeros(5, 4, 32, dtype=torch.bfloat16), **int8_kv))


def test_the_head_dim_of_a_bsh_query_is_h_over_the_heads() -> None:
    # :8064: D = H/N. BSH's last axis is H: 2 heads of 300 (H 600) is D 300, within 512; 4 heads
    # of 8 (H 32) is D 8, not 16-aligned.
    bsh = dict(input_layout="BSH", actual_seq_lengths=None, actual_seq_lengths_kv=None, block_table=None,
               sparse_mode=0, atten_mask=None)
    wide = _fia_args(query=torch.zeros(2, 3, 600, dtype=torch.bfloat16), num_heads=2, num_key_value_heads=2, **bsh)
    assert _head_dim(wide) == 300 and "head_dim_limit" not in _broken(wide)
    narrow = _fia_args(query=torch.zeros(2, 3, 32, dtype=torch.bfloat16), num_heads=4, num_key_value_heads=2, **bsh)
    assert _head_dim(narrow) == 8 and "head_dim_16_aligned" in _broken(narrow)
    bsnd = _fia_args(query=torch.zeros(2, 3, 4, 16, dtype=torch.bfloat16), **{**bsh, "input_layout": "BSND"})
    assert _head_dim(bsnd) == 16


def test_the_kv_hidden_limit_is_a_rule_of_the_three_dimensional_cache_layout() -> None:
    # :8220 / :8287: over the limit, (blocknum, blocksize, H) is rejected and (blocknum, KV_N,
    # blocksize, D) is the way out.
    assert "kv_hidden_limit" in _broken(_fia_args(num_key_value_heads=4096))
    four_d = dict(key=torch.zeros(8, 4096, 128, 16, dtype=torch.bfloat16).expand(8, 4096, 128, 16),
                  value=torch.zeros(8, 4096, 128, 16, dtype=torch.bfloat16).expand(8, 4096, 128, 16))
    assert "kv_hidden_limit" not in _broken(_fia_args(num_key_value_heads=4096, **four_d))
    # Q_S == 1 rejects "over 64k": KV_N*D 65536 is accepted there, 65552 is not
    assert "kv_hidden_limit" not in _broken(_decode(num_key_value_heads=4096))
    assert "kv_hidden_limit" in _broken(_decode(num_key_value_heads=4097))


def test_an_int8_query_is_refused_only_where_the_op_docs_refuse_it() -> None:
    int8 = torch.zeros(5, 4, 16, dtype=torch.int8)
    unpaged = dict(block_table=None)
    assert "query_dtype" not in _broken(_fia_args(query=int8, **unpaged))  # :8065 lists int8
    assert "query_dtype" in _broken(_fia_args(query=int8))  # Q_S > 1 with page attention (:8224)
    decode_int8 = torch.zeros(2, 4, 16, dtype=torch.int8)
    assert "query_dtype" not in _broken(_decode(query=decode_int8))  # Q_S == 1, bf16 KV
    int8_kv = dict(key=torch.zeros(8, 128, 32, dtype=torch.int8), value=torch.zeros(8, 128, 32, dtype=torch.int8))
    assert "query_dtype" in _broken(_decode(query=decode_int8, **int8_kv))  # all three int8 (:8272)
    assert "query_dtype" in _broken(_fia_args(query=torch.zeros(5, 4, 16, dtype=torch.float32)))


def test_the_decode_block_size_is_32_aligned_over_an_int8_kv_cache() -> None:
    # :8280: 16-aligned for float16/bfloat16 KV, 32-aligned for int8 KV.
    def cache(dtype: torch.dtype, block_size: int) -> dict:
        shape = (8, block_size, 32)
        return dict(key=torch.zeros(shape, dtype=dtype), value=torch.zeros(shape, dtype=dtype), block_size=block_size,
                    block_table=torch.zeros(2, 16, dtype=torch.int32))

    assert "paged_block_size" not in _broken(_decode(**cache(torch.bfloat16, 16)))
    assert "paged_block_size" in _broken(_decode(**cache(torch.int8, 16)))
    assert "paged_block_size" not in _broken(_decode(**cache(torch.int8, 32)))
    with pytest.raises(KernelContractError, match="int8 KV cache"):
        kc.check(kc.FIA, _decode(**cache(torch.int8, 48)))


def test_the_tnd_query_rank_cites_the_line_that_names_the_layout_letters() -> None:
    (rule,) = [r for r in kc.rules_for(kc.FIA) if r.name == "tnd_query_rank"]
    assert ":8064" in rule.source and ":8113 (TND: query is" not in rule.source


def _v1_call_as_v2(call: dict) -> dict:
    renames = {kc.FIA_ARGUMENTS.q_lengths: kc.FIA_V2_ARGUMENTS.q_lengths,
               kc.FIA_ARGUMENTS.kv_lengths: kc.FIA_V2_ARGUMENTS.kv_lengths,
               kc.FIA_ARGUMENTS.heads: kc.FIA_V2_ARGUMENTS.heads}
    return {renames.get(key, key): value for key, value in call.items()}


@pytest.mark.parametrize("layout, q_ends, q_s, batch", [
    ("TND", [3, 4, 9], 5, 3),  # the longest request's query length; one request per end
    ("TND", None, 9, 0),  # no ends: T
    ("BSH", None, 1, 9),  # the query's S axis
])
def test_the_two_fused_attentions_read_the_same_call_in_their_own_names(layout, q_ends, q_s, batch) -> None:
    query = torch.empty((9, 8, 128) if layout == "TND" else (9, 1, 1024), dtype=torch.bfloat16)
    v1 = {"query": query, "input_layout": layout, "actual_seq_lengths": q_ends, "actual_seq_lengths_kv": [16, 40, 130],
          "num_heads": 8, "num_key_value_heads": 2, "block_table": torch.zeros(3, 2, dtype=torch.int32),
          "block_size": 128}
    v2 = _v1_call_as_v2(v1)
    assert "actual_seq_qlen" in v2 and "num_query_heads" in v2 and "actual_seq_lengths" not in v2
    for reader in ("q_s", "batch", "kv_heads", "gqa_ok", "paged_with_kv_lengths", "blocks_needed",
                   "block_table_columns_ok", "describe_block_table_columns"):
        assert getattr(kc.FIA_ARGUMENTS, reader)(v1) == getattr(kc.FIA_V2_ARGUMENTS, reader)(v2), reader
    assert (kc.FIA_ARGUMENTS.q_s(v1), kc.FIA_ARGUMENTS.batch(v1)) == (q_s, batch)
    assert kc.FIA_ARGUMENTS.blocks_needed(v1) == [1, 1, 2] and not kc.FIA_ARGUMENTS.block_table_columns_ok(
        {**v1, "block_table": torch.zeros(3, 1, dtype=torch.int32)})


def test_both_fused_attentions_name_the_longest_kv_length_when_the_block_table_is_too_narrow() -> None:
    call = {"query": torch.empty(3, 8, 128, dtype=torch.bfloat16), "input_layout": "TND",
            "actual_seq_lengths": [1, 2, 3], "actual_seq_lengths_kv": [16, 300, 7], "num_heads": 8,
            "block_table": torch.zeros(3, 2, dtype=torch.int32), "block_size": 128}
    for kernel, arguments in ((kc.FIA, call), (kc.FIA_V2, _v1_call_as_v2(call))):
        prefix = "" if kernel == kc.FIA else "v2_"
        rule = next(r for r in kc.rules_for(kernel) if r.name == f"{prefix}block_table_columns")
        assert rule.applies(arguments) and not rule.holds(arguments)
        assert rule.describe(arguments) == "block_table has 2 columns but the longest KV length (300) needs 3 blocks of 128"


def test_rules_for_answers_each_kernel_its_rules_in_table_order():
    from ascendgraph.kernel_contracts import table

    for kernel in (*table.KERNELS, *table._ALIASES, "no_such_kernel"):
        base = table._ALIASES.get(kernel, kernel)
        assert table.rules_for(kernel) == tuple(rule for rule in table.RULES if rule.kernel == base)
    assert table.rules_for("no_such_kernel") == ()


def test_npu_quantize_dtypes_follow_div_mode_as_the_op_docs_say():
    # torch_npu/_op_plugin_docs.py:11359-11376: div_mode True divides (scales float32/bfloat16,
    # zero_points int8/uint8/int32/bfloat16, out qint8/quint8/int32); False multiplies (scales and
    # zero_points one float dtype, out qint8/quint4x2). vLLM Ascend calls it with div_mode False
    # and an offset cast to the scale's dtype (quantization/methods/w8a8_static.py@182b75ea:130-132).
    from ascendgraph.kernel_contracts import violations

    x = torch.zeros(4, 8, dtype=torch.bfloat16)

    def broken(scales, zero_points, dtype, div_mode):
        args = {"input": x, "scales": scales, "zero_points": zero_points, "dtype": dtype, "axis": -1,
                "div_mode": div_mode}
        return sorted(rule.name for rule in violations("npu_quantize", args))

    f16, bf16 = torch.ones(8, dtype=torch.float16), torch.ones(8, dtype=torch.bfloat16)
    assert broken(bf16, bf16.clone(), torch.qint8, False) == []  # vLLM Ascend's call
    assert broken(f16, f16.clone(), torch.quint4x2, False) == []
    assert broken(f16, None, torch.qint8, True) == ["scales"]  # float16 scales only when multiplying
    assert broken(bf16, torch.zeros(8, dtype=torch.int8), torch.qint8, False) == ["zero_points"]
    assert broken(bf16, f16, torch.qint8, False) == ["zero_points"]  # not the scales' dtype
    assert broken(bf16, torch.zeros(8, dtype=torch.int8), torch.qint8, True) == []
    assert broken(bf16, None, torch.quint8, False) == ["out_dtype"]
    assert broken(bf16, None, torch.quint4x2, True) == ["out_dtype"]
