"""The compile cache keeps the passes' rewritten graph across runs (ascendgraph.compile.cache)."""

from __future__ import annotations

import pytest
import torch
from torch import fx

from ascendgraph.compile.cache import CompileCache, cache_key, cacheable
from ascendgraph.compile.pass_manager import PassManager
from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions


@pytest.fixture(autouse=True)
def _float32_declared_lenient():
    """These models are float32 and run eagerly: the simulator's declared float32 leniency (docs/decisions.md)."""
    from sim import kernels as sim_kernels

    with sim_kernels.contract_policy(sim_kernels.ContractPolicy.from_options(allow_float32_attention=True,
                                                                            lazy_kernel_init=False)):
        yield



def _engine() -> Engine:
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=2,
                                        compilation_config={"cudagraph_mode": "PIECEWISE"})
    return Engine(config, EngineOptions(device="sim", requests=1, progress=False))


def _calls(module: fx.GraphModule) -> list[tuple[str, str]]:
    """The graph's nodes as (op, target): a reloaded graph may name its nodes differently."""
    return [(node.op, str(node.target)) for node in module.graph.nodes if node.op != "placeholder"]


def _compiled(engine: Engine) -> tuple[list[tuple[str, str]], dict[str, int], fx.GraphModule]:
    engine.compile()
    artifact = engine.backend.artifacts[0]
    return _calls(artifact.aten_graph), engine.pass_manager.matches, artifact.aten_graph


def test_a_second_engine_hits_the_cache_and_gets_the_same_graph(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    first = _engine()
    try:
        code, matches, _ = _compiled(first)
        assert first.pass_manager.cache_status == "miss"
    finally:
        first.close()
    stored = list((tmp_path / "compile").glob("*.pkl"))
    assert len(stored) == 1
    assert matches.get("add_rms_norm", 0) > 0  # there was something to fuse
    second = _engine()
    try:
        code_again, matches_again, _ = _compiled(second)
        assert second.pass_manager.cache_status == "hit"
        assert code_again == code and matches_again == matches
    finally:
        second.close()


def test_a_cached_run_computes_what_an_uncached_run_computes(tmp_path, monkeypatch):
    from ascendgraph.runtime.engine import run

    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=2)
    cold = run(config, device="sim", requests=1, progress=False)
    warm = run(config, device="sim", requests=1, progress=False)
    assert cold.ok and warm.ok
    assert warm.to_json()["fused_ops"] == cold.to_json()["fused_ops"]
    assert warm.max_abs_diff_vs_eager == cold.max_abs_diff_vs_eager
    assert warm.graphs_captured == cold.graphs_captured


def test_a_broken_entry_is_a_miss_and_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    first = _engine()
    try:
        code, _, _ = _compiled(first)
    finally:
        first.close()
    (entry,) = (tmp_path / "compile").glob("*.pkl")
    entry.write_bytes(b"not a pickle")
    # the traced entry would skip Dynamo and the passes altogether (tests/unit/test_traced_cache.py)
    for traced in (tmp_path / "compile" / "traced").glob("*.pkl"):
        traced.unlink()
    second = _engine()
    try:
        code_again, _, _ = _compiled(second)
        assert second.pass_manager.cache_status == "miss" and code_again == code
    finally:
        second.close()
    assert entry.read_bytes() != b"not a pickle"


def _graph(scale: float) -> fx.GraphModule:
    class M(torch.nn.Module):
        def forward(self, x):
            return x * scale

    return fx.symbolic_trace(M())


class _Fake:
    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, graph_module: fx.GraphModule) -> int:
        return 0


def test_the_key_follows_the_graph_and_the_passes():
    from ascendgraph.compile.passes.noop import NoopEliminationPass

    noop = [NoopEliminationPass()]
    assert cache_key(_graph(2.0), noop) == cache_key(_graph(2.0), noop)
    assert cache_key(_graph(2.0), noop) != cache_key(_graph(3.0), noop)
    assert cache_key(_graph(2.0), noop) != cache_key(_graph(2.0), noop + noop)


def test_only_pure_rewrites_are_cached(tmp_path):
    from ascendgraph.compile.passes.noop import NoopEliminationPass

    assert cacheable([NoopEliminationPass()])
    assert not cacheable([])
    assert not cacheable([NoopEliminationPass(), _Fake("static_kernel")])
    manager = PassManager(passes=[NoopEliminationPass(), _Fake("static_kernel")], cache=CompileCache(tmp_path))
    manager(_graph(2.0))
    assert manager.cache_status == "off" and not (tmp_path / "compile").exists()
    off = PassManager(passes=[NoopEliminationPass()], cache=CompileCache(tmp_path), use_cache=False)
    off(_graph(2.0))
    assert off.cache_status == "off" and not (tmp_path / "compile").exists()


def test_a_pass_manager_round_trip_on_a_plain_graph(tmp_path):
    from ascendgraph.compile.passes.noop import NoopEliminationPass

    first = PassManager(passes=[NoopEliminationPass()], cache=CompileCache(tmp_path))
    module = _graph(2.0)
    first(module)
    assert first.cache_status == "miss"
    second = PassManager(passes=[NoopEliminationPass()], cache=CompileCache(tmp_path))
    again = _graph(2.0)
    second(again)
    assert second.cache_status == "hit"
    x = torch.randn(4)
    assert torch.equal(again(x), x * 2.0) and _calls(again) == _calls(module)


@pytest.mark.parametrize("node_op", ["get_attr"])
def test_graphs_with_module_state_are_not_stored(tmp_path, node_op):
    from ascendgraph.compile.passes.noop import NoopEliminationPass

    class WithBuffer(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("b", torch.ones(4))

        def forward(self, x):
            return x + self.b

    module = fx.symbolic_trace(WithBuffer())
    assert any(node.op == node_op for node in module.graph.nodes)
    manager = PassManager(passes=[NoopEliminationPass()], cache=CompileCache(tmp_path))
    manager(module)
    assert manager.cache_status == "miss" and not list((tmp_path / "compile").glob("*.pkl"))
