"""The stream planner against the simulator, and the plan's meta-tensor capture measurement.

SEMANTICS §9 / INTERFACES "Streams": the planner's N is exactly where a simulated capture
starts failing. Two grids check it:

* **engine grid** — `Engine.capture()` on a SimDevice handed the resolved plan (tiny
  models, one layer, four sizes, a stream limit small enough that the failure comes
  early, often in the middle of a size): the first key the simulator could not capture
  completely is the planner's `first_failing_index()`, and a configuration the planner
  says fits captures every key;
* **device grid** — the full product of parallel configs, including draft layers, which
  the engine does not model (it makes up draft tokens and has no draft model): the stack's
  capture sequence is replayed on the SimDevice with empty graphs — per key in the
  dispatcher's capture order, the model's layers + 1 piecewise graphs then the draft's
  draft layers + 1 (or one FULL graph) — and the first failing key is compared the same way.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter
from typing import Any, Optional

import pytest
import torch

import sim
from ascendgraph.cli.app import main
from ascendgraph.config import GraphConfig
from ascendgraph.dispatch import GraphDispatcher
from ascendgraph.runtime.engine import Engine, EngineOptions
from ascendgraph.errors import CaptureError, StreamResourceExhausted
from ascendgraph.modes import GraphMode
from ascendgraph.tools.plan import graphs_for, make_plan, measure_capture, sizes_from_plan
from ascendgraph.resolve import resolve
from ascendgraph.sizes import StreamPlan


def _config(mode: str, *, model: str = "tiny", layers: int = 1, sizes=(1, 2, 4, 8), max_num_seqs: int = 8,
            **extra: Any) -> GraphConfig:
    return GraphConfig.from_vllm_args(
        model=model,
        num_layers=layers,
        compilation_config={"cudagraph_mode": mode, "cudagraph_capture_sizes": list(sizes)},
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=64,
        **extra,
    )


def _limit_failing_after(plan: StreamPlan, fitting: int) -> int:
    """A stream limit that fits exactly ``fitting`` sizes, the next one failing mid-size when it can."""
    return plan.streams_needed(fitting) + max(0, plan.streams_per_size - 1)


def _graphs_per_key(plan: StreamPlan, mode: GraphMode) -> int:
    return plan.graphs_per_size if mode is GraphMode.PIECEWISE else 1


def _first_incomplete(order, counts: Counter, plan: StreamPlan) -> Optional[int]:
    for index, (mode, key) in enumerate(order):
        if counts[(mode, key)] < _graphs_per_key(plan, mode):
            return index
    return None


def _engine_first_failure(config: GraphConfig, limit: int, hccl: Optional[str], *, meta: bool = True):
    device = sim.SimDevice(meta_tensors=meta)
    engine = Engine(config, EngineOptions(device=device, requests=1, stream_limit=limit, hccl_op_expansion_mode=hccl,
                                          progress=False, check_eager=False))
    counts: Counter = Counter()
    engine.capture_state.after_capture.append(lambda wrapper, entry: counts.update([(wrapper.runtime_mode,
                                                                                     entry.descriptor)]))
    error = None
    try:
        engine.capture()
    except CaptureError as exc:
        error = exc
    finally:
        engine.close()
    plan = engine.resolution.stream_plan
    assert plan is not None
    return _first_incomplete(engine.dispatcher.capture_order(), counts, plan), error, plan


# (mode, config, HCCL_OP_EXPANSION_MODE, sizes that fit under the chosen limit, meta tensors?)
# Between them the cases fail at the first size, in the middle of the second, third and
# fourth, and fit completely; one runs on the real (CPU-memory) simulator.
ENGINE_GRID = [
    pytest.param("PIECEWISE", {}, None, 2, True, id="piecewise"),
    pytest.param("PIECEWISE", {"tensor_parallel_size": 2}, None, 1, False, id="piecewise-tp2-ffts-cpu"),
    pytest.param("FULL_AND_PIECEWISE", {"tensor_parallel_size": 2, "data_parallel_size": 2}, "AIV", 1, True,
                 id="fullpw-tp2-dp2-aiv"),
    pytest.param("FULL_AND_PIECEWISE", {"model": "tiny-moe", "data_parallel_size": 2, "enable_expert_parallel": True},
                 None, 2, True, id="fullpw-moe-dp2-ep-ffts"),
    pytest.param("PIECEWISE", {"model": "tiny-moe", "data_parallel_size": 2, "enable_expert_parallel": True}, "AIV",
                 3, True, id="piecewise-moe-dp2-ep-aiv"),
    pytest.param("PIECEWISE", {"layers": 2, "num_speculative_tokens": 1}, "AIV", 0, True,
                 id="piecewise-2layers-spec-aiv"),
    pytest.param("FULL_DECODE_ONLY", {"num_speculative_tokens": 1, "tensor_parallel_size": 2}, None, 1, True,
                 id="fulldecode-spec-tp2"),
    pytest.param("FULL", {"data_parallel_size": 2}, "AIV", 4, True, id="full-dp2-aiv-fits"),
]


def _check_engine_against_planner(mode, extra, hccl, fitting, meta):
    config = _config(mode, **extra)
    reference = resolve(config, hccl_op_expansion_mode=hccl).stream_plan
    assert reference is not None
    limit = max(1, _limit_failing_after(reference, fitting))
    first, error, plan = _engine_first_failure(config, limit, hccl, meta=meta)
    predicted = plan.first_failing_index()
    assert first == predicted, (mode, extra, hccl, limit, first, predicted)
    if predicted is None:
        assert error is None and plan.fits
    else:
        assert isinstance(error, StreamResourceExhausted), error
        assert plan.max_num_sizes == predicted
    return predicted, len(plan.requested_sizes)


@pytest.mark.parametrize("mode, extra, hccl, fitting, meta", ENGINE_GRID)
def test_engine_capture_fails_first_exactly_where_the_planner_says(mode, extra, hccl, fitting, meta):
    predicted, sizes = _check_engine_against_planner(mode, extra, hccl, fitting, meta)
    assert predicted == (None if fitting >= sizes else fitting)


@pytest.mark.slow
@pytest.mark.parametrize("fitting", [0, 1, 2, 3, 4])
@pytest.mark.parametrize("mode, extra, hccl, _fitting, meta", ENGINE_GRID)
def test_engine_capture_matches_the_planner_at_every_limit(mode, extra, hccl, _fitting, meta, fitting):
    _check_engine_against_planner(mode, extra, hccl, fitting, meta)


# --------------------------------------------------------------------------- device grid

DEVICE_GRID = list(itertools.product(
    ("PIECEWISE", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL"),  # mode
    (1, 2),  # tp
    (1, 2),  # dp
    (False, True),  # expert parallel
    (None, "AIV"),  # HCCL_OP_EXPANSION_MODE
    ("tiny", "tiny-moe"),
    (None, 2),  # draft layers
))


def _device_first_failure(resolution, draft_layers: Optional[int]) -> Optional[int]:
    """The stack's capture sequence with empty graphs: model pieces, then the draft's, per key."""
    config, plan = resolution.config, resolution.stream_plan
    dispatcher = GraphDispatcher(resolution.mode, capture_sizes=resolution.capture_sizes,
                                 max_num_seqs=config.max_num_seqs,
                                 uniform_decode_query_len=config.uniform_decode_query_len)
    device = sim.SimDevice()
    device.set_stream_plan(plan)
    pool = device.graph_pool_handle()
    graphs = []
    for index, (mode, _key) in enumerate(dispatcher.capture_order()):
        if mode is GraphMode.PIECEWISE:
            pieces = [("piecewise", config.num_hidden_layers + 1)]
            if draft_layers:
                pieces.append(("piecewise", draft_layers + 1))
        else:
            pieces = [("full", 1)]
        for kind, count in pieces:
            for _ in range(count):
                graph = device.new_graph()
                try:
                    with device.graph(graph, pool=pool, graph_kind=kind):
                        pass
                except RuntimeError as exc:
                    assert "207008" in str(exc)
                    return index
                graphs.append(graph)
    return None


def test_device_capture_sequence_fails_first_where_the_planner_says_on_the_whole_grid():
    mismatches = []
    checked = 0
    for mode, tp, dp, ep, hccl, model, draft in DEVICE_GRID:
        extra: dict[str, Any] = {"tensor_parallel_size": tp, "data_parallel_size": dp, "enable_expert_parallel": ep}
        if draft:
            extra["speculative_config"] = {"num_speculative_tokens": 1, "draft_num_hidden_layers": draft}
        config = _config(mode, model=model, layers=2, **extra)
        reference = resolve(config, hccl_op_expansion_mode=hccl).stream_plan
        assert reference is not None
        if draft and reference.streams_per_piecewise_graph:
            assert reference.graphs_per_size == 2 + 1 + draft + 1
        sizes = len(reference.requested_sizes)
        for fitting in (0, 1, sizes):
            limit = max(1, _limit_failing_after(reference, fitting))
            resolution = resolve(config, stream_limit=limit, hccl_op_expansion_mode=hccl)
            plan = resolution.stream_plan
            first = _device_first_failure(resolution, draft)
            checked += 1
            if first != plan.first_failing_index():
                mismatches.append((mode, tp, dp, ep, hccl, model, draft, limit, first, plan.first_failing_index()))
    assert checked == len(DEVICE_GRID) * 3
    assert not mismatches, mismatches[:5]


# --------------------------------------------------------------------------- meta tensors


def test_a_meta_tensor_sim_counts_the_same_pool_streams_and_time_without_holding_memory():
    def capture(device):
        x = torch.ones(64, 32, device=device.torch_device)
        w = torch.ones(32, 48, device=device.torch_device)
        graph = device.new_graph()
        with device.graph(graph, graph_kind="full"):
            y = torch.relu(x @ w) * 2
        return graph, y

    cpu, meta = sim.SimDevice(), sim.SimDevice(meta_tensors=True)
    graph_cpu, out_cpu = capture(cpu)
    graph_meta, out_meta = capture(meta)
    assert meta.torch_device.type == "meta" and out_meta.device.type == "meta"
    assert out_cpu.device.type == "cpu"
    assert graph_meta.pool_bytes == graph_cpu.pool_bytes == 3 * 64 * 48 * 4  # mm, relu, mul: fresh outputs
    assert meta.stats().pool_bytes == cpu.stats().pool_bytes
    assert meta.stats().streams_in_use == cpu.stats().streams_in_use == 1
    assert graph_meta.capture_time_us == graph_cpu.capture_time_us
    assert graph_meta.num_tasks == graph_cpu.num_tasks


def test_an_engine_on_a_meta_device_builds_its_model_without_materialising_weights():
    config = GraphConfig.from_vllm_args(model="qwen3-0.6b", num_layers=1, max_num_seqs=4,
                                        compilation_config={"cudagraph_capture_sizes": [1, 4]})
    engine = Engine(config, EngineOptions(device=sim.SimDevice(meta_tensors=True), requests=1, progress=False))
    try:
        params = list(engine.model.parameters())
        assert params and all(p.device.type == "meta" for p in params)
        # embedding 151936 x 1024 alone would be 622 MB of real memory
        assert sum(p.numel() for p in params) > 150_000_000
        engine.capture()
        assert engine.capture_state.graphs_captured == 2 * 2 + 2
        assert engine.device.stats().pool_bytes > 0
    finally:
        engine.close()


def test_measured_graphs_match_the_dispatcher_count_and_sampling_predicts_what_all_measures():
    config = _config("FULL_AND_PIECEWISE", sizes=(1, 2, 4, 8, 16, 24, 32), layers=2, max_num_seqs=32)
    resolution = resolve(config)
    full = measure_capture(resolution, method="all")
    sample = measure_capture(resolution, method="sample", sample=3)
    assert full.method == "all" and full.sizes == list(resolution.capture_sizes)
    assert sample.method == "sample" and len(sample.sizes) < len(full.sizes)
    assert max(sample.sizes) == max(full.sizes) and min(sample.sizes) == min(full.sizes)
    sizes = list(resolution.capture_sizes)
    whole = full.predict(sizes)
    # measuring everything predicts the measurement itself
    assert whole.graphs == full.graphs_captured == graphs_for(resolution, sizes) == 7 * 3 + 7
    assert whole.pool_bytes == full.pool_bytes
    assert whole.capture_seconds == pytest.approx(full.capture_seconds, rel=1e-9)
    assert whole.interpolated_keys == 0
    # the sample interpolates the rest: same graphs and pool, capture time within 5%
    guess = sample.predict(sizes)
    assert guess.graphs == whole.graphs
    assert guess.pool_bytes == whole.pool_bytes
    assert guess.interpolated_keys > 0
    assert guess.capture_seconds == pytest.approx(whole.capture_seconds, rel=0.05)
    for subset in ([1, 32], [2, 8, 32], sizes[::2] + [32]):
        assert sample.predict(subset).graphs == graphs_for(resolution, subset) == full.predict(subset).graphs


def test_plan_predicts_memory_and_time_for_each_selection():
    config = _config("FULL_AND_PIECEWISE", sizes=(1, 2, 4, 8), layers=1)
    result = make_plan(config, budget=2, requests=3, measure="all")
    assert result.measurement is not None and result.measure_error is None
    for selection in (result.configured, result.even, result.aware):
        assert selection.prediction is not None
        assert selection.prediction.graphs == selection.graphs
        assert selection.prediction.capture_seconds > 0
    assert result.configured.prediction.capture_seconds > result.even.prediction.capture_seconds
    # every selection keeps the largest size, whose graph sets the shared pool's size
    assert result.even.prediction.pool_bytes == result.configured.prediction.pool_bytes


def test_plan_cli_measures_on_the_simulator(capsys):
    code = main(["plan", "--num-layers", "1", "--max-num-seqs", "8", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8]}',
                 "--requests", "3", "--budget", "2", "--measure", "sample", "--sample-sizes", "2", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    measurement = document["measurement"]
    assert measurement["device"] == "sim (meta tensors)" and measurement["profile"] == "A2"
    assert measurement["sizes_measured"][0] == 1 and measurement["sizes_measured"][-1] == 8
    for name in ("configured", "even", "workload_aware"):
        predicted = document["selections"][name]["predicted"]
        assert predicted["graphs"] == document["selections"][name]["graphs"]
        assert predicted["pool_bytes"] > 0
    assert "predicted capture cost (simulator profile A2, meta tensors" in err


# --------------------------------------------------------------------------- run --sizes-from-plan


def test_run_with_sizes_from_plan_serves_the_selected_sizes_with_the_predicted_padding(capsys):
    argv = ["run", "--device", "sim", "--num-layers", "1", "--max-num-seqs", "8", "--max-num-batched-tokens", "64",
            "--requests", "4", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32, 64]}']
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=8, max_num_batched_tokens=64,
                                        compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32, 64]})
    expected = sizes_from_plan(config, requests=4, seed=0, budget=3)
    assert len(expected.sizes) <= 3 and expected.sizes[-1] == 64
    code = main([*argv, "--sizes-from-plan", "--budget", "3", "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    document = json.loads(out)
    assert document["capture_sizes"] == expected.sizes
    assert document["padding_waste"] == pytest.approx(expected.padding_waste)
    assert expected.padding_waste <= expected.padding_waste_even
    assert "--sizes-from-plan:" in err


def test_run_rejects_budget_without_sizes_from_plan(capsys):
    code = main(["run", "--device", "sim", "--budget", "3"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--budget needs --sizes-from-plan" in err


def test_a_graph_pool_that_does_not_fit_the_device_memory_fails_the_plan_with_exit_1(capsys, tmp_path):
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps({"base": "A2", "name": "A2-small", "memory_bytes": 200_000}))
    flags = ["plan", "--num-layers", "1", "--max-num-seqs", "8", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8]}',
             "--requests", "2"]
    code = main([*flags, "--sim-profile", str(profile), "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    document = json.loads(out)
    assert document["measurement"] is None
    assert document["measure_error"].startswith("OutOfMemoryError: NPU out of memory")
    assert "capture measurement failed: OutOfMemoryError" in err
    assert main([*flags, "--sim-profile", "no-such-soc"]) == 2
    assert "unknown SoC profile 'no-such-soc'" in capsys.readouterr().err
