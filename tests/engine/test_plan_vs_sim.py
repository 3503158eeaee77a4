"""The stream planner against the simulator, and the plan's meta-tensor capture measurement.

docs/semantics.md §9 (docs/decisions.md "Streams: the simulator counts, the planner predicts"): the simulator charges a captured graph from what
it holds (1 stream, plus 1 (AIV) or 2 (FFTS+) per communication group whose collectives it
captured, plus 40 per group up front under FFTS+; sim/budget.py), and the model issues its
tensor-parallel all-reduces as recorded ops. The simulator never sees the planner's
numbers, so "the planner's N sizes fit and size N + 1 fails" is evidence, checked end to end
through `Engine.capture()`:

* exact where every planner term has a physical counterpart (PIECEWISE under FFTS+ at any
  tp; AIV on a MoE model, whose factor has no dense margin);
* as the documented inequality where a planner term has none (the AIV dense margin of one
  size's streams, FULL_AND_PIECEWISE's "minus the number of sizes", dp > 1 and the
  pcp/dcp 100 on one process): the planner's N sizes still capture, and the simulator's
  capacity exceeds N by at most what that term reserves.

Sizes are captured largest first and every size of a piecewise capture costs the same
streams, so one capture of a size list longer than N shows both halves: N sizes complete,
the next one fails.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import Any, Optional

import pytest
import torch

import sim
from ascendgraph.cli.app import main
from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions
from ascendgraph.errors import CaptureError, StreamResourceExhausted
from ascendgraph.modes import GraphMode
from ascendgraph.tools.plan import graphs_for, make_plan, measure_capture, sizes_from_plan
from ascendgraph.resolve import resolve
from ascendgraph.sizes import StreamPlan, plan_stream_budget

# 16 sizes, more than any N below, so every failing case fails inside the list.
SIZES = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104)
LIMITS = (13, 21, 29, 45, 60, 80, 100, 120, 150)


def _limit(config: GraphConfig, hccl: Optional[str]) -> int:
    """A stream limit (an input of both sides) under which the planner fits a handful of SIZES."""
    for limit in LIMITS:
        plan = resolve(config, stream_limit=limit, hccl_op_expansion_mode=hccl).stream_plan
        if plan is not None and 4 <= plan.max_num_sizes <= 10:
            return limit
    raise AssertionError("no limit in LIMITS gives 4..10 sizes")


def _config(mode: str, *, model: str = "tiny", layers: int = 1, sizes=(1, 2, 4, 8), max_num_seqs: int = 8,
            max_num_batched_tokens: int = 64, **extra: Any) -> GraphConfig:
    return GraphConfig.from_vllm_args(
        model=model,
        num_layers=layers,
        compilation_config={"cudagraph_mode": mode, "cudagraph_capture_sizes": list(sizes)},
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        **extra,
    )


def _capture(config: GraphConfig, limit: int, hccl: Optional[str]):
    """Capture on a meta-tensor simulator: (sizes whose every graph was captured, error, plan)."""
    device = sim.SimDevice(meta_tensors=True)
    engine = Engine(config, EngineOptions(device=device, requests=1, stream_limit=limit, hccl_op_expansion_mode=hccl,
                                          progress=False, check_eager=False))
    counts: Counter = Counter()
    engine.capture_state.after_capture.append(
        lambda wrapper, entry: counts.update([(wrapper.runtime_mode, entry.descriptor.num_tokens)]))
    error = None
    try:
        engine.capture()
    except CaptureError as exc:
        error = exc
    finally:
        engine.close()
    plan = engine.resolution.stream_plan
    assert plan is not None
    pieces = config.num_hidden_layers + 1  # the model's piecewise graphs per size (not a planner figure)
    complete = [size for mode, size in ((m, k.num_tokens) for m, k in engine.dispatcher.capture_order())
                if mode is GraphMode.PIECEWISE and counts[(mode, size)] == pieces]
    return complete, error, plan, counts


def _big_config(mode: str, tp: int, model: str = "tiny", sizes=SIZES) -> GraphConfig:
    return _config(mode, model=model, sizes=sizes, max_num_seqs=16, max_num_batched_tokens=128,
                   tensor_parallel_size=tp)


# ---------------------------------------------------------------------------- exact cases
# (mode, tp, HCCL_OP_EXPANSION_MODE, model): every planner term has a physical counterpart.
EXACT = [
    pytest.param(1, None, "tiny", id="tp1-ffts"),
    pytest.param(2, None, "tiny", id="tp2-ffts"),
    pytest.param(4, None, "tiny", id="tp4-ffts"),
    pytest.param(2, "AIV", "tiny-moe", id="tp2-aiv-moe"),
]


@pytest.mark.parametrize("tp, hccl, model", EXACT)
def test_piecewise_capture_fits_exactly_the_planners_n_sizes_and_fails_on_the_next(tp, hccl, model):
    config = _big_config("PIECEWISE", tp, model)
    complete, error, plan, _ = _capture(config, _limit(config, hccl), hccl)
    n = plan.max_num_sizes
    assert 0 < n < len(SIZES)
    assert complete == sorted(SIZES, reverse=True)[:n]  # the N largest sizes fit ...
    assert isinstance(error, StreamResourceExhausted), error  # ... and size N + 1 does not
    assert error.graphs_captured < (n + 1) * (config.num_hidden_layers + 1)


# ----------------------------------------------------------------- the §9 grid (inequalities)


def _dense_aiv_margin_sizes(plan: StreamPlan) -> int:
    """The AIV dense margin (MAX -= PF * R) reserves exactly one size's streams."""
    return 1 if plan.expansion_mode == "AIV" else 0


def _full_reserve_sizes(plan: StreamPlan) -> int:
    """FULL_AND_PIECEWISE's "minus the number of sizes", in piecewise sizes it may leave unused."""
    return math.ceil(plan.full_graph_reserve / plan.streams_per_size) if plan.full_graph_reserve else 0


def _check_d5_statement(mode: str, tp: int, hccl: Optional[str]) -> None:
    config = _big_config(mode, tp)
    limit = _limit(config, hccl)
    complete, error, plan, counts = _capture(config, limit, hccl)
    n = plan.max_num_sizes
    assert 0 < n < len(SIZES)
    # the simulator's capacity: N, plus at most what the terms without a physical counterpart reserve
    slack = _dense_aiv_margin_sizes(plan) + _full_reserve_sizes(plan)
    assert n <= len(complete) <= n + slack, (len(complete), n, slack)
    if slack == 0:
        assert len(complete) == n and isinstance(error, StreamResourceExhausted)
    # the planner's own N sizes capture completely (FULL graphs included)
    chosen = _big_config(mode, tp, sizes=plan.sizes)
    complete_chosen, error_chosen, _, counts_chosen = _capture(chosen, limit, hccl)
    assert error_chosen is None, error_chosen
    assert sorted(complete_chosen) == sorted(plan.sizes)
    if mode == "FULL_AND_PIECEWISE":
        assert any(m is GraphMode.FULL for m, _ in counts_chosen)


@pytest.mark.parametrize("mode, tp, hccl", [
    pytest.param("PIECEWISE", 2, "AIV", id="piecewise-tp2-aiv"),
    pytest.param("FULL_AND_PIECEWISE", 4, None, id="fullpw-tp4-ffts"),
])
def test_the_planners_n_sizes_capture_and_the_simulator_fits_at_most_the_documented_slack_more(mode, tp, hccl):
    _check_d5_statement(mode, tp, hccl)


@pytest.mark.slow
@pytest.mark.parametrize("hccl", [None, "AIV"], ids=["ffts", "aiv"])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL_AND_PIECEWISE"])
def test_d5_statement_on_the_whole_grid(mode, tp, hccl):
    _check_d5_statement(mode, tp, hccl)


# ------------------------------------------------- planner terms without a physical counterpart
# A one-process model has no data-parallel group and no context parallelism; these terms only
# make the planner more conservative, which is all that can be checked here.


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("hccl", [None, "AIV"])
def test_terms_without_a_physical_counterpart_only_lower_n(tp, hccl):
    def n(**extra: Any) -> int:
        values = dict(num_hidden_layers=2, capture_sizes=list(range(1, 200)), mode=GraphMode.PIECEWISE,
                      tensor_parallel_size=tp, hccl_op_expansion_mode=hccl, max_streams=1800)
        values.update(extra)
        return plan_stream_budget(**values).max_num_sizes

    base = n()
    assert n(data_parallel_size=2) <= base
    assert n(mode=GraphMode.FULL_AND_PIECEWISE) <= base
    if hccl is None:
        assert n(prefill_context_parallel_size=2) <= base and n(decode_context_parallel_size=2) <= base
    else:  # AIV: the dense margin is one size's streams; a MoE model has none
        assert n(is_moe=True) == base + 1 or n(is_moe=True) == base


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
    assert "predicted capture cost" not in err  # --json: the document alone, no text report


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
    # bfloat16 (the default) pools take ~180 kB here; the device holds 100 kB.
    profile = tmp_path / "small.json"
    profile.write_text(json.dumps({"base": "A2", "name": "A2-small", "memory_bytes": 100_000}))
    flags = ["plan", "--num-layers", "1", "--max-num-seqs", "8", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8]}',
             "--requests", "2"]
    code = main([*flags, "--sim-profile", str(profile), "--json"])
    out, err = capsys.readouterr()
    assert code == 1
    document = json.loads(out)
    assert document["measurement"] is None
    assert document["measure_error"].startswith("OutOfMemoryError: NPU out of memory")
    assert "capture measurement failed" not in err  # --json: the document alone
    assert main([*flags, "--sim-profile", str(profile)]) == 1
    assert "capture measurement failed: OutOfMemoryError" in capsys.readouterr().out
    assert main([*flags, "--sim-profile", "no-such-soc"]) == 2
    assert "unknown SoC profile 'no-such-soc'" in capsys.readouterr().err
