"""XliteGraph in the engine (docs/semantics.md §3 step 5, §11): every batch routed, outputs checked against eager.

The workload is the engine tests' fixed one (6 requests, seed 0, max_num_seqs 4,
max_num_batched_tokens 8), so the route counts are exact. Each test also re-derives the
route of every step from the rule written out here, independently of `XliteRouter`.
"""

from __future__ import annotations

import json
from typing import Sequence

import pytest
from helpers import WORKLOAD, run_engine, small_config

from ascendgraph.cli.app import main
from ascendgraph.runtime.engine import Engine, EngineOptions
from ascendgraph.runtime.stages.records import StepRecord
from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.workload import ScheduledBatch
from ascendgraph.xlite import (
    XLITE_FULL_MODE_DISABLES_ACLGRAPH,
    XLITE_PIPELINE_PARALLEL_ERROR,
    XLITE_SPEC_DECODE_ERROR,
    XliteBudgetExceeded,
)

DECODE_ONLY = {"xlite_graph_config": {"enabled": True}}
FULL = {"xlite_graph_config": {"enabled": True, "full_mode": True}}


def expected_route(record: StepRecord, *, budget: int, full_mode: bool, dp: int, peers: Sequence[int] = ()) -> str:
    """docs/semantics.md §11 written out: max over ranks within budget -> xlite, except decode-only
    with dp > 1, which also needs at most one token per request."""
    tokens = max([record.num_tokens, *peers])
    if tokens > budget:
        return "native"
    if not full_mode and dp > 1 and tokens > record.num_reqs:
        return "native"
    return "xlite"


def _routes(steps: list[StepRecord]) -> dict[str, int]:
    counts = {"xlite": 0, "native": 0}
    for record in steps:
        counts[record.route] += 1
    return counts


def test_decode_only_routes_small_batches_to_xlite_and_the_rest_to_the_native_graphs():
    run = run_engine(small_config(additional_config=DECODE_ONLY))
    report = run.report
    assert report.ok, report.error
    assert report.effective_mode == "FULL_DECODE_ONLY"
    assert report.max_abs_diff_vs_eager <= report.atol
    assert report.extensions["xlite"]["budget"] == 4 and report.extensions["xlite"]["full_mode"] is False
    assert report.extensions["batches_by_route"] == {"xlite": 7, "native": 7}
    assert _routes(run.steps) == report.extensions["batches_by_route"]
    for record in run.steps:
        assert record.route == expected_route(record, budget=4, full_mode=False, dp=1), record
    # xlite takes small prefill / mixed batches too (within budget), not only decodes
    assert {r.kind for r in run.steps if r.route == "xlite"} == {"decode", "mixed"}
    assert report.extensions["xlite"]["profile_run"] is None  # decode-only mode has none
    assert report.graphs_captured > 0  # FULL_DECODE_ONLY graphs exist for native decode batches


def test_full_mode_runs_every_batch_on_xlite_eagerly_after_a_profile_run():
    run = run_engine(small_config(additional_config=FULL))
    report = run.report
    assert report.ok, report.error
    assert report.effective_mode == "NONE" and report.graphs_captured == 0
    assert XLITE_FULL_MODE_DISABLES_ACLGRAPH in [d["reason"] for d in report.decisions]
    assert report.max_abs_diff_vs_eager <= report.atol
    assert report.extensions["batches_by_route"] == {"xlite": 14, "native": 0}
    assert report.extensions["xlite"]["profile_run"] == {
        "num_tokens": 8, "route": "xlite", "buffer_tokens": 8,
        "reason": "profile run in xlite full mode: xlite returns its preallocated hidden-state buffer",
    }
    assert run.engine.xlite_runtime.profile_runs == 1
    text = report.format_text()
    assert "routes     xlite 14, native 0" in text and "xlite      full mode, token budget 8" in text
    assert "profile run of 8 tokens -> xlite" in text


def test_full_mode_with_mtp_keeps_full_decode_only_graphs_and_a_tp_rounded_budget():
    run = run_engine(small_config(additional_config=FULL, num_speculative_tokens=1, max_num_batched_tokens=7,
                                  tensor_parallel_size=2))
    report = run.report
    assert report.ok, report.error
    assert report.effective_mode == "FULL_DECODE_ONLY"
    assert report.extensions["xlite"]["budget"] == 8  # 7 rounded up to a multiple of tp 2
    assert report.extensions["batches_by_route"]["native"] == 0
    assert sum(report.extensions["batches_by_route"].values()) == report.steps


def test_decode_only_with_dp_routes_on_the_max_over_ranks_and_tokens_per_request():
    run = run_engine(small_config(additional_config=DECODE_ONLY, data_parallel_size=2),
                     dp_peer_tokens=lambda batch: [1])
    report = run.report
    assert report.ok, report.error
    assert report.extensions["batches_by_route"] == {"xlite": 6, "native": 8}
    for record in run.steps:
        assert record.route == expected_route(record, budget=4, full_mode=False, dp=2, peers=[1]), record
    # dp > 1: a mixed batch of 4 tokens for 3 requests now runs natively (it ran on xlite with dp 1)
    assert any(r.kind == "mixed" and r.num_tokens <= 4 and r.route == "native" for r in run.steps)


def test_a_busy_peer_rank_sends_decode_batches_to_the_captured_full_graphs():
    def peers(batch: ScheduledBatch) -> list[int]:
        return [5] if batch.uniform_decode else [1]  # 5 > budget 4 on every decode step

    run = run_engine(small_config(additional_config=DECODE_ONLY, data_parallel_size=2), dp_peer_tokens=peers)
    report = run.report
    assert report.ok, report.error
    assert report.max_abs_diff_vs_eager <= report.atol
    assert report.extensions["batches_by_route"] == {"xlite": 1, "native": 13}
    native_decodes = [r for r in run.steps if r.kind == "decode"]
    assert native_decodes and all(r.route == "native" and r.runtime_mode is GraphMode.FULL for r in native_decodes)
    assert report.batches_by_mode["FULL"] == len(native_decodes) == 5


def test_full_mode_with_dp_falls_back_to_native_when_another_rank_is_over_budget():
    def peers(batch: ScheduledBatch) -> list[int]:
        return [16] if batch.has_prefill and batch.num_reqs == 1 else [2]

    run = run_engine(small_config(additional_config=FULL, data_parallel_size=2), dp_peer_tokens=peers)
    report = run.report
    assert report.ok, report.error
    for record in run.steps:
        batch_peers = [16] if record.kind == "prefill" and record.num_reqs == 1 else [2]
        assert record.route == expected_route(record, budget=8, full_mode=True, dp=2, peers=batch_peers), record
    assert report.extensions["batches_by_route"] == {"xlite": 13, "native": 1}
    assert report.extensions["xlite"]["profile_run"]["route"] == "xlite"  # all ranks profile with 8 tokens


def test_dp_peer_tokens_must_name_every_other_rank():
    with pytest.raises(ConfigError, match="gave 2 token count.*data_parallel_size=2 has 1 other rank"):
        run_engine(small_config(additional_config=DECODE_ONLY, data_parallel_size=2, enforce_eager=True),
                   dp_peer_tokens=lambda batch: [1, 1])


def test_a_batch_over_budget_never_reaches_the_runtime_and_the_runtime_refuses_it():
    engine = Engine(small_config(additional_config=DECODE_ONLY, enforce_eager=True),
                    EngineOptions(device="sim", workload_spec=WORKLOAD, progress=False))
    try:
        batch = engine.scheduler.schedule()
        assert batch is not None and batch.num_tokens == 8 > engine.xlite_router.budget
        decision = engine.route_decision(batch)
        assert decision is not None and decision.route == "native" and "exceed the xlite decode-only budget of 4" in decision.reason
        with pytest.raises(XliteBudgetExceeded, match="8 tokens"):
            engine.runners["xlite"](batch)
        assert engine.xlite_runtime.forwards == 0
    finally:
        engine.close()


def test_enforce_eager_with_xlite_serves_eagerly_and_still_routes():
    """The seed's decode-only example keeps --enforce-eager: nothing is captured, xlite still runs."""
    run = run_engine(small_config(additional_config=DECODE_ONLY, enforce_eager=True))
    report = run.report
    assert report.ok and report.effective_mode == "NONE" and report.graphs_captured == 0
    assert report.extensions["batches_by_route"] == {"xlite": 7, "native": 7}


def test_without_xlite_every_batch_is_native_and_the_text_stays_quiet():
    run = run_engine(small_config(enforce_eager=True))
    report = run.report
    assert report.ok
    assert report.extensions["batches_by_route"] == {"xlite": 0, "native": report.steps}
    assert "xlite" not in report.extensions and "routes" not in report.format_text()
    assert run.engine.xlite_runtime is None and "xlite" not in run.engine.runners


# --------------------------------------------------------------------------- CLI

SMALL = ["run", "--device", "sim", "--num-layers", "1", "--max-num-seqs", "4", "--max-num-batched-tokens", "8",
         "--requests", "3", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4]}', "--json"]


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_cli_run_with_xlite_decode_only_completes_with_the_route_counts(capsys):
    code, out, err = _cli(capsys, *SMALL, "--additional-config", '{"xlite_graph_config":{"enabled":true}}')
    assert code == 0, err
    document = json.loads(out)
    assert document["effective_mode"] == "FULL_DECODE_ONLY" and document["requests_completed"] == 3
    assert document["max_abs_diff_vs_eager"] <= document["atol"]
    assert document["batches_by_route"] == {"xlite": 18, "native": 12}
    assert document["xlite"]["budget"] == 4
    assert "routes     xlite" not in err  # --json: the document alone, no text report


def test_cli_run_with_xlite_full_mode_completes_with_the_route_counts(capsys):
    code, out, err = _cli(capsys, *SMALL, "--additional-config",
                          '{"xlite_graph_config":{"enabled":true,"full_mode":true}}')
    assert code == 0, err
    document = json.loads(out)
    assert document["effective_mode"] == "NONE" and document["graphs_captured"] == 0
    assert document["requests_completed"] == 3 and document["max_abs_diff_vs_eager"] <= document["atol"]
    assert document["batches_by_route"] == {"xlite": 30, "native": 0}
    assert document["xlite"]["profile_run"]["route"] == "xlite"


@pytest.mark.parametrize("flags, message", [
    (["--num-speculative-tokens", "2"], XLITE_SPEC_DECODE_ERROR),
    (["--pipeline-parallel-size", "2"], XLITE_PIPELINE_PARALLEL_ERROR),
])
def test_cli_xlite_validation_errors_exit_2_with_the_verbatim_text(capsys, flags, message):
    code, out, err = _cli(capsys, "run", "--device", "sim", *flags,
                          "--additional-config", '{"xlite_graph_config":{"enabled":true}}')
    assert code == 2 and out == ""
    assert err.strip().endswith(message) and "Traceback" not in err


def test_cli_unsupported_architecture_exits_2_with_the_verbatim_text(capsys, tmp_path):
    model = {"architectures": ["MistralForCausalLM"], "num_hidden_layers": 1, "hidden_size": 64,
             "num_attention_heads": 2, "vocab_size": 100}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(model))
    code, _, err = _cli(capsys, "run", "--device", "sim", "--model", str(path),
                        "--additional-config", '{"xlite_graph_config":{"enabled":true}}')
    assert code == 2
    assert err.strip().endswith("MistralForCausalLM not supported!")
