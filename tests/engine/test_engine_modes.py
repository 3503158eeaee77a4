"""Every mode x backend completes on the simulator, matches eager, captures what the keys
imply and routes each batch as docs/semantics.md §5 says.

The runs of the mode grid are shared per worker (`shared_run`): the tests that read a mode's
run (padding waste, simulated time, FULL_DECODE_ONLY routing) reuse the grid's run of that
mode instead of building their own. The grid's MLA rows other than FULL_AND_PIECEWISE (which
captures both FULL and piecewise MLA graphs) run with ``-m slow``."""

from __future__ import annotations

import pytest

from ascendgraph.modes import GraphMode
from ascendgraph.resolve import resolve
from tests.engine.helpers import LAYERS, SIZES, expected_runtime_mode, run_engine, small_config

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
BACKENDS = [("tiny", "ascend"), ("tiny-mla", "mla")]
# The exhaustive rest of the grid (-m slow): MLA in the modes FULL_AND_PIECEWISE already covers.
SLOW_ROWS = {(mode, "tiny-mla") for mode in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY")}
GRID = [
    pytest.param(mode, model, backend, marks=[pytest.mark.slow] if (mode, model) in SLOW_ROWS else [])
    for mode in MODES
    for model, backend in BACKENDS
]


def grid_config(mode: str):
    """The grid's configuration of ``mode`` on the default (tiny, ascend) row: its run is shared."""
    return small_config(mode, model="tiny", backend="ascend")


@pytest.mark.parametrize("mode, model, backend", GRID)
def test_every_mode_and_backend_serves_all_requests_like_eager(mode, model, backend, shared_run):
    config = small_config(mode, model=model, backend=backend)
    resolution = resolve(config)
    result = shared_run(config)
    report = result.report

    assert report.ok, report.format_text()
    assert report.requests_completed == report.requests_total == 6
    assert report.max_abs_diff_vs_eager <= 1e-5, "fp32 round-off"
    assert report.effective_mode == resolution.mode.name
    assert report.requested_mode == resolution.requested_mode.name

    effective = resolution.mode
    dispatcher = result.engine.dispatcher
    piecewise_keys = len(dispatcher.keys(GraphMode.PIECEWISE)) if effective is not GraphMode.NONE else 0
    full_keys = len(dispatcher.keys(GraphMode.FULL)) if effective is not GraphMode.NONE else 0
    assert report.graphs_captured == piecewise_keys * (LAYERS + 1) + full_keys
    expected_graphs = {
        GraphMode.NONE: 0,
        GraphMode.PIECEWISE: len(SIZES) * (LAYERS + 1),
        GraphMode.FULL: len(SIZES),
        GraphMode.FULL_DECODE_ONLY: len(SIZES),
        GraphMode.FULL_AND_PIECEWISE: len(SIZES) * (LAYERS + 2),
    }
    assert report.graphs_captured == expected_graphs[effective]

    kinds = {(r.kind, r.num_tokens <= max(SIZES)) for r in result.steps}
    assert {("decode", True), ("mixed", True)} <= kinds and any(not small for _, small in kinds), (
        f"the workload must exercise decode, mixed and oversized batches, got {sorted(kinds)}"
    )
    for record in result.steps:
        want = expected_runtime_mode(
            effective, uniform=record.kind == "decode", num_tokens=record.num_tokens, max_size=max(SIZES)
        )
        assert record.runtime_mode is want, f"step {record.step} ({record.kind}, {record.num_tokens} tokens)"
        if want is not GraphMode.NONE:
            assert record.padded_tokens == min(s for s in SIZES if s >= record.num_tokens)
    counted = {m: sum(1 for r in result.steps if r.runtime_mode.name == m) for m in ("NONE", "PIECEWISE", "FULL")}
    assert report.batches_by_mode == counted


def test_full_decode_only_runs_mixed_batches_eagerly_and_decodes_in_full_graphs(shared_run):
    result = shared_run(grid_config("FULL_DECODE_ONLY"))
    mixed = [r for r in result.steps if r.kind != "decode"]
    decodes = [r for r in result.steps if r.kind == "decode" and r.num_tokens <= max(SIZES)]
    assert mixed and all(r.runtime_mode is GraphMode.NONE for r in mixed)
    assert decodes and all(r.runtime_mode is GraphMode.FULL and r.descriptor.uniform for r in decodes)


def test_a_never_backend_runs_piecewise():
    config = small_config("FULL_AND_PIECEWISE", backend="never")
    result = run_engine(config)
    assert result.report.effective_mode == "PIECEWISE"
    assert result.report.ok
    assert result.report.batches_by_mode["FULL"] == 0 and result.report.batches_by_mode["PIECEWISE"] > 0


def test_padding_waste_counts_padded_tokens_of_graphed_batches(shared_run):
    result = shared_run(grid_config("PIECEWISE"))
    graphed = [r for r in result.steps if r.runtime_mode is not GraphMode.NONE]
    real = sum(r.num_tokens for r in graphed)
    padded = sum(r.padded_tokens for r in graphed)
    assert result.report.padding_waste == pytest.approx(padded / real - 1)


def test_simulated_time_of_graph_and_eager_paths_is_reported(shared_run):
    report = shared_run(grid_config("FULL_DECODE_ONLY")).report
    assert report.simulated_time_us["graph"] > 0 and report.simulated_time_us["eager"] > 0


def test_replays_with_address_checks_on_pass(monkeypatch):
    # the check runs: every capture records the input addresses and, in debug mode, every
    # replay compares them again (counted, not assumed)
    import ascendgraph.compile.graph_wrapper as capture_module

    real = capture_module.input_addresses
    calls: list[int] = []
    monkeypatch.setattr(capture_module, "input_addresses", lambda args: calls.append(1) or real(args))
    result = run_engine(small_config("FULL_AND_PIECEWISE"), debug=True)
    assert result.report.ok
    stats = result.engine.device.stats()
    replays = stats.extra["replays"]
    assert replays > 0
    assert len(calls) == stats.graphs_captured_total + replays


def test_lora_keys_are_captured_and_lora_free_batches_use_the_lora_free_graphs():
    # PIECEWISE: the FULL graphs of a LoRA and a LoRA-free key of one size share one attention
    # workspace, which the pool hands on (the finding pinned below)
    config = small_config("PIECEWISE", max_loras=1)
    result = run_engine(config)
    report = result.report
    assert report.ok, report.format_text()
    keys = result.engine.dispatcher.capture_order()
    assert any(key.has_lora for _, key in keys) and any(not key.has_lora for _, key in keys)
    assert report.graphs_captured == sum(LAYERS + 1 if mode is GraphMode.PIECEWISE else 1 for mode, _ in keys)
    graphed = [r for r in result.steps if r.runtime_mode is not GraphMode.NONE]
    assert graphed and not any(r.descriptor.has_lora for r in graphed)


def test_full_graphs_of_a_lora_and_a_lora_free_key_of_one_size_share_a_workspace_the_pool_handed_on():
    # vLLM Ascend 182b75ea keys a FULL graph's attention workspace by token count only
    # (attention_v1.py full_graph_fia: graph_params.workspaces.get(num_tokens)) and weak-references
    # it after each capture (compilation/acl_graph.py:227-229); the LoRA key's capture of the same
    # size then gets the freed block for its own tensors and writes the workspace over them.
    # Upstream's open fix keys the slots by (num_tokens, has_lora): vllm-project/vllm-ascend#14225.
    config = small_config("FULL_AND_PIECEWISE", max_loras=1)
    report = run_engine(config).report
    assert not report.ok
    assert "PoolBlockReused" in report.format_text()
    assert "write through a weak reference" in report.format_text()
