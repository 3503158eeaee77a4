"""The simulator's fused attention computes what the op docs say, for every argument it accepts.

Hypothesis generates calls of ``npu_fused_infer_attention_score`` (v1 and v2, functional
and ``.out``) over the layouts the contract table accepts (TND paged and unpaged, BSH, BSND,
BNSD, BNSD_BSND, paged or not), sparse modes 0-4 with and without masks, pre/next tokens,
inner_precise, the lse flag, scales, GQA and v2's learnable sink, and compares each with
tests/sim/attention_reference.py, a row-by-row reading of the same docs. More examples
under ``-m slow``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ascendgraph import kernel_contracts
from sim.facade import kernels as facade_kernels
from tests.sim.attention_reference import fused_attention

facade_kernels.register()
F = torch.ops.npu_facade
pytestmark = pytest.mark.usefixtures("kernels_run_as_on_the_device")  # tests/sim/conftest.py
INT_MAX = 2147483647
MASK_2048 = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)
FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
LAYOUTS = ("TND", "TND-unpaged", "BSH", "BSND", "BNSD", "BNSD_BSND", "BSH-paged", "BNSD-paged")
KV_LENGTHS = (0, 1, 2, 3, 5, 8, 13, 40, 127, 128, 129)


def _violations(call: dict[str, Any], v2: bool) -> list[str]:
    kernel = kernel_contracts.FIA_V2 if v2 else kernel_contracts.FIA
    return [rule.name for rule in kernel_contracts.violations(kernel, call)]


@st.composite
def fused_calls(draw: st.DrawFn) -> tuple[dict[str, Any], bool]:
    """(call keyword arguments, v2?) of a call the contract table accepts."""
    v2 = draw(st.booleans())
    layout = draw(st.sampled_from(LAYOUTS))
    paged = layout in ("TND", "BSH-paged", "BNSD-paged")
    layout = layout.split("-")[0]
    kv_heads = draw(st.sampled_from((1, 2)))
    heads = kv_heads * draw(st.sampled_from((1, 2)))
    dim = 16
    dtype = draw(st.sampled_from((torch.bfloat16, torch.float16)))
    seed = draw(st.integers(0, 2**16))
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype)

    call: dict[str, Any] = {}
    if layout == "TND":
        requests = draw(st.integers(1, 3))
        q_lens = draw(st.lists(st.integers(0, 4), min_size=requests, max_size=requests))
        assume(sum(q_lens) > 0)
        ends = list(torch.tensor(q_lens).cumsum(0).tolist())
        q_s = max(q_lens)
        call["query"] = randn(sum(q_lens), heads, dim)
        batch = requests
    else:
        batch = draw(st.integers(1, 3))
        q_s = draw(st.integers(1, 4))
        q_lens = [1] * batch if q_s == 1 else draw(st.lists(st.integers(0, q_s), min_size=batch, max_size=batch))
        shape = {"BSH": (batch, q_s, heads * dim), "BSND": (batch, q_s, heads, dim)}.get(layout, (batch, heads, q_s, dim))
        call["query"] = randn(*shape)
        given_q = draw(st.sampled_from(("none", "one", "each"))) if q_s > 1 else "each"
        if given_q == "none":
            q_lens = [q_s] * batch
        elif given_q == "one":
            q_lens = [q_lens[0]] * batch
        ends = None
    incremental = q_s == 1
    if paged:
        block_size = 128 if not incremental else draw(st.sampled_from((16, 128)))
        kv_lens = draw(st.lists(st.sampled_from([n for n in KV_LENGTHS if n <= 2 * block_size]),
                                min_size=batch, max_size=batch))
        blocks = 2 * batch + 1
        order = torch.randperm(blocks, generator=gen)[: 2 * batch].view(batch, 2).to(torch.int32)
        call.update(key=randn(blocks, block_size, kv_heads * dim), value=randn(blocks, block_size, kv_heads * dim),
                    block_table=order, block_size=block_size)
        kv_arg: Any = kv_lens
        kv_span = 2 * block_size
    elif layout == "TND":
        kv_lens = draw(st.lists(st.integers(0, 12), min_size=batch, max_size=batch))
        kv_ends = list(torch.tensor(kv_lens).cumsum(0).tolist())
        call.update(key=randn(max(sum(kv_lens), 1), kv_heads, dim), value=randn(max(sum(kv_lens), 1), kv_heads, dim))
        kv_arg = kv_ends
        kv_span = max(kv_lens)
    else:
        kv_span = draw(st.integers(1, 12))
        kv_lens = draw(st.lists(st.integers(0, kv_span), min_size=batch, max_size=batch))
        shape = {"BSH": (batch, kv_span, kv_heads * dim), "BSND": (batch, kv_span, kv_heads, dim)}.get(
            layout, (batch, kv_heads, kv_span, dim))
        call.update(key=randn(*shape), value=randn(*shape))
        given_kv = draw(st.sampled_from(("none", "one", "each")))
        kv_arg = {"none": None, "one": [kv_lens[0]], "each": kv_lens}[given_kv]

    modes = (0, 3, 4) if layout == "TND" else (0, 1, 2, 3, 4)
    mode = draw(st.sampled_from(modes))
    mask = None
    pre = next_ = INT_MAX
    if mode in (2, 3, 4):
        mask = MASK_2048 if draw(st.booleans()) else MASK_2048.to(torch.int8)
    if mode == 1 or (mode == 0 and draw(st.booleans())):
        rows, cols = max(q_s, 1), kv_span
        form = draw(st.sampled_from(("2d", "3d", "4d-1", "4d-b")))
        if form == "2d" and incremental and layout != "TND":
            shape = (batch, cols)
        elif form == "2d":
            shape = (rows, cols)
        elif form == "3d":
            shape = (1, rows, cols)
        else:
            shape = (1 if form == "4d-1" else batch, 1, rows, cols)
        mask = torch.rand(shape, generator=gen) < draw(st.sampled_from((0.0, 0.3, 0.8)))
    if mode == 4 or (mode == 0 and mask is not None):
        pre = draw(st.sampled_from((-2, -1, 0, 1, 2, 5, INT_MAX)))
        next_ = draw(st.sampled_from((-2, -1, 0, 1, 3, INT_MAX)))
    inner = draw(st.sampled_from((0, 1) if incremental else (0, 1, 2, 3)))
    lse_flag = draw(st.booleans())
    scale = draw(st.sampled_from((1.0, 1 / math.sqrt(dim), 0.05)))

    q_name, kv_name = ("actual_seq_qlen", "actual_seq_kvlen") if v2 else ("actual_seq_lengths", "actual_seq_lengths_kv")
    call.update({
        "atten_mask": mask, q_name: ends if layout == "TND" else (None if q_s == 1 else q_lens), kv_name: kv_arg,
        "input_layout": layout, "num_key_value_heads": kv_heads, "sparse_mode": mode, "pre_tokens": pre,
        "next_tokens": next_, "inner_precise": inner,
        ("num_query_heads" if v2 else "num_heads"): heads, ("softmax_scale" if v2 else "scale"): scale,
        ("return_softmax_lse" if v2 else "softmax_lse_flag"): lse_flag,
    })
    if v2 and layout == "TND" and draw(st.booleans()):
        call["learnable_sink"] = torch.randn(heads, generator=gen).to(torch.bfloat16)
    assume(not _violations(call, v2))
    return call, v2


def _close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype) -> None:
    tolerance = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else dict(atol=4e-3, rtol=4e-3)
    torch.testing.assert_close(actual.float(), expected.float(), **tolerance)


def _lse_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert torch.equal(torch.isinf(actual), torch.isinf(expected)), (actual, expected)
    finite = ~torch.isinf(expected)
    torch.testing.assert_close(actual[finite], expected[finite], atol=1e-3, rtol=1e-4)


def check_against_reference(call: dict[str, Any], v2: bool) -> None:
    op = F.npu_fused_infer_attention_score_v2 if v2 else F.npu_fused_infer_attention_score
    query = call["query"]
    args = {k: v for k, v in call.items() if k not in ("query", "key", "value")}
    out, lse = op(query, call["key"], call["value"], **args)
    expected_out, expected_lse = fused_attention(call, v2=v2)
    _close(out, expected_out, query.dtype)
    flag = call["return_softmax_lse" if v2 else "softmax_lse_flag"]
    if flag:
        _lse_close(lse, expected_lse)
    else:
        assert lse.shape == (1,) and float(lse) == 0.0
    # .out writes the same into the caller's buffers, with a workspace from the query
    workspace_query = (F._npu_fused_infer_attention_score_v2_get_max_workspace if v2
                       else F._npu_fused_infer_attention_score_get_max_workspace)
    workspace = workspace_query(query, call["key"], call["value"], **args)
    out_buffer = torch.full_like(out, float("nan"))
    lse_buffer = torch.full_like(lse, float("nan")) if flag else torch.empty(1, dtype=query.dtype)
    op.out(query, call["key"], call["value"], **args, workspace=workspace, attention_out=out_buffer, softmax_lse=lse_buffer)
    assert torch.equal(out_buffer, out)
    if flag:
        assert torch.equal(lse_buffer, lse)


@FAST
@given(fused_calls())
def test_fused_attention_matches_the_op_docs_reference(case: tuple[dict[str, Any], bool]) -> None:
    check_against_reference(*case)


@pytest.mark.slow
@SLOW
@given(fused_calls())
def test_fused_attention_matches_the_op_docs_reference_many_examples(case: tuple[dict[str, Any], bool]) -> None:
    check_against_reference(*case)


def _mla_prefill_call(**changes: Any) -> dict[str, Any]:
    """vLLM Ascend's MLA prefill call (attention/mla_v1.py@182b75ea:1256-1282): TND, unpaged,
    as many KV heads as query heads, the rope parts (D 64) beside the nope parts."""
    t, n = 5, 4
    call: dict[str, Any] = dict(
        query=torch.zeros(t, n, 16, dtype=torch.bfloat16), key=torch.zeros(t, n, 16, dtype=torch.bfloat16),
        value=torch.zeros(t, n, 16, dtype=torch.bfloat16), query_rope=torch.zeros(t, n, 64, dtype=torch.bfloat16),
        key_rope=torch.zeros(t, n, 64, dtype=torch.bfloat16), atten_mask=MASK_2048, actual_seq_lengths=[3, 5],
        actual_seq_lengths_kv=[3, 5], num_heads=n, num_key_value_heads=n, scale=0.25, input_layout="TND",
        sparse_mode=3, softmax_lse_flag=True)
    call.update(changes)
    return call


def test_mla_rope_inputs_are_checked_before_the_call_is_refused_as_not_modelled() -> None:
    # key_rope as vLLM Ascend's MLA prefill makes it without its copy: one head broadcast over
    # the heads (mla_v1.py@182b75ea:1600-1601), a stride-0 view the op doc refuses (:8106).
    call = _mla_prefill_call(key_rope=torch.zeros(5, 1, 64, dtype=torch.bfloat16).expand(5, 4, 64))
    query = call.pop("query")
    with pytest.raises(kernel_contracts.KernelContractError) as refused:
        F.npu_fused_infer_attention_score(query, call.pop("key"), call.pop("value"), **call)
    assert refused.value.rules == ("rope_contiguous",)
    assert "query_rope or key_rope is not contiguous" in str(refused.value) and ":8105-8106" in str(refused.value)
    # In contract, the call reaches the kernel, which does not compute MLA's rope inputs.
    call = _mla_prefill_call()
    assert _violations(call, v2=False) == []
    query = call.pop("query")
    with pytest.raises(NotImplementedError, match="query_rope, key_rope"):
        F.npu_fused_infer_attention_score(query, call.pop("key"), call.pop("value"), **call)
