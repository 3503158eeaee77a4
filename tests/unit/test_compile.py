"""The compile backend: aten lowering, un-functionalised attention, passes, split, wrappers."""

from __future__ import annotations

import pytest
import torch
from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2

from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.compile import ATTENTION_SPLITTING_OPS, AscendGraphBackend, CompiledModel, PassManager
from ascendgraph.compile.lowering import count_calls
from ascendgraph.config import GraphConfig
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, set_forward_context
from ascendgraph.models.build import build_model
from ascendgraph.models.presets import PRESETS
from ascendgraph.modes import GraphMode


@pytest.fixture(autouse=True, scope="module")
def _float32_declared_lenient():
    """These models are float32 and run eagerly: the simulator's declared float32 leniency (docs/decisions.md)."""
    from sim import kernels as sim_kernels

    with sim_kernels.contract_policy(sim_kernels.ContractPolicy.from_options(allow_float32_attention=True,
                                                                            lazy_kernel_init=False)):
        yield


ATTENTION = ATTENTION_SPLITTING_OPS[0]
LAYERS = 2


@pytest.fixture(scope="module", autouse=True)
def _kernels_and_one_thread():
    import sim  # noqa: F401  (registers the CPU kernels)

    previous = torch.get_num_threads()
    torch.set_num_threads(1)  # many small ops: avoid OpenMP oversubscription under xdist
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def piecewise():
    """tiny (2 layers) compiled for FULL_AND_PIECEWISE, run at 8, 1, 5 and 16 tokens."""
    model, backend, compiled = _compiled(GraphMode.FULL_AND_PIECEWISE, True)
    diffs = []
    for tokens in (8, 1, 5, 16):
        got = _forward(compiled, model, tokens, model.make_kv_caches(2, 128))
        want = _forward(model, model, tokens, model.make_kv_caches(2, 128))
        diffs.append((got - want).abs().max().item())
    return backend, diffs


def _forward(callable_, model, tokens: int, caches) -> torch.Tensor:
    ids = torch.arange(tokens) % model.spec.vocab_size
    positions = torch.arange(tokens)
    metadata = AttentionMetadata(
        num_reqs=1, num_actual_tokens=tokens, num_tokens=tokens, query_start_loc=[tokens], seq_lens=[tokens],
        block_table=torch.tensor([[0, 1]], dtype=torch.int32), slot_mapping=torch.arange(tokens),
    )
    context = ForwardContext(GraphMode.NONE, BatchDescriptor(tokens), metadata, caches, model.attention_layers)
    with torch.no_grad(), set_forward_context(context):
        return callable_(ids, positions)


def _compiled(mode: GraphMode, split: bool, preset: str = "tiny", passes=(), layers: int = LAYERS):
    model = build_model(PRESETS[preset].with_layers(layers), seed=0)
    backend = AscendGraphBackend(
        mode=mode, attention_split=split, capture_state=CaptureState(device=None), pass_manager=PassManager(list(passes))
    )
    return model, backend, CompiledModel(model, backend)


def test_one_compilation_serves_every_size_and_matches_eager(piecewise):
    backend, diffs = piecewise
    assert max(diffs) <= 1e-6
    assert len(backend.artifacts) == 1, "num_tokens is the dynamic dimension: one Dynamo compilation"


@pytest.mark.parametrize("preset", ["tiny-mla", "tiny-moe"])
def test_mla_and_moe_models_compile_once_too(preset):
    model, backend, compiled = _compiled(GraphMode.FULL_AND_PIECEWISE, True, preset, layers=1)
    for tokens in (8, 1, 5):
        got = _forward(compiled, model, tokens, model.make_kv_caches(2, 128))
        want = _forward(model, model, tokens, model.make_kv_caches(2, 128))
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert len(backend.artifacts) == 1


def test_the_aten_graph_calls_the_attention_op_directly(piecewise):
    backend, _ = piecewise
    graph = backend.artifacts[0].aten_graph
    assert count_calls(graph, ATTENTION) == LAYERS
    assert not [n for n in graph.graph.nodes if n.target in (auto_functionalized, auto_functionalized_v2)]
    assert count_calls(graph, torch.ops.aten.mm.default) > 0, "passes see aten ops"


def test_piecewise_modes_split_into_two_l_plus_one_pieces_with_l_plus_one_wrappers(piecewise):
    backend, _ = piecewise
    artifact = backend.artifacts[0]
    assert len(artifact.split.submodule_names) == 2 * LAYERS + 1
    assert len(artifact.split.splitting_submodules) == LAYERS
    assert artifact.num_pieces == LAYERS + 1
    options = [w.options for w in artifact.piecewise_wrappers]
    assert [o.gc_disable for o in options] == [False] + [True] * LAYERS
    assert [o.weak_ref_output for o in options] == [False] * LAYERS + [True]
    assert artifact.full_wrapper is not None and artifact.full_wrapper.runtime_mode is GraphMode.FULL


@pytest.mark.parametrize(
    "mode, split, pieces, full",
    [(GraphMode.PIECEWISE, True, 2, False), (GraphMode.FULL, False, 0, True)],
)
def test_wrappers_follow_the_mode(mode, split, pieces, full):
    model, backend, compiled = _compiled(mode, split, layers=1)
    _forward(compiled, model, 4, model.make_kv_caches(2, 128))
    artifact = backend.artifacts[0]
    assert artifact.num_pieces == pieces
    assert (artifact.full_wrapper is not None) == full


class _CountMatmuls:
    name = "count_mm"

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, graph_module) -> int:
        self.calls += 1
        return count_calls(graph_module, torch.ops.aten.mm.default)


def test_the_pass_manager_runs_each_pass_on_the_aten_graph_and_counts_matches():
    counter = _CountMatmuls()
    model, backend, compiled = _compiled(GraphMode.FULL, False, passes=[counter])
    for tokens in (4, 1):
        _forward(compiled, model, tokens, model.make_kv_caches(2, 128))
    assert counter.calls == 1
    assert backend.pass_manager.matches == {"count_mm": 4 * LAYERS}


def test_two_models_never_share_a_compilation():
    first = _compiled(GraphMode.FULL, False, layers=1)
    second = _compiled(GraphMode.FULL, False, layers=1)
    for model, backend, compiled in (first, second):
        _forward(compiled, model, 4, model.make_kv_caches(2, 128))
        assert len(backend.artifacts) == 1
