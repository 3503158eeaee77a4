"""The npugraph_ex passes on the traced `tiny` model: match counts per decoder layer, same outputs.

Expected matches for L decoder layers (tiny is Qwen3-like: q/k norm, head_dim 128):

=============================  ==========================================================
pass                           matches
=============================  ==========================================================
add_rms_norm                   2L: layer 0 has its post-attention norm only (its input
                               norm follows the embedding, no add); layers 1..L-1 have the
                               input and the post-attention norm; the final norm is one more
split_qkv_rmsnorm_rope         L in bfloat16 (one per attention), 0 in float32
add_rms_norm_dynamic_quant     2L - 1 with w8a8_dynamic: every add_rms_norm but the final
                               norm feeds a quantised projection (qkv_proj, gate_up_proj)
add_rms_norm_quant             2L - 1 with w8a8 (static activation scale), likewise
rms_norm, muls_add, noop       0: the model calls the rms_norm kernel, has no x * s + y and
                               no no-op view
=============================  ==========================================================
"""

from __future__ import annotations

import pytest
import torch

from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.compile import AscendGraphBackend, CompiledModel, PassManager
from ascendgraph.config import GraphConfig
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, set_forward_context
from ascendgraph.models.build import build_model
from ascendgraph.models.presets import PRESETS
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import resolve

L = 3
ag = torch.ops.ascendgraph


@pytest.fixture(scope="module", autouse=True)
def _kernels_and_one_thread():
    import sim  # noqa: F401

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _forward(callable_, model, tokens: int) -> torch.Tensor:
    caches = model.make_kv_caches(2, 128)
    metadata = AttentionMetadata(
        num_reqs=1, num_actual_tokens=tokens, num_tokens=tokens, query_start_loc=[tokens], seq_lens=[tokens],
        block_table=torch.tensor([[0, 1]], dtype=torch.int32), slot_mapping=torch.arange(tokens),
    )
    context = ForwardContext(GraphMode.NONE, BatchDescriptor(tokens), metadata, caches, model.attention_layers)
    with torch.no_grad(), set_forward_context(context):
        return callable_(torch.arange(tokens) % model.spec.vocab_size, torch.arange(tokens))


def _compile(mode: str, dtype: torch.dtype, quantization=None):
    resolution = resolve(GraphConfig.from_vllm_args(compilation_config={"cudagraph_mode": mode}, num_layers=L))
    model = build_model(PRESETS["tiny"].with_layers(L), seed=0, dtype=dtype, quantization=quantization)
    pass_manager = PassManager.for_resolution(resolution)
    backend = AscendGraphBackend(
        mode=resolution.mode, attention_split=resolution.attention_split, capture_state=CaptureState(device=None),
        pass_manager=pass_manager,
    )
    compiled = CompiledModel(model, backend)
    got = _forward(compiled, model, 5)
    want = _forward(model, model, 5)
    return pass_manager, backend.artifacts[0].aten_graph, got, want


def _count(graph_module, op) -> int:
    return sum(1 for n in graph_module.graph.nodes if n.op == "call_function" and n.target is op)


ZERO = {"noop_elimination": 0, "rms_norm": 0, "muls_add": 0}
CASES = {
    # id: (mode, dtype, quantization, expected matches)
    "full-bf16": ("FULL_DECODE_ONLY", torch.bfloat16, None,
                  {**ZERO, "add_rms_norm": 2 * L, "add_rms_norm_dynamic_quant": 0, "add_rms_norm_quant": 0,
                   "split_qkv_rmsnorm_rope": L}),
    "full-fp32": ("FULL_DECODE_ONLY", torch.float32, None,
                  {**ZERO, "add_rms_norm": 2 * L, "add_rms_norm_dynamic_quant": 0, "add_rms_norm_quant": 0,
                   "split_qkv_rmsnorm_rope": 0}),
    "full-w8a8-dynamic": ("FULL", torch.bfloat16, "w8a8_dynamic",
                          {**ZERO, "add_rms_norm": 2 * L, "add_rms_norm_dynamic_quant": 2 * L - 1,
                           "add_rms_norm_quant": 0, "split_qkv_rmsnorm_rope": L}),
    "full-w8a8": ("FULL_DECODE_ONLY", torch.float32, "w8a8",
                  {**ZERO, "add_rms_norm": 2 * L, "add_rms_norm_dynamic_quant": 0, "add_rms_norm_quant": 2 * L - 1,
                   "split_qkv_rmsnorm_rope": 0}),
    "piecewise-bf16-w8a8-dynamic": ("PIECEWISE", torch.bfloat16, "w8a8_dynamic",
                                    {"noop_elimination": 0, "add_rms_norm": 2 * L,
                                     "add_rms_norm_dynamic_quant": 2 * L - 1, "add_rms_norm_quant": 0}),
}


def _check_the_fused_kernels_and_no_unfused_leftovers(graph, expected) -> None:
    fused_norms = expected["add_rms_norm"] - expected.get("add_rms_norm_dynamic_quant", 0) - expected.get(
        "add_rms_norm_quant", 0
    )
    assert _count(graph, ag.add_rms_norm.default) == fused_norms
    assert _count(graph, ag.add_rms_norm_dynamic_quant.default) == expected.get("add_rms_norm_dynamic_quant", 0)
    assert _count(graph, ag.add_rms_norm_quant.default) == expected.get("add_rms_norm_quant", 0)
    qk = expected.get("split_qkv_rmsnorm_rope", 0)
    assert _count(graph, ag.split_qkv_rmsnorm_rope.default) == qk
    assert _count(graph, ag.rotary_embedding.default) == L - qk
    # what stays unfused: layer 0's input norm (after the embedding), and per-head q/k norms without the fusion
    assert _count(graph, ag.rms_norm.default) == 1 + 2 * (L - qk)


@pytest.mark.parametrize("case", list(CASES))
def test_each_pass_replaces_the_expected_matches_per_decoder_layer_and_outputs_stay_equal(case):
    mode, dtype, quantization, expected = CASES[case]
    pass_manager, graph, got, want = _compile(mode, dtype, quantization)
    assert pass_manager.matches == expected
    _check_the_fused_kernels_and_no_unfused_leftovers(graph, expected)
    # fused kernels are the composition of the unfused ones: equal bit for bit
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_quantised_variants_hold_int8_valued_weights_and_quantise_the_activations():
    from ascendgraph.models.layers import W8A8Linear, make_linear

    model = build_model(PRESETS["tiny"].with_layers(1), seed=0, quantization="w8a8_dynamic")
    linears = [m for m in model.modules() if isinstance(m, W8A8Linear)]
    assert len(linears) == 4 and all(m.dynamic for m in linears)  # qkv, o, gate_up, down
    weight = linears[0].weight
    assert torch.equal(weight, weight.round()) and weight.abs().max() <= 127
    assert linears[0].weight_scale.dtype == torch.float32
    x = torch.randn(3, linears[0].in_features)
    reference = x @ (weight * linears[0].weight_scale.unsqueeze(1)).t()
    torch.testing.assert_close(linears[0](x), reference, rtol=0.05, atol=0.05)  # int8 activations: ~1% error
    with pytest.raises(ValueError, match="quantization 'int4' is not available"):
        make_linear(4, 4, quantization="int4")


@pytest.fixture(autouse=True)
def _float32_kernels_are_a_declared_leniency():
    """These tests compare fused and unfused float32 numerics of the passes; a card takes
    float16/bfloat16 only, which tests/unit/test_kernel_contracts.py covers (docs/decisions.md "float32 on the simulator")."""
    from sim.kernels import unchecked

    with unchecked():
        yield
