"""ascendgraph's FX pattern matcher against torch's inductor pattern matcher, which the fusion
passes used before (tests/inductor_reference.py): the same graph after the passes — node by
node: op, name, target, arguments, fake value, stream label, copied meta — for the graph the
backend hands to the passes for every model preset (bfloat16 and float32, W8A8 dynamic and
static), and for hand-built graphs that hit each rule of ascendgraph/compile/passes/matcher.py
and rewrite.py."""

from __future__ import annotations

import copy
import inspect
from typing import Any, Callable

import pytest
import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

import sim  # noqa: F401  (CPU kernels of the ascendgraph ops)
from ascendgraph.compile.passes import STREAM_LABEL_KEY, patterns
from ascendgraph.compile.passes.fusion import FusionPass, Pattern, PatternFamily, meta_tensor
from ascendgraph.compile.passes.matcher import trace
from tests.inductor_reference import InductorFusionPass, inductor_trace, with_inductor

ag = torch.ops.ascendgraph
aten = torch.ops.aten
H = 64
EPS = (1e-6, 1e-5)


# --------------------------------------------------------------------------- comparison


def _value_signature(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(map(str, value.shape)), tuple(map(str, value.stride())), value.dtype, value.device)
    if isinstance(value, (tuple, list)):
        return tuple(_value_signature(v) for v in value)
    return repr(value)


# meta a replacement's nodes take from the traced replacement and from the nodes they replace
COMPARED_META = ("custom", "stack_trace", "nn_module_stack", "source_fn_stack", "original_aten", "seq_nr")


def _signature(gm: fx.GraphModule) -> list[tuple[Any, ...]]:
    """Everything the two matchers must agree on, per node (inductor's own bookkeeping key
    ``mutation_region_id`` aside)."""
    rows = []
    for node in gm.graph.nodes:
        keys = sorted(k for k in node.meta if k != "mutation_region_id")
        rows.append((
            node.op, node.name, str(node.target), str(node.args), str(node.kwargs), len(node.users),
            _value_signature(node.meta.get("val")), node.meta.get(STREAM_LABEL_KEY, "-"),
            keys, *(repr(node.meta.get(key)) for key in COMPARED_META),
        ))
    return rows


def _both(gm: fx.GraphModule, make_passes: Callable[[], list[Any]]) -> tuple[list[int], fx.GraphModule]:
    """Run the passes with ascendgraph's matcher and with inductor's on copies of ``gm``; assert the
    same counts and graphs; return the counts and our graph."""
    ours, theirs = copy.deepcopy(gm), copy.deepcopy(gm)
    our_counts = [int(p(ours)) for p in make_passes()]
    their_counts = [int(p(theirs)) for p in with_inductor(make_passes())]
    for graph_module in (ours, theirs):
        graph_module.graph.lint()
        graph_module.recompile()
    assert our_counts == their_counts
    assert ours.code == theirs.code
    assert _signature(ours) == _signature(theirs)
    return our_counts, ours


def _fusion(*families: PatternFamily) -> Callable[[], list[Any]]:
    return lambda: [FusionPass("fusion", list(families))]


def _inputs(*shapes: tuple[int, ...], dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(shape, generator=generator).to(dtype) for shape in shapes]


def _graph(fn: Callable[..., Any], *args: Any, mode: str = "fake") -> fx.GraphModule:
    return make_fx(fn, tracing_mode=mode)(*args)


# --------------------------------------------------------------------------- traced patterns

ALL_FAMILIES = [
    patterns.rms_norm_family(EPS),
    patterns.add_rms_norm_family(EPS),
    patterns.add_rms_norm_dynamic_quant_family(EPS),
    patterns.add_rms_norm_quant_family(EPS),
    patterns.split_qkv_rmsnorm_rope_family(EPS, num_heads=4, num_kv_heads=2, head_dim=128),
    patterns.muls_add_family(),
]


@pytest.mark.parametrize("family", ALL_FAMILIES, ids=[f.name for f in ALL_FAMILIES])
def test_every_search_function_traces_to_the_graph_inductors_fwd_only_gives(family):
    # fwd_only also removes no-op ops (torch/_inductor/fx_passes/post_grad.py remove_noop_ops);
    # ours does not, so no pattern may contain one
    for pattern in family.patterns():
        argnames = list(inspect.signature(pattern.search).parameters)
        workaround = pattern.scalar_workaround or {}
        examples = iter(pattern.example_inputs())
        args = [workaround[name] if name in workaround else next(examples) for name in argnames]
        assert trace(pattern.search, args).code == inductor_trace(pattern.search, args).code, pattern.name


# --------------------------------------------------------------------------- the backend's graphs


def _backend_graph(preset: str, dtype: torch.dtype, quantization: Any, mode: str, layers: int = 2) -> fx.GraphModule:
    """The aten graph the backend hands to the pass manager (``layers`` decoder layers of the preset)."""
    from ascendgraph.compile import AscendGraphBackend, CompiledModel, PassManager
    from ascendgraph.compile.graph_wrapper import CaptureState
    from ascendgraph.config import GraphConfig
    from ascendgraph.models.build import build_model
    from ascendgraph.models.presets import PRESETS
    from ascendgraph.resolve import resolve
    from tests.unit.test_passes_tiny import _forward as forward

    recorded: list[fx.GraphModule] = []

    class Record:
        name = "record"

        def __call__(self, graph_module: fx.GraphModule) -> int:
            recorded.append(copy.deepcopy(graph_module))
            return 0

    spec = PRESETS[preset].with_layers(layers)
    resolution = resolve(GraphConfig.from_vllm_args(compilation_config={"cudagraph_mode": mode}, model=spec))
    model = build_model(spec, seed=0, dtype=dtype, quantization=quantization)
    backend = AscendGraphBackend(
        mode=resolution.mode, attention_split=resolution.attention_split, capture_state=CaptureState(device=None),
        pass_manager=PassManager(passes=[Record()], use_cache=False),
    )
    forward(CompiledModel(model, backend), model, 5)  # one forward of 5 tokens compiles the model
    assert recorded, "the backend handed no graph to the pass manager"
    return recorded[0]


def _preset_passes(preset: str, mode: str) -> Callable[[], list[Any]]:
    from ascendgraph.compile.passes import build_passes
    from ascendgraph.config import GraphConfig
    from ascendgraph.models.presets import PRESETS
    from ascendgraph.resolve import resolve

    spec = PRESETS[preset].with_layers(2)
    resolution = resolve(GraphConfig.from_vllm_args(compilation_config={"cudagraph_mode": mode}, model=spec))
    return lambda: [p for p in build_passes(resolution) if p.name != "static_kernel"]


BACKEND_CASES = {
    # id: (dtype, quantization, mode): every fusion family meets the graphs it is written for
    "bf16": (torch.bfloat16, None, "FULL_DECODE_ONLY"),
    "fp32-w8a8": (torch.float32, "w8a8", "FULL_DECODE_ONLY"),
    "bf16-w8a8-dynamic": (torch.bfloat16, "w8a8_dynamic", "FULL_DECODE_ONLY"),
    "bf16-piecewise": (torch.bfloat16, None, "PIECEWISE"),
}


def _backend_params() -> list[Any]:
    """By default, one graph per pattern family: tiny in bf16 W8A8 dynamic (add_rms_norm, its
    dynamic quant, q/k norm + rope), tiny in float32 W8A8 (the static quant family) and tiny-mla
    in bf16 W8A8 dynamic (MLA's norms). With -m slow (.ci/run's step 1b): every other preset and
    case, the full-size presets (the same architectures, wider: 5 s each) and the piecewise
    subset of the passes on the same graph."""
    from ascendgraph.models.presets import PRESETS

    by_default = {("tiny", "bf16-w8a8-dynamic"), ("tiny", "fp32-w8a8"), ("tiny-mla", "bf16-w8a8-dynamic")}

    return [
        pytest.param(preset, case, id=f"{preset}-{case}", marks=() if (preset, case) in by_default else (pytest.mark.slow,))
        for preset in PRESETS for case in BACKEND_CASES
    ]


@pytest.fixture(autouse=True)
def _float32_kernels_are_a_declared_leniency():
    from sim.kernels import unchecked

    with unchecked():
        yield


@pytest.mark.parametrize("preset, case", _backend_params())
def test_the_backends_graph_of_every_preset_fuses_as_with_inductors_matcher(preset, case):
    dtype, quantization, mode = BACKEND_CASES[case]
    graph = _backend_graph(preset, dtype, quantization, mode)
    counts, _ = _both(graph, _preset_passes(preset, mode))
    if preset == "tiny" and case == "bf16-w8a8-dynamic":
        assert sum(counts) > 0, "the comparison covers replaced matches, not only refusals"


# --------------------------------------------------------------------------- hand-built graphs


def test_a_literal_that_differs_is_no_match():
    x, r, w = _inputs((4, H), (4, H), (H,))
    counts, _ = _both(_graph(lambda x, r, w: ag.rms_norm(x + r, w, 3e-7), x, r, w),
                      _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [0]

    def norm_over_dim0(x, w):
        xf = x.float()
        return xf * torch.rsqrt(xf.pow(2).mean(0, keepdim=True) + 1e-6) * w

    counts, _ = _both(_graph(norm_over_dim0, x, w), _fusion(patterns.rms_norm_family(EPS)))
    assert counts == [0]


def test_an_intermediate_used_outside_the_match_is_refused():
    x, r, w = _inputs((4, H), (4, H), (H,))

    def variance_escapes(x, w):
        variance = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(variance + 1e-6) * w, variance

    counts, _ = _both(_graph(variance_escapes, x, w), _fusion(patterns.rms_norm_family(EPS)))
    assert counts == [0]

    def product_shared(x, y, z):
        m = x * 0.5
        return m + y, m + z

    counts, _ = _both(_graph(product_shared, x, r, r * 2), _fusion(patterns.muls_add_family()))
    assert counts == [0]

    def normed_beside_the_quant(x, r, w):
        normed = ag.add_rms_norm(x, r, w, 1e-6)
        quant = ag.dynamic_quant(normed[0])
        return quant[0], quant[1], normed[0] * 2

    counts, _ = _both(_graph(normed_beside_the_quant, x, r, w), _fusion(patterns.add_rms_norm_dynamic_quant_family(EPS)))
    assert counts == [0]


def _same_scale_family() -> PatternFamily:
    """``x * s + y * s`` -> ``(x + y) * s``: the scalar workaround binds ``s`` at two places."""

    def search(x, y, scale):
        return x * scale + y * scale

    def replace(x, y, scale):
        return (x + y) * scale

    pattern = Pattern("same_scale", search, replace, lambda: [meta_tensor(8, 16), meta_tensor(8, 16)],
                      scalar_workaround={"scale": 0.375})
    return PatternFamily("same_scale", (aten.mul.Tensor,), lambda: [pattern])


def test_a_search_argument_binds_one_value():
    x, y, w = _inputs((4, H), (4, H), (H,))
    counts, _ = _both(_graph(lambda x, y: x * 0.5 + y * 0.5, x, y), _fusion(_same_scale_family()))
    assert counts == [1]
    counts, _ = _both(_graph(lambda x, y: x * 0.5 + y * 0.75, x, y), _fusion(_same_scale_family()))
    assert counts == [0]

    def two_tensors_where_the_norm_reads_one(x, y, w):
        return x * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    counts, _ = _both(_graph(two_tensors_where_the_norm_reads_one, x, y, w), _fusion(patterns.rms_norm_family(EPS)))
    assert counts == [0]


def test_overlapping_candidates_are_replaced_once():
    x, r, w1, w2 = _inputs((4, H), (4, H), (H,), (H,))

    def one_sum_two_norms(x, r, w1, w2):
        s = x + r
        return ag.rms_norm(s, w1, 1e-6), ag.rms_norm(s, w2, 1e-6)

    counts, gm = _both(_graph(one_sum_two_norms, x, r, w1, w2), _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [1]
    assert sum(1 for n in gm.graph.nodes if n.target is ag.add_rms_norm.default) == 1


def test_multi_output_patterns_keep_every_output():
    x, r, w1, w2 = _inputs((4, H), (4, H), (H,), (H,))

    def two_residual_norms(x, r, w1, w2):
        s1 = x + r
        h = ag.rms_norm(s1, w1, 1e-6) * 2.0
        s2 = h + s1
        return ag.rms_norm(s2, w2, 1e-5), s2

    gm = _graph(two_residual_norms, x, r, w1, w2)
    for node in gm.graph.nodes:  # the replacement's outputs take the replaced outputs' copyable meta
        node.meta.update(stack_trace=f"line of {node.name}", nn_module_stack={node.name: ("model.layer", "Layer")})
    counts, _ = _both(gm, _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [2]

    def norm_then_quant(x, r, w):
        normed = ag.add_rms_norm(x, r, w, 1e-6)
        quant = ag.dynamic_quant(normed[0])
        return quant[0], quant[1], normed[1]

    counts, _ = _both(_graph(norm_then_quant, x, r, w1), _fusion(patterns.add_rms_norm_dynamic_quant_family(EPS)))
    assert counts == [1]


@pytest.mark.parametrize(
    "layout", [(4, 2, 128, ()), (4, 2, 128, (1,)), (4, 2, 64, ()), (2, 2, 128, ())],
    ids=["fits", "fits_with_a_unit_dim", "head_dim_64", "other_heads"],
)
@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_int_and_list_wildcards_are_checked_by_the_pattern(layout, mode):
    # a size list is one wildcard whatever its length; the pattern's check looks at the shapes
    heads, kv_heads, head_dim, unit = layout
    q, kv = heads * head_dim, kv_heads * head_dim

    def qk_norm_rope(qkv, qw, kw, positions, cache):
        tokens = qkv.shape[0]
        qs, ks, vs = qkv.split([q, kv, kv], dim=-1)
        qn = ag.rms_norm(qs.view(tokens, heads, *unit, head_dim), qw, 1e-6).view(tokens, q)
        kn = ag.rms_norm(ks.view(tokens, kv_heads, *unit, head_dim), kw, 1e-6).view(tokens, kv)
        qr, kr = ag.rotary_embedding(positions, qn, kn, cache, head_dim, True)
        return qr, kr, vs

    args = [torch.randn(5, q + 2 * kv).bfloat16(), torch.randn(head_dim).bfloat16(), torch.randn(head_dim).bfloat16(),
            torch.arange(5), torch.randn(64, head_dim)]
    family = patterns.split_qkv_rmsnorm_rope_family(EPS, num_heads=4, num_kv_heads=2, head_dim=128)
    counts, _ = _both(_graph(qk_norm_rope, *args, mode=mode), _fusion(family))
    assert counts == [1 if (heads, kv_heads, head_dim) == (4, 2, 128) else 0]


@pytest.mark.parametrize("scale", [0.5, 2, -3.25])
def test_the_scalar_workaround_binds_any_scale(scale):
    x, y = _inputs((4, H), (4, H))
    counts, gm = _both(_graph(lambda x, y: (x * scale + y, y + x * scale), x, y), _fusion(patterns.muls_add_family()))
    assert counts == [2]
    assert [n.args[2] for n in gm.graph.nodes if n.target is ag.muls_add.default] == [scale, scale]


@pytest.mark.parametrize("labels", [(None, None), ("s1", "s1"), ("s1", "s2"), (None, "s1")])
def test_the_stream_scope_refusal_and_the_fused_nodes_label(labels):
    x, r, w = _inputs((4, H), (4, H), (H,))
    gm = _graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), x, r, w)
    for node in gm.graph.nodes:
        if node.target is aten.add.Tensor:
            node.meta[STREAM_LABEL_KEY] = labels[0]
        if node.target is ag.rms_norm.default:
            node.meta[STREAM_LABEL_KEY] = labels[1]
    counts, _ = _both(gm, _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [int(labels[0] == labels[1])]


def test_a_match_across_a_mutating_op_or_two_custom_streams_is_refused():
    x, r, w, buf = _inputs((4, H), (4, H), (H,), (4,))

    def mutation_between(x, r, w, buf):
        s = x + r
        buf.add_(1.0)
        return ag.rms_norm(s, w, 1e-6)

    counts, _ = _both(_graph(mutation_between, x, r, w, buf), _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [0]
    gm = _graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), x, r, w)
    for node in gm.graph.nodes:
        if node.target is aten.add.Tensor:
            node.meta["custom"] = {"stream": 1}
    counts, _ = _both(gm, _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [0]


def test_anchors_on_the_meta_device_are_left_alone():
    x, r, w = (torch.empty(4, H, device="meta"), torch.empty(4, H, device="meta"), torch.empty(H, device="meta"))
    counts, _ = _both(_graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), x, r, w),
                      _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [0]


def test_the_reference_really_is_inductors_matcher():
    fusion = with_inductor([FusionPass("add_rms_norm", [patterns.add_rms_norm_family(EPS)])])[0]
    x, r, w = _inputs((4, H), (4, H), (H,))
    assert isinstance(fusion, InductorFusionPass)
    assert fusion(_graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), x, r, w)) == 1
    assert type(fusion._matcher).__module__ == "torch._inductor.pattern_matcher"


def _cast_then_mul_family() -> PatternFamily:
    """``x.to(dtype) * y`` with the cast's dtype keyword a wildcard (traced from bfloat16)."""

    def search(x, y):
        return x.to(torch.float32) * y

    def replace(x, y):
        return y * x

    pattern = Pattern("cast_then_mul", search, replace,
                      lambda: [meta_tensor(8, 16, dtype=torch.bfloat16), meta_tensor(8, 16)],
                      ignore_types=(torch.dtype,))
    return PatternFamily("cast_then_mul", (aten.mul.Tensor,), lambda: [pattern])


def test_a_node_without_a_keyword_the_pattern_names_is_normalised_to_the_schema():
    # the graph's _to_copy passes no dtype; normalised, dtype=None meets the pattern's wildcard
    x, y = _inputs((4, H), (4, H))
    gm = _graph(lambda x, y: aten._to_copy.default(x) * y, x, y)
    assert [n.kwargs for n in gm.graph.nodes if n.target is aten._to_copy.default] == [{}]
    counts, gm = _both(gm, _fusion(_cast_then_mul_family()))
    assert counts == [1]
    assert not any(n.target is aten._to_copy.default for n in gm.graph.nodes)


def _mean_then_add_family() -> PatternFamily:
    """``mean(x, [-1], keepdim=True) + y`` with int literals wildcards; keepdim (a bool) is not one."""

    def search(x, y):
        return aten.mean.dim(x, [-1], True) + y

    def replace(x, y):
        return y + aten.mean.dim(x, [-1], True)

    pattern = Pattern("mean_then_add", search, replace, lambda: [meta_tensor(8, 16), meta_tensor(8, 1)],
                      ignore_types=(int,))
    return PatternFamily("mean_then_add", (aten.add.Tensor,), lambda: [pattern])


def test_a_bool_literal_is_no_int_wildcard():
    x, y = _inputs((4, H), (4, 1))
    counts, _ = _both(_graph(lambda x, y: aten.mean.dim(x, [-2], True) + y, x, y), _fusion(_mean_then_add_family()))
    assert counts == [1], "the int inside the dim list is a wildcard"
    z = _inputs((4,))[0]
    gm = _graph(lambda x, z: aten.mean.dim(x, [-1], False) + z, x, z)
    (mean,) = [n for n in gm.graph.nodes if n.target is aten.mean.dim]
    mean.args = (*mean.args[:2], False)  # make_fx drops a default keepdim=False; spell it out
    counts, _ = _both(gm, _fusion(_mean_then_add_family()))
    assert counts == [0]


def test_activation_checkpointing_tags_spread_over_the_replacement():
    from torch.utils.checkpoint import CheckpointPolicy

    x, r, w = _inputs((4, H), (4, H), (H,))
    gm = _graph(lambda x, r, w: ag.rms_norm(x + r, w, 1e-6), x, r, w)
    for node in gm.graph.nodes:
        if node.target is ag.rms_norm.default:
            node.meta.update(recompute=CheckpointPolicy.PREFER_RECOMPUTE, ac_graph_id=3)
    counts, gm = _both(gm, _fusion(patterns.add_rms_norm_family(EPS)))
    assert counts == [1]
    (fused,) = [n for n in gm.graph.nodes if n.target is ag.add_rms_norm.default]
    assert (fused.meta.get("recompute"), fused.meta.get("ac_graph_id")) == (CheckpointPolicy.PREFER_RECOMPUTE, 3)
    assert not any("recompute" in n.meta for n in gm.graph.nodes if n.op == "placeholder")


def _sum_families() -> PatternFamily:
    """Two registrations on the add anchor: ``(x + y) + z`` first, then the bare ``x + y``."""

    def sum3(x, y, z):
        return (x + y) + z

    def sum3_replace(x, y, z):
        return aten.sum.dim_IntList(torch.stack([x, y, z]), [0])

    def pair(x, y):
        return x + y

    def pair_replace(x, y):
        return x - (-y)

    return PatternFamily("sums", (aten.add.Tensor,), lambda: [
        Pattern("sum3", sum3, sum3_replace, lambda: [meta_tensor(8, 16) for _ in range(3)]),
        Pattern("pair", pair, pair_replace, lambda: [meta_tensor(8, 16) for _ in range(2)]),
    ])


def test_an_anchor_erased_by_an_earlier_replacement_is_skipped():
    # sum3 replaces at the last add and erases it and the first add (anchors of the same sweep):
    # neither is tried again, by pair at the same anchor or as an anchor of its own
    x, y, z = _inputs((4, H), (4, H), (4, H))
    counts, gm = _both(_graph(lambda x, y, z: (x + y) + z, x, y, z), _fusion(_sum_families()))
    assert counts == [1]
    assert [str(n.target) for n in gm.graph.nodes if n.op == "call_function"] == ["aten.stack.default", "aten.sum.dim_IntList"]
