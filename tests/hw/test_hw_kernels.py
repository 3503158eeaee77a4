"""The NPU kernel routes on CPU: the table covers every ascendgraph op; without torch_npu
kernels every op falls back (logged once) to a formula that agrees with the simulator's
reference kernels; the adapters map our op contracts onto torch_npu's kernel contracts
(checked with stand-ins that follow the kernels' documented semantics); and the
attention buffers survive from capture to parameter update.

The stand-ins replace torch_npu, which is outside the project; device behaviour itself is
never faked here.
"""

from __future__ import annotations

import logging
import math
from types import SimpleNamespace
from typing import Any, Optional

import pytest
import torch
from torch import Tensor

import sim.kernels as sim_ref
from ascendgraph import kernel_contracts as kc
from ascendgraph import ops
from ascendgraph.errors import CaptureConstraintError, KernelContractError
from hw import api, reference
from hw.api import TorchNpu
from hw.kernels import FIA_MASK_SIZE, FIA_SPARSE_MODE, KERNEL_ROUTES, KernelRouter

BF16 = torch.bfloat16
TOL = {torch.float32: dict(atol=1e-5, rtol=1e-5), torch.float16: dict(atol=2e-3, rtol=2e-3),
       BF16: dict(atol=2e-2, rtol=2e-2)}


def randn(*shape: int, dtype: torch.dtype = torch.float32, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def router(namespace: Any = None, *, capturing: bool = False) -> KernelRouter:
    state = {"capturing": capturing}
    r = KernelRouter(TorchNpu(namespace or SimpleNamespace()), capturing=lambda: state["capturing"])
    r.state = state  # type: ignore[attr-defined]
    return r


# --------------------------------------------------------------------------- the table


def test_every_ascendgraph_op_has_a_route() -> None:
    assert set(KERNEL_ROUTES) == set(ops.OP_NAMES)


@pytest.mark.parametrize("op", sorted(KERNEL_ROUTES))
def test_routes_name_declared_torch_npu_kernels_and_a_fallback(op: str) -> None:
    route = KERNEL_ROUTES[op]
    assert route.fallback_kind in ("reference", "composition")
    for binding in route.bindings:
        assert binding.api in api.APIS and binding.api.kind in ("op", "atb") and binding.api.optional


def test_the_kernel_table_reads_as_data() -> None:
    table = {op: [b.api.path for b in r.bindings] or [r.fallback_kind] for op, r in KERNEL_ROUTES.items()}
    assert table["rms_norm"] == ["torch_npu.npu_rms_norm"]
    assert table["paged_attention"] == ["torch_npu.npu_fused_infer_attention_score.out"]
    assert table["reshape_and_cache"] == ["torch_npu.npu_scatter_pa_kv_cache", "torch_npu._npu_reshape_and_cache"]
    socs = [b.socs for b in KERNEL_ROUTES["reshape_and_cache"].bindings]
    assert socs == [("A2", "A3", "A5"), ("310P",)]  # vLLM Ascend: the ATB kernel on 310P only
    assert table["muls_add"] == ["reference"] and table["split_qkv_rmsnorm_rope"] == ["composition"]


@pytest.mark.parametrize("op", sorted(op for op, route in KERNEL_ROUTES.items() if route.bindings))
def test_every_binding_decides_by_rules_of_its_kernel_in_the_contract_table(op: str) -> None:
    # hw holds no predicate of its own: a rule renamed or dropped in the table must not leave a
    # binding asking about nothing.
    for binding in KERNEL_ROUTES[op].bindings:
        names = {rule.name for rule in kc.rules_for(binding.kernel)}
        assert binding.rules and set(binding.rules) <= names, (binding.kernel, set(binding.rules) - names)


# --------------------------------------------------------------------------- fallbacks vs the simulator


def _op_cases(dtype: torch.dtype) -> dict[str, tuple[tuple[Any, ...], Any]]:
    """op -> (args, expected from the simulator's reference kernels)."""
    x, r, w = randn(3, 32, dtype=dtype), randn(3, 32, dtype=dtype, seed=1), randn(32, dtype=dtype, seed=2)
    scale, offset = torch.full((32,), 0.02), torch.tensor([(i % 5) - 2 for i in range(32)], dtype=torch.int32)
    pos, cache = torch.tensor([0, 3, 5]), randn(8, 16, seed=3)
    q, k = randn(3, 4 * 16, dtype=dtype, seed=4), randn(3, 2 * 16, dtype=dtype, seed=5)
    qkv, qw, kw = randn(3, 4 * 16 + 2 * 2 * 16, dtype=dtype, seed=6), randn(16, dtype=dtype, seed=7), randn(16, dtype=dtype, seed=8)
    return {
        "rms_norm": ((x, w, 1e-6), sim_ref.rms_norm_ref(x, w, 1e-6)),
        "add_rms_norm": ((x, r, w, 1e-6), sim_ref.add_rms_norm_ref(x, r, w, 1e-6)),
        "dynamic_quant": ((x,), sim_ref.dynamic_quant_ref(x)),
        "quantize": ((x, scale, offset), sim_ref.quantize_ref(x, scale, offset)),
        "add_rms_norm_dynamic_quant": ((x, r, w, 1e-6), sim_ref.add_rms_norm_dynamic_quant_ref(x, r, w, 1e-6)),
        "add_rms_norm_quant": ((x, r, w, scale, offset, 1e-6), sim_ref.add_rms_norm_quant_ref(x, r, w, scale, offset, 1e-6)),
        "rotary_embedding": ((pos, q, k, cache, 16, True), sim_ref.rotary_embedding_ref(pos, q, k, cache, 16, True)),
        "split_qkv_rmsnorm_rope": (
            (qkv, qw, kw, pos, cache, 64, 32, 16, 1e-6, False),
            sim_ref.split_qkv_rmsnorm_rope_ref(qkv, qw, kw, pos, cache, 64, 32, 16, 1e-6, False),
        ),
        "muls_add": ((x, r, 0.5), sim_ref.muls_add_ref(x, r, 0.5)),
    }


def _assert_same(actual: Any, expected: Any, dtype: torch.dtype) -> None:
    if isinstance(expected, tuple):
        assert isinstance(actual, tuple) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            _assert_same(a, e, dtype)
        return
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    if expected.dtype == torch.int8:  # quantised values may differ by one step where rounding ties
        assert (actual.int() - expected.int()).abs().max() <= 1
    else:
        torch.testing.assert_close(actual, expected, **TOL[dtype])


# Ops whose torch_npu kernels take float32 (torch_npu/_op_plugin_docs.py; vLLM Ascend's call sites):
# the others are refused in float32 by the contract pre-check, whether or not a fallback exists.
FLOAT32_OPS = {"rms_norm", "add_rms_norm", "quantize", "muls_add"}


@pytest.mark.parametrize("dtype", [torch.float32, BF16])
@pytest.mark.parametrize("op", sorted(_op_cases(torch.float32)))
def test_without_torch_npu_kernels_each_op_falls_back_to_the_reference_result(op: str, dtype: torch.dtype) -> None:
    args, expected = _op_cases(dtype)[op]
    r = router()
    if dtype is torch.float32 and op not in FLOAT32_OPS:
        with pytest.raises(KernelContractError):
            r.call(op, *args)
        # refused before any reference fallback (docs/hw.md, "contracts first"); a composition
        # (split_qkv_rmsnorm_rope) is refused by the contract of the kernel it composes
        refused_at_a_part = KERNEL_ROUTES[op].fallback_kind == "composition"
        assert op not in r.fallbacks or refused_at_a_part
        assert "rotary_embedding" not in r.fallbacks
        return
    _assert_same(r.call(op, *args), expected, dtype)
    # ops that torch_npu has no kernel for at all run their formula: no fallback to report
    assert (op in r.fallbacks) == bool(KERNEL_ROUTES[op].bindings)


def test_a_fallback_is_logged_once_per_op_and_reason(caplog: pytest.LogCaptureFixture) -> None:
    r = router()
    x, w = randn(2, 8), randn(8)
    with caplog.at_level(logging.WARNING, logger="ascendgraph.hw.kernels"):
        for _ in range(3):
            r.call("rms_norm", x, w, 1e-6)
    messages = [rec.getMessage() for rec in caplog.records]
    assert len(messages) == 1
    assert "rms_norm" in messages[0] and "torch_npu.npu_rms_norm is not in this torch_npu" in messages[0]


def test_reference_reshape_and_cache_matches_the_simulator_and_skips_padding_slots() -> None:
    for slots in ([5, -1, 11], [-1, -1, -1], [0, -1, 3], [7, 2, 9]):
        caches = [randn(3, 4, 2, 8, seed=9) for _ in range(4)]
        key, value = randn(3, 2, 8), randn(3, 2, 8, seed=1)
        mapping = torch.tensor(slots)
        reference.reshape_and_cache(key, value, caches[0], caches[1], mapping)
        sim_ref.reshape_and_cache_ref(key, value, caches[2], caches[3], mapping)
        assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3]), slots


ATTENTION_CASES = [([1, 2, 3], [5, 9, 1]), ([4, 5, 6], [4, 12, 7]), ([3, 6], [10, 3]), ([2, 2, 3], [7, 0, 4])]


def _attention_args(ends: list[int], lens: list[int], dtype: torch.dtype, padding: int = 2) -> tuple[Any, ...]:
    heads, kvh, d, nb, bs = 4, 2, 16, 16, 128  # legal for the fused attention: D 16-aligned, block 128 (Q_S > 1)
    tokens = ends[-1] + padding
    q = randn(tokens, heads, d, dtype=dtype)
    kc, vc = randn(nb, bs, kvh, d, dtype=dtype, seed=1), randn(nb, bs, kvh, d, dtype=dtype, seed=2)
    table = torch.randperm(nb, generator=torch.Generator().manual_seed(4))[: len(lens) * 4].view(len(lens), 4).int()
    out = torch.full((tokens, heads, d), 7.0, dtype=dtype)
    return q, kc, vc, table, ends, lens, 1 / math.sqrt(d), out


@pytest.mark.parametrize("dtype", [torch.float16, BF16])
@pytest.mark.parametrize("ends,lens", ATTENTION_CASES)
def test_reference_paged_attention_matches_the_simulator(dtype: torch.dtype, ends: list[int], lens: list[int]) -> None:
    args = _attention_args(ends, lens, dtype)
    expected = args[-1].clone()
    sim_ref.paged_attention_ref(*args[:-1], expected)
    router().call("paged_attention", *args)
    torch.testing.assert_close(args[-1], expected, **TOL[dtype])


# --------------------------------------------------------------------------- adapters vs kernel contracts


class FakeTorchNpu:
    """torch_npu's fused kernels as documented (argument layout, output tuples, in-place
    updates), computed with the simulator's formulas. Records the calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []
        self.npu_fused_infer_attention_score = SimpleNamespace(out=self._fia_out)

    def _note(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        self.calls.append((name, args, kwargs))

    def npu_rms_norm(self, x: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, Tensor]:
        self._note("npu_rms_norm", (x, gamma), {"epsilon": epsilon})
        assert gamma.dtype == x.dtype
        return sim_ref.rms_norm_ref(x, gamma, epsilon), torch.empty(0)

    def npu_add_rms_norm(self, x1: Tensor, x2: Tensor, gamma: Tensor, epsilon: float = 1e-6) -> tuple[Tensor, ...]:
        self._note("npu_add_rms_norm", (x1, x2, gamma), {"epsilon": epsilon})
        y, x_sum = sim_ref.add_rms_norm_ref(x1, x2, gamma, epsilon)
        return y, torch.empty(0), x_sum

    def npu_dynamic_quant(self, x: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self._note("npu_dynamic_quant", (x,), kwargs)
        return sim_ref.dynamic_quant_ref(x)

    def npu_quantize(self, x: Tensor, scales: Tensor, zero_points: Optional[Tensor], dtype: Any, axis: int = 1,
                     div_mode: bool = True) -> Tensor:
        self._note("npu_quantize", (x, scales, zero_points, dtype), {"axis": axis, "div_mode": div_mode})
        assert dtype is torch.qint8 and axis == -1 and div_mode and scales.shape == (x.shape[-1],)
        return sim_ref.quantize_ref(x, scales, zero_points)

    def npu_add_rms_norm_dynamic_quant(self, x1: Tensor, x2: Tensor, gamma: Tensor, *, epsilon: float = 1e-6,
                                       output_mask: Any = None, **kwargs: Any) -> tuple[Tensor, ...]:
        self._note("npu_add_rms_norm_dynamic_quant", (x1, x2, gamma), {"epsilon": epsilon, "output_mask": output_mask})
        y, x_sum = sim_ref.add_rms_norm_ref(x1, x2, gamma, epsilon)
        y1, scale1 = sim_ref.dynamic_quant_ref(y)
        return y1, torch.zeros(1, dtype=torch.int8), x_sum, scale1, torch.zeros(1)

    def npu_add_rms_norm_quant(self, x1: Tensor, x2: Tensor, gamma: Tensor, scales1: Tensor,
                               zero_points1: Optional[Tensor], beta: Optional[Tensor] = None, *,
                               epsilon: float = 1e-6, **kwargs: Any) -> tuple[Tensor, ...]:
        self._note("npu_add_rms_norm_quant", (x1, x2, gamma, scales1, zero_points1), {"epsilon": epsilon})
        assert scales1.shape == gamma.shape
        y, x_sum = sim_ref.add_rms_norm_ref(x1, x2, gamma, epsilon)
        return sim_ref.quantize_ref(y, scales1, zero_points1), torch.zeros(1, dtype=torch.int8), x_sum

    def _npu_rotary_embedding(self, positions: Tensor, query: Tensor, key: Tensor, head_size: int,
                              cos_sin_cache: Tensor, is_neox_style: bool) -> None:
        self._note("_npu_rotary_embedding", (positions, query, key, head_size, cos_sin_cache, is_neox_style), {})
        assert query.dim() == 2 and query.is_contiguous() and cos_sin_cache.dtype == query.dtype
        assert cos_sin_cache.shape[-1] == head_size  # the kernel rotates whole heads
        q, k = sim_ref.rotary_embedding_ref(positions, query, key, cos_sin_cache, head_size, is_neox_style)
        query.copy_(q)
        key.copy_(k)

    def _npu_reshape_and_cache(self, key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor,
                               slot_indices: Tensor) -> None:
        self._note("_npu_reshape_and_cache", (key, value, key_cache, value_cache, slot_indices), {})
        assert slot_indices.dtype == torch.int32 and key.shape[1:] == key_cache.shape[2:]
        sim_ref.reshape_and_cache_ref(key, value, key_cache, value_cache, slot_indices)

    def _fia_check(self, query: Tensor, key: Tensor, value: Tensor, kwargs: dict[str, Any]) -> None:
        assert kwargs["input_layout"] == "TND" and kwargs["sparse_mode"] == FIA_SPARSE_MODE
        assert kwargs["atten_mask"].shape == (FIA_MASK_SIZE, FIA_MASK_SIZE) and kwargs["atten_mask"].dtype == torch.bool
        assert kwargs["block_table"].dtype == torch.int32
        assert key.dim() == 3 and key.shape[1] == kwargs["block_size"]
        assert key.shape[2] == kwargs["num_key_value_heads"] * query.shape[2]
        assert all(isinstance(v, int) for v in kwargs["actual_seq_lengths"] + kwargs["actual_seq_lengths_kv"])

    def _npu_fused_infer_attention_score_get_max_workspace(self, query: Tensor, key: Tensor, value: Tensor,
                                                            **kwargs: Any) -> Tensor:
        self._note("get_max_workspace", (query, key, value), kwargs)
        self._fia_check(query, key, value, kwargs)
        return torch.empty(64, dtype=torch.uint8)

    def _npu_fused_infer_attention_score_infer_output(self, query: Tensor, value: Tensor, **kwargs: Any) -> tuple[Tensor, Tensor]:
        self._note("infer_output", (query, value), kwargs)
        return torch.empty_like(query), torch.zeros(1, dtype=torch.float32)

    def _fia_out(self, query: Tensor, key: Tensor, value: Tensor, *, workspace: Optional[Tensor] = None,
                 out: list[Tensor], **kwargs: Any) -> tuple[Tensor, Tensor]:
        self._note("fia_out", (query, key, value), dict(kwargs, workspace=workspace, out=out))
        self._fia_check(query, key, value, kwargs)
        heads, kv_heads = kwargs["num_heads"], kwargs["num_key_value_heads"]
        d = query.shape[2]
        key_cache = key.view(key.shape[0], key.shape[1], kv_heads, d)
        value_cache = value.view(value.shape[0], value.shape[1], kv_heads, d)
        assert query.shape[1] == heads
        sim_ref.paged_attention_ref(query, key_cache, value_cache, kwargs["block_table"], kwargs["actual_seq_lengths"],
                                    kwargs["actual_seq_lengths_kv"], kwargs["scale"], out[0])
        return out[0], out[1]


@pytest.mark.parametrize("op", sorted(_op_cases(BF16)))
def test_adapters_turn_our_op_contracts_into_the_kernels_contracts(op: str) -> None:
    fake = FakeTorchNpu()
    r = router(fake)
    args, expected = _op_cases(BF16)[op]
    _assert_same(r.call(op, *args), expected, BF16)
    if KERNEL_ROUTES[op].bindings:
        assert op not in r.fallbacks, r.fallbacks.get(op)
        assert fake.calls, "the torch_npu kernel was not called"


def test_rotary_with_partial_rotary_dim_rotates_only_the_leading_features_through_the_kernel() -> None:
    fake = FakeTorchNpu()
    pos, cache = torch.tensor([0, 3, 5]), randn(8, 8, seed=3)  # rot 8 < head_size 16
    q, k = randn(3, 4 * 16, dtype=BF16, seed=4), randn(3, 2 * 16, dtype=BF16, seed=5)
    result = router(fake).call("rotary_embedding", pos, q, k, cache, 16, False)
    _assert_same(result, sim_ref.rotary_embedding_ref(pos, q, k, cache, 16, False), BF16)
    assert [c[0] for c in fake.calls] == ["_npu_rotary_embedding"] and fake.calls[0][1][3] == 8


def test_reshape_and_cache_adapter_passes_int32_slots_and_token_major_rows() -> None:
    fake = FakeTorchNpu()
    kc, vc = torch.zeros(3, 4, 2, 8, dtype=BF16), torch.zeros(3, 4, 2, 8, dtype=BF16)
    key, value = randn(3, 16, dtype=BF16), randn(3, 16, dtype=BF16, seed=1)  # [T, kv_heads * head_dim]
    router(fake).call("reshape_and_cache", key, value, kc, vc, torch.tensor([5, -1, 11]))
    assert torch.equal(kc[1, 1], key[0].view(2, 8)) and torch.equal(vc[2, 3], value[2].view(2, 8))


def test_float32_attention_is_refused_before_the_kernel_and_any_fallback() -> None:
    fake = FakeTorchNpu()
    r = router(fake)
    args = _attention_args([1, 2], [3, 5], torch.float32)
    with pytest.raises(KernelContractError, match="--dtype bfloat16") as info:
        r.call("paged_attention", *args)
    assert "query_dtype" in info.value.rules
    assert not fake.calls and "paged_attention" not in r.fallbacks
    # The workspace query takes what the fused attention takes (the table's FIA rules), so it is
    # refused too, rather than falling back to an empty workspace.
    with pytest.raises(KernelContractError) as info:
        r.call("attention_workspace", *args[:7])
    assert info.value.kernel == kc.FIA_MAX_WORKSPACE and "query_dtype" in info.value.rules
    assert not fake.calls and "attention_workspace" not in r.fallbacks


def test_a_quantize_scale_the_kernel_takes_reaches_the_kernel() -> None:
    # A [1, hidden] scale is per channel: hw hands npu_quantize the [hidden] vector, which the
    # table's rules take, so the kernel runs (no predicate of hw's own sends it to the fallback).
    fake = FakeTorchNpu()
    r = router(fake)
    x, scale = randn(3, 32, dtype=BF16), torch.full((1, 32), 0.02)
    _assert_same(r.call("quantize", x, scale, None), sim_ref.quantize_ref(x, scale, None), BF16)
    assert [c[0] for c in fake.calls] == ["npu_quantize"] and "quantize" not in r.fallbacks


def test_a_scale_npu_quantize_cannot_take_is_refused_by_the_table_not_run_by_the_fallback() -> None:
    fake = FakeTorchNpu()
    r = router(fake)
    with pytest.raises(KernelContractError, match="scales_per_channel") as info:
        r.call("quantize", randn(3, 32, dtype=BF16), torch.full((16,), 0.02), None)
    assert info.value.kernel == kc.QUANTIZE and "_op_plugin_docs.py:11377" in str(info.value)
    assert not fake.calls and "quantize" not in r.fallbacks


def test_the_kv_writes_second_kernel_falls_back_for_the_table_rule_it_breaks() -> None:
    # SoC not known and no npu_scatter_pa_kv_cache: the pre-check mapped the call onto the scatter
    # kernel (which takes float32); the ATB kernel's own rules then decide, as the table words them.
    fake = FakeTorchNpu()
    r = router(fake)
    kc_, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    key = randn(1, 1, 8)
    r.call("reshape_and_cache", key, key, kc_, vc, torch.tensor([3]))
    assert torch.equal(kc_[0, 3], key[0]) and not fake.calls
    reason = r.fallbacks["reshape_and_cache"]
    assert "kernel contract 'cache_dtype' violated" in reason and "device_op.py" in reason, reason
    bf16 = torch.zeros(2, 4, 1, 8, dtype=BF16)
    r.call("reshape_and_cache", key.to(BF16), key.to(BF16), bf16, bf16.clone(), torch.tensor([3]))
    assert [c[0] for c in fake.calls] == ["_npu_reshape_and_cache"]


def test_a_kernel_whose_library_is_missing_is_dropped_after_the_first_failure() -> None:
    class NoNnal(FakeTorchNpu):
        def _npu_reshape_and_cache(self, *args: Any) -> None:
            self._note("_npu_reshape_and_cache", args, {})
            raise OSError("Please check that the nnal package is installed.")

    fake = NoNnal()
    r = router(fake)
    for _ in range(2):
        kc, vc = torch.zeros(2, 4, 1, 8, dtype=BF16), torch.zeros(2, 4, 1, 8, dtype=BF16)
        key = randn(1, 1, 8, dtype=BF16)
        r.call("reshape_and_cache", key, key, kc, vc, torch.tensor([3]))
        assert torch.equal(kc[0, 3], key[0])
    assert len(fake.calls) == 1 and "nnal" in r.fallbacks["reshape_and_cache"]


# --------------------------------------------------------------------------- attention in graphs


@pytest.mark.parametrize("ends,lens", ATTENTION_CASES)
def test_fia_adapter_computes_paged_attention_and_zeroes_padding_tokens_when_eager(ends: list[int], lens: list[int]) -> None:
    fake = FakeTorchNpu()
    args = _attention_args(ends, lens, BF16)
    expected = args[-1].clone()
    sim_ref.paged_attention_ref(*args[:-1], expected)
    r = router(fake)
    r.call("paged_attention", *args)
    assert "paged_attention" not in r.fallbacks
    torch.testing.assert_close(args[-1], expected, **TOL[BF16])
    assert not r.buffers.entries, "eager calls keep no graph buffers"


def test_the_update_of_a_captured_attention_call_reuses_its_workspace_lse_and_block_table() -> None:
    fake = FakeTorchNpu()
    r = router(fake, capturing=True)
    q, kc, vc, table, _, _, scale, out = _attention_args([1, 2, 3], [5, 9, 1], BF16, padding=0)
    table = table.long()  # the kernel needs int32: the adapter keeps one static int32 copy
    r.call("paged_attention", q, kc, vc, table, [1, 2, 3], [5, 9, 1], scale, out)
    r.state["capturing"] = False  # type: ignore[attr-defined]
    r.call("paged_attention", q, kc, vc, table, [1, 2, 3], [6, 10, 2], scale, out)  # the task update
    first, second = [c for c in fake.calls if c[0] == "fia_out"]
    assert second[2]["workspace"] is first[2]["workspace"]
    assert second[2]["out"][1] is first[2]["out"][1]  # softmax_lse
    assert second[2]["block_table"] is first[2]["block_table"]
    assert second[2]["out"][0].data_ptr() == out.data_ptr()
    assert second[2]["actual_seq_lengths_kv"] == [6, 10, 2]
    assert sum(c[0] == "get_max_workspace" for c in fake.calls) == 1


def test_captured_calls_of_one_size_share_one_workspace_without_the_caller_passing_one() -> None:
    # vLLM Ascend keeps one FIA workspace per capture size for every layer (attention_v1.py@182b75ea
    # full_graph_fia: graph_params.workspaces.get(num_tokens)); before, each captured `out` kept its own.
    fake = FakeTorchNpu()
    r = router(fake, capturing=True)
    for _layer in range(3):
        r.call("paged_attention", *_attention_args([1, 2, 3], [5, 9, 1], BF16, padding=0))
    workspaces = [c[2]["workspace"] for c in fake.calls if c[0] == "fia_out"]
    assert len(workspaces) == 3 and all(w is workspaces[0] for w in workspaces)
    assert len(r.buffers.entries) == 3 and len(r.buffers.workspaces) == 1
    r.buffers.clear()
    assert not r.buffers.workspaces


def test_graph_buffers_go_when_the_last_captured_graph_is_released() -> None:
    r = router(FakeTorchNpu(), capturing=True)
    r.call("paged_attention", *_attention_args([1, 2], [3, 4], BF16, padding=0))
    assert r.buffers.entries
    r.graph_captured()
    r.graph_captured()
    r.graph_released()
    assert r.buffers.entries
    r.graph_released()
    assert not r.buffers.entries


def test_attention_falling_back_inside_a_task_group_is_refused_with_the_fix() -> None:
    r = router(capturing=True)  # a torch_npu without the fused attention
    r.in_task_group = True  # NpuDevice.task_group_begin / task_update_begin
    with pytest.raises(CaptureConstraintError, match="PIECEWISE"):
        r.call("paged_attention", *_attention_args([1, 2], [3, 5], BF16, padding=0))


def test_no_fallback_is_captured_attention_or_other() -> None:
    # A fallback inside a capture would be frozen into the graph with nothing reporting it
    # afterwards (issue 24): refused, naming the missing kernel and the fix.
    r = router(capturing=True)  # a torch_npu without any of the kernels
    with pytest.raises(CaptureConstraintError, match="fallback inside an ACL graph capture"):
        r.call("paged_attention", *_attention_args([1, 2], [3, 5], BF16, padding=0))
    args, _ = _op_cases(BF16)["rotary_embedding"]
    with pytest.raises(CaptureConstraintError, match="rotary_embedding would run its reference fallback"):
        r.call("rotary_embedding", *args)
    r.state["capturing"] = False  # type: ignore[attr-defined]
    args, expected = _op_cases(BF16)["rotary_embedding"]
    _assert_same(r.call("rotary_embedding", *args), expected, BF16)  # eagerly it is allowed, and reported
    assert "rotary_embedding" in r.fallbacks


def test_ops_without_any_torch_npu_kernel_run_their_formula_in_graphs_and_are_no_fallback() -> None:
    r = router(capturing=True)
    args, expected = _op_cases(BF16)["muls_add"]
    _assert_same(r.call("muls_add", *args), expected, BF16)
    assert "muls_add" not in r.fallbacks


@pytest.mark.parametrize("error", [AttributeError("'NoneType' object has no attribute 'shape'"),
                                   NotImplementedError("this layout")])
def test_an_error_raised_inside_an_adapter_propagates_and_selects_no_fallback(error: Exception) -> None:
    # Only a missing kernel selects a fallback; an AttributeError or NotImplementedError
    # raised *inside* the call is a bug or a refusal (before: the kernel was marked missing).
    class Broken(FakeTorchNpu):
        def npu_rms_norm(self, *args: Any, **kwargs: Any) -> Any:
            raise error

    r = router(Broken())
    with pytest.raises(type(error)):
        r.call("rms_norm", randn(2, 8, dtype=BF16), randn(8, dtype=BF16), 1e-6)
    assert "rms_norm" not in r.fallbacks


def test_attention_in_a_full_graph_without_the_max_workspace_query_is_refused() -> None:
    class NoWorkspaceQuery(FakeTorchNpu):
        def __getattribute__(self, name: str) -> Any:
            if name == "_npu_fused_infer_attention_score_get_max_workspace":
                raise AttributeError(name)
            return super().__getattribute__(name)

    r = router(NoWorkspaceQuery(), capturing=True)
    args = _attention_args([1, 2], [3, 5], BF16, padding=0)
    with pytest.raises(CaptureConstraintError, match="fallback inside an ACL graph capture"):
        r.call("attention_workspace", *args[:7])  # the no_workspace fallback in a capture
    with pytest.raises(CaptureConstraintError, match="freed again"):
        r.call("paged_attention", *args)
