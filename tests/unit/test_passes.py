"""The npugraph_ex passes on hand-built FX graphs: each fusion, its limits, the stream-scope rule."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import sim  # noqa: F401  (CPU kernels of the ascendgraph ops)
from ascendgraph.compile.passes import STREAM_LABEL_KEY, NoopEliminationPass, same_stream_scope
from ascendgraph.compile.passes import patterns
from ascendgraph.compile.passes.fusion import FusionPass

ag = torch.ops.ascendgraph
aten = torch.ops.aten
H = 64


def _graph(fn, *args, mode: str = "fake") -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode=mode)(*args)


def _calls(gm: torch.fx.GraphModule, op) -> list[torch.fx.Node]:
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target is op]


def _run(gm: torch.fx.GraphModule, fusion: FusionPass) -> int:
    count = fusion(gm)
    gm.graph.lint()
    gm.recompile()
    return count


def _inputs(*shapes, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


def _add_norm_pass(eps=(1e-6,)) -> FusionPass:
    return FusionPass("add_rms_norm", [patterns.add_rms_norm_family(eps)])


def _two_residual_norms(x, r, w1, w2):
    s1 = x + r
    h = ag.rms_norm(s1, w1, 1e-6) * 2.0
    s2 = h + s1
    return ag.rms_norm(s2, w2, 1e-6), s2


# --------------------------------------------------------------------------- stream scope


@pytest.mark.parametrize(
    "labels, fused",
    [
        ([None, None], True),
        (["s1", "s1"], True),
        (["s1", "s2"], False),
        ([None, "s1"], False),
        (["s1", None], False),
        ([], True),
    ],
)
def test_same_stream_scope_accepts_one_stream_and_refuses_mixed_labels(labels, fused):
    assert same_stream_scope(labels) is fused


@pytest.mark.parametrize(
    "add_label, norm_label, fused",
    [(None, None, 1), ("s1", "s1", 1), ("s1", "s2", 0), (None, "s1", 0)],
)
def test_a_candidate_whose_nodes_sit_on_different_streams_is_left_unfused(add_label, norm_label, fused):
    x, r, w = _inputs((4, H), (4, H), (H,))
    gm = _graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), x, r, w)
    for node in _calls(gm, aten.add.Tensor):
        node.meta[STREAM_LABEL_KEY] = add_label
    for node in _calls(gm, ag.rms_norm.default):
        node.meta[STREAM_LABEL_KEY] = norm_label
    assert _run(gm, _add_norm_pass()) == fused
    assert len(_calls(gm, ag.add_rms_norm.default)) == fused
    assert len(_calls(gm, ag.rms_norm.default)) == 1 - fused
    if fused and add_label is not None:
        (node,) = _calls(gm, ag.add_rms_norm.default)
        assert node.meta[STREAM_LABEL_KEY] == add_label, "the fused node stays on the matched nodes' stream"


# --------------------------------------------------------------------------- add + rms_norm


def test_add_rms_norm_fuses_each_residual_add_and_keeps_both_outputs():
    args = _inputs((5, H), (5, H), (H,), (H,))
    gm = _graph(_two_residual_norms, *args)
    before = copy.deepcopy(gm)
    assert _run(gm, _add_norm_pass()) == 2
    assert not _calls(gm, ag.rms_norm.default) and len(_calls(gm, ag.add_rms_norm.default)) == 2
    for got, want in zip(gm(*args), before(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_norm_patterns_match_their_own_eps_only():
    args = _inputs((4, H), (4, H), (H,))
    gm = _graph(lambda x, r, w: ag.rms_norm(x + r, w, 3e-7), *args)
    assert _run(gm, _add_norm_pass((1e-6, 1e-5))) == 0, "eps 3e-7 has no registered pattern"
    gm = _graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-5), *args)
    fusion = _add_norm_pass((1e-6, 1e-5))
    assert _run(gm, fusion) == 1
    (node,) = _calls(gm, ag.add_rms_norm.default)
    assert node.args[3] == 1e-5, "the replacement carries the matched eps"


def test_each_pattern_is_registered_once_per_eps_per_pass_instance():
    args = _inputs((4, H), (4, H), (H,))
    fusion = _add_norm_pass((1e-6, 1e-5, 1e-6))
    for _ in range(2):
        _run(_graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), *args), fusion)
    assert fusion.registered == ["add_rms_norm[eps=1e-06]", "add_rms_norm[eps=1e-05]"]
    other = _add_norm_pass()
    assert other.registered == [] and other._matcher is None, "a new pass instance starts empty"


def test_patterns_are_registered_only_for_graphs_that_call_their_anchor_op():
    x, y = _inputs((4, H), (4, H))
    fusion = FusionPass("add_rms_norm", [patterns.add_rms_norm_family((1e-6,))])
    assert _run(_graph(lambda x, y: x + y, x, y), fusion) == 0
    assert fusion.registered == []


def test_an_add_whose_operands_broadcast_is_not_fused():
    x, r, w = _inputs((4, H), (H,), (H,))
    gm = _graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), x, r, w)
    assert _run(gm, _add_norm_pass()) == 0


# --------------------------------------------------------------------------- decomposed rms_norm


def _weight_last(x, w):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(x.dtype)


def _weight_first(x, w):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


@pytest.mark.parametrize("form", [_weight_last, _weight_first], ids=["weight-last", "hf-weight-first"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_decomposed_rms_norm_becomes_the_rms_norm_kernel(form, dtype):
    x, w = _inputs((6, H), (H,), dtype=dtype)
    gm = _graph(form, x, w)
    before = copy.deepcopy(gm)
    fusion = FusionPass("rms_norm", [patterns.rms_norm_family((1e-6,))])
    assert _run(gm, fusion) == 1
    assert [n.target for n in gm.graph.nodes if n.op == "call_function"] == [ag.rms_norm.default]
    if dtype is torch.float32:  # the kernel computes in float32: the same products, bit for bit
        torch.testing.assert_close(gm(x, w), before(x, w), rtol=0, atol=0)
    else:  # weight-first rounds to the dtype before the weight product: within the dtype's tolerance
        torch.testing.assert_close(gm(x, w), before(x, w))


def test_a_norm_over_another_dim_is_not_an_rms_norm():
    x, w = _inputs((6, H), (6, 1))
    gm = _graph(lambda x, w: x * torch.rsqrt(x.pow(2).mean(0, keepdim=True) + 1e-6) * w, x, w)
    assert _run(gm, FusionPass("rms_norm", [patterns.rms_norm_family((1e-6,))])) == 0


# --------------------------------------------------------------------------- add_rms_norm + quant


def _norm_then_dynamic_quant(x, r, w):
    y, total = ag.add_rms_norm(x, r, w, 1e-6)
    q, scale = ag.dynamic_quant(y)
    return q, scale, total * 1.0


def _norm_then_dynamic_quant_no_sum(x, r, w):
    y, _ = ag.add_rms_norm(x, r, w, 1e-6)
    return ag.dynamic_quant(y)


@pytest.mark.parametrize("fn", [_norm_then_dynamic_quant, _norm_then_dynamic_quant_no_sum], ids=["sum-used", "sum-unused"])
def test_add_rms_norm_then_dynamic_quant_fuses_bit_exactly(fn):
    args = _inputs((5, H), (5, H), (H,))
    gm = _graph(fn, *args)
    before = copy.deepcopy(gm)
    fusion = FusionPass("add_rms_norm_dynamic_quant", [patterns.add_rms_norm_dynamic_quant_family((1e-6,))])
    assert _run(gm, fusion) == 1
    assert not _calls(gm, ag.dynamic_quant.default) and not _calls(gm, ag.add_rms_norm.default)
    for got, want in zip(gm(*args), before(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_norm_output_used_beside_the_quant_is_not_fused():
    args = _inputs((5, H), (5, H), (H,))

    def fn(x, r, w):
        y, total = ag.add_rms_norm(x, r, w, 1e-6)
        q, scale = ag.dynamic_quant(y)
        return q, scale, y + 1.0, total

    gm = _graph(fn, *args)
    fusion = FusionPass("add_rms_norm_dynamic_quant", [patterns.add_rms_norm_dynamic_quant_family((1e-6,))])
    assert _run(gm, fusion) == 0


@pytest.mark.parametrize("with_offset", [False, True])
def test_add_rms_norm_then_static_quantize_fuses(with_offset):
    x, r, w = _inputs((5, H), (5, H), (H,))
    scale = torch.full((H,), 0.03)
    offset = torch.full((H,), 2, dtype=torch.int8) if with_offset else None

    def fn(x, r, w, scale, *rest):
        y, total = ag.add_rms_norm(x, r, w, 1e-6)
        return ag.quantize(y, scale, rest[0] if rest else None), total

    args = [x, r, w, scale] + ([offset] if with_offset else [])
    gm = _graph(fn, *args)
    before = copy.deepcopy(gm)
    fusion = FusionPass("add_rms_norm_quant", [patterns.add_rms_norm_quant_family((1e-6,))])
    assert _run(gm, fusion) == 1
    (node,) = _calls(gm, ag.add_rms_norm_quant.default)
    assert (node.args[4] is None) is (not with_offset)
    for got, want in zip(gm(*args), before(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_a_quant_scale_of_another_shape_than_the_norm_weight_is_not_fused():
    x, r, w = _inputs((5, H), (5, H), (H,))
    scale = torch.full((1,), 0.03)
    gm = _graph(lambda x, r, w, s: ag.quantize(ag.add_rms_norm(x, r, w, 1e-6)[0], s, None), x, r, w, scale)
    fusion = FusionPass("add_rms_norm_quant", [patterns.add_rms_norm_quant_family((1e-6,))])
    assert _run(gm, fusion) == 0


# --------------------------------------------------------------------------- q/k norm + rope


def _qkv_block(num_heads, num_kv_heads, head_dim):
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim

    def fn(qkv, q_w, k_w, positions, cache):
        tokens = qkv.shape[0]
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = ag.rms_norm(q.view(tokens, num_heads, head_dim), q_w, 1e-6).view(tokens, q_size)
        k = ag.rms_norm(k.view(tokens, num_kv_heads, head_dim), k_w, 1e-6).view(tokens, kv_size)
        q, k = ag.rotary_embedding(positions, q, k, cache, head_dim, True)
        return q * 1.0, k * 1.0, v * 1.0

    return fn


def _qkv_inputs(tokens, num_heads, num_kv_heads, head_dim, dtype):
    generator = torch.Generator().manual_seed(1)
    width = (num_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(tokens, width, generator=generator).to(dtype)
    q_w = (1 + 0.1 * torch.randn(head_dim, generator=generator)).to(dtype)
    k_w = (1 + 0.1 * torch.randn(head_dim, generator=generator)).to(dtype)
    positions = torch.arange(tokens)
    cache = torch.randn(32, head_dim, generator=generator)
    return [qkv, q_w, k_w, positions, cache]


def _qknorm_pass(num_heads=4, num_kv_heads=2, head_dim=128) -> FusionPass:
    family = patterns.split_qkv_rmsnorm_rope_family(
        (1e-6,), num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim
    )
    return FusionPass("split_qkv_rmsnorm_rope", [family])


@pytest.mark.parametrize("tracing", ["fake", "symbolic"])
def test_qk_norm_and_rope_after_a_qkv_split_become_one_kernel_in_bfloat16(tracing):
    args = _qkv_inputs(5, 4, 2, 128, torch.bfloat16)
    gm = _graph(_qkv_block(4, 2, 128), *args, mode=tracing)
    before = copy.deepcopy(gm)
    assert _run(gm, _qknorm_pass()) == 1
    assert not _calls(gm, ag.rotary_embedding.default) and not _calls(gm, aten.split_with_sizes.default)
    for got, want in zip(gm(*args), before(*args)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_qk_norm_rope_fusion_is_bfloat16_only():
    args = _qkv_inputs(5, 4, 2, 128, torch.float32)
    gm = _graph(_qkv_block(4, 2, 128), *args)
    assert _run(gm, _qknorm_pass()) == 0


def test_qk_norm_rope_fusion_needs_the_models_head_layout():
    args = _qkv_inputs(5, 2, 4, 128, torch.bfloat16)  # 2 query heads, 4 kv heads: not the registered 4/2
    gm = _graph(_qkv_block(2, 4, 128), *args)
    assert _run(gm, _qknorm_pass(4, 2, 128)) == 0


def test_qk_norm_rope_fusion_needs_head_dim_128():
    args = _qkv_inputs(5, 4, 2, 64, torch.bfloat16)
    gm = _graph(_qkv_block(4, 2, 64), *args)
    assert _run(gm, _qknorm_pass(4, 2, 64)) == 0


# --------------------------------------------------------------------------- muls_add


@pytest.mark.parametrize(
    "fn, scale",
    [(lambda x, y: x * 2.5 + y, 2.5), (lambda x, y: y + x * 0.125, 0.125), (lambda x, y: x * 3 + y, 3)],
    ids=["x*s+y", "y+x*s", "int-scale"],
)
def test_x_times_a_scalar_plus_y_becomes_muls_add_with_that_scale(fn, scale):
    x, y = _inputs((4, H), (4, H))
    gm = _graph(fn, x, y)
    before = copy.deepcopy(gm)
    assert _run(gm, FusionPass("muls_add", [patterns.muls_add_family()])) == 1
    (node,) = _calls(gm, ag.muls_add.default)
    assert node.args[2] == scale
    torch.testing.assert_close(gm(x, y), before(x, y), rtol=0, atol=0)


@pytest.mark.parametrize(
    "fn",
    [lambda x, y: x * y + y, lambda x, y: x * 2.0 + y[0]],
    ids=["tensor-scale", "broadcast-y"],
)
def test_muls_add_needs_a_scalar_scale_and_same_shaped_operands(fn):
    x, y = _inputs((4, H), (4, H))
    gm = _graph(fn, x, y)
    assert _run(gm, FusionPass("muls_add", [patterns.muls_add_family()])) == 0


# --------------------------------------------------------------------------- no-op views


def test_noop_views_are_removed_and_real_reshapes_kept():
    x = torch.randn(6, H)
    gm = _graph(lambda x: (x.view(6, H) + 1).reshape(6, H).view(3, 2 * H) * 2, x)
    before = copy.deepcopy(gm)
    assert NoopEliminationPass()(gm) == 2
    gm.recompile()
    shapes = [tuple(n.meta["val"].shape) for n in gm.graph.nodes if n.target in (aten.view.default, aten.reshape.default)]
    assert shapes == [(3, 2 * H)]
    torch.testing.assert_close(gm(x), before(x), rtol=0, atol=0)


def test_noop_view_elimination_compares_symbolic_sizes():
    x = torch.randn(6, H)

    def fn(x):
        tokens = x.shape[0]
        return x.view(tokens, H) * 2, x.view(tokens * H)

    gm = _graph(fn, x, mode="symbolic")
    assert NoopEliminationPass()(gm) == 1, "[s0, 64] -> [s0, 64] is a no-op whatever s0 is; the flatten is not"


@pytest.fixture(autouse=True)
def _float32_kernels_are_a_declared_leniency():
    """These tests compare fused and unfused float32 numerics of the passes; a card takes
    float16/bfloat16 only, which tests/unit/test_kernel_contracts.py covers (docs/decisions.md "float32 on the simulator")."""
    from sim.kernels import unchecked

    with unchecked():
        yield
