"""`ascendgraph run -dp N -tp M`: every rank on the simulator, the `ranks` report section,
the exit code of a failed multi-rank run, and rank-scoped fault plans."""

from __future__ import annotations

import json

import pytest

from ascendgraph.cli.app import main
from ascendgraph.cli.ranks_args import (
    CAPTURE_AGREEMENT_NAMES,
    DP_SYNC_POLICY_NAMES,
    IDLE_POLICY_NAMES,
    engine_faults,
)
from ascendgraph.parallel.coordination import DP_SYNC_POLICIES, IDLE_POLICIES
from ascendgraph.runtime.ranks import CAPTURE_AGREEMENTS

SMALL = ["--device", "sim", "--num-layers", "1", "--requests", "2", "--model", "tiny-moe", "--compilation-config",
         '{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}']


def test_the_cli_choices_are_the_policy_tables():
    assert set(DP_SYNC_POLICY_NAMES) == set(DP_SYNC_POLICIES)
    assert set(IDLE_POLICY_NAMES) == set(IDLE_POLICIES)
    assert set(CAPTURE_AGREEMENT_NAMES) == set(CAPTURE_AGREEMENTS)


def test_the_engine_gets_only_the_rules_without_a_rank():
    assert engine_faults("replay=delay(1); rank=1:replay=hang", 2) == "replay=delay(1)"
    assert engine_faults("rank=1:replay=hang", 2) is None
    assert engine_faults(None, 4) is None


def test_run_with_dp_and_tp_reports_every_rank(capsys):
    code = main(["run", *SMALL, "-dp", "2", "-tp", "2", "--json", "--faults", "rank=3:replay=delay(1)"])
    document = json.loads(capsys.readouterr().out)
    assert code == 0, document.get("ranks", {}).get("error")
    ranks = document["ranks"]
    assert ranks["layout"] == {"dp": 2, "pp": 1, "tp": 2, "world_size": 4, "ep": 4}
    assert [r["rank"] for r in ranks["per_rank"]] == [0, 1, 2, 3]
    assert all(r["collectives_met"] > 0 and sum(r["batches_by_mode"].values()) > 0 for r in ranks["per_rank"])
    assert ranks["collectives_met"]["tp"] > 0 and ranks["error"] is None


def test_a_per_rank_capture_fallback_fails_the_run_with_exit_1(capsys):
    code = main(["run", *SMALL, "-tp", "2", "--capture-agreement", "per_rank", "--on-capture-error", "eager",
                 "--faults", "rank=1:capture_begin=1*off->raise(207008)"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAILED: CollectiveMismatch" in out and "graph_never_meets_eager" in out



@pytest.mark.parametrize("extra, fragment", [
    (["-tp", "3"], "Total number of attention heads (4) must be divisible by tensor parallel size (3)"),
    (["-dp", "2", "--device", "npu"], "runs on the simulator only: give --device sim"),
])
def test_a_layout_the_run_cannot_take_is_refused_before_anything_runs(capsys, caplog, extra, fragment):
    # vLLM 0.32 ModelConfig.verify_with_parallel_config refuses heads that do not split over TP;
    # the refusal comes before the one-rank run (no graph is captured first).
    caplog.set_level("INFO", logger="ascendgraph")
    code = main(["run", "--num-layers", "1", "--requests", "2", *extra])
    captured = capsys.readouterr()
    assert code == 2
    assert fragment in captured.err
    assert captured.out == ""
    assert not any("captured" in record.getMessage() for record in caplog.records)


def test_the_communicator_stream_table_is_the_simulators():
    from ascendgraph.parallel.communicators import COLLECTIVE_STREAMS_PER_GROUP
    from sim.budget import COLLECTIVE_STREAMS

    assert COLLECTIVE_STREAMS_PER_GROUP == COLLECTIVE_STREAMS


def test_explain_accounts_per_communicator(capsys):
    assert main(["explain", "-dp", "2", "-tp", "2", "--model", "tiny-moe", "--hccl-op-expansion-mode", "AIV"]) == 0
    text = capsys.readouterr().out
    assert "communicators (HCCL expansion AIV" in text
    assert "tp    2 group(s) of 2" in text and "ep    1 group(s) of 4" in text
    assert "a captured graph holds 1 + 2 stream(s)" in text
    assert main(["explain", "-dp", "2", "--json"]) == 0
    names = [c["name"] for c in json.loads(capsys.readouterr().out)["communicators"]]
    assert names == ["world", "dp"]  # a dense model: no EP traffic; dp syncs run eagerly
    assert main(["explain", "--json"]) == 0
    assert "communicators" not in json.loads(capsys.readouterr().out)


def test_the_api_exports_run_ranks_and_the_collective_errors():
    import ascendgraph
    from ascendgraph.errors import CollectiveError

    report = ascendgraph.run_ranks(ascendgraph.GraphConfig.from_vllm_args(data_parallel_size=2),
                                   ascendgraph.RankOptions(requests=2))
    assert report.error is None and report.layout.world_size == 2
    for name in ("CollectiveMismatch", "CollectiveDeadlock", "CollectiveTimeout"):
        assert issubclass(getattr(ascendgraph, name), CollectiveError)


@pytest.mark.parametrize("rule", ["rank=1:task_update=skip_update", "rank=1:replay=perturb(1.0)",
                                  "rank=1:event_record=raise(207005)", "rank=1:"])
def test_a_rank_rule_the_ranks_do_not_model_is_bad_input(capsys, rule):
    # issue 33: each of these printed OK (the rule was accepted and ignored)
    code = main(["run", "--num-layers", "1", "--requests", "2", "-tp", "2", "--faults", rule])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert "fault plan:" in captured.err and "rank=1:" in captured.err
    assert len(captured.err.strip().splitlines()) == 1


def test_a_rank_0_rule_with_one_rank_acts_on_the_engine(capsys):
    # issue 33: with one rank the rule was dropped and the run passed
    code = main(["run", "--num-layers", "1", "--requests", "2", "--faults", "rank=0:capture_begin=raise(207008)"])
    captured = capsys.readouterr()
    assert code == 1, captured.out


def test_the_json_of_a_failed_multi_rank_run_has_the_error_at_the_top_level(capsys):
    # issue 33: "error": null at the top level, the error only under ranks.error
    code = main(["run", *SMALL, "-tp", "2", "--json", "--capture-agreement", "per_rank", "--on-capture-error", "eager",
                 "--faults", "rank=1:capture_begin=1*off->raise(207008)"])
    document = json.loads(capsys.readouterr().out)
    assert code == 1
    assert document["error"]["type"] == "CollectiveMismatch" and document["error"]["source"] == "ranks"
    assert document["error"]["message"] == document["ranks"]["error"]["message"]


def test_pipeline_parallelism_says_what_is_not_simulated(capsys):
    # issue 36 item 4: `-pp 2` printed a bare OK with no pipeline communication
    assert main(["run", *SMALL, "-pp", "2"]) == 0
    assert "NOT SIMULATED: pipeline parallelism" in capsys.readouterr().out
    assert main(["run", *SMALL, "-pp", "2", "--json"]) == 0
    gaps = json.loads(capsys.readouterr().out)["ranks"]["not_simulated"]
    assert len(gaps) == 1 and gaps[0].startswith("pipeline parallelism")


def test_a_world_beyond_what_finishes_in_a_minute_is_refused(capsys):
    # issue 33: -dp 4096 was inside the documented bound but grew quadratically (2048 ranks: 193 s)
    code = main(["run", "--num-layers", "1", "--requests", "2", "-dp", "1024"])
    captured = capsys.readouterr()
    assert code == 2 and "1024 ranks is more than the 512 the simulator steps" in captured.err


# The generated multi-rank workload (ascendgraph/runtime/ranks.py, BURST_GAP / RANK_STAGGER): DP
# rank 1 holds requests none of which is schedulable for its first steps (zero-token steps) and
# each rank is idle once its requests are done, so the idle policies act through `ascendgraph run`.
# Four requests per rank (two bursts of two) show all of it; the default 16 only make longer runs.
# The idle-policy and FULL_DECODE_ONLY cases capture sizes 1, 2 and 4 only (9 graphs per run
# instead of the 105 of tiny-moe's default sizes): their decode batches and one-token dummies are
# graphed either way, and the outcomes are the same. The FULL_AND_PIECEWISE case keeps the default
# sizes: its prefill batches must replay piecewise graphs too.
GENERATED = ["--device", "sim", "--num-layers", "1", "--model", "tiny-moe", "-dp", "2", "--requests", "4", "--json"]
SMALL_SIZES = ["--compilation-config", '{"cudagraph_capture_sizes": [1, 2, 4]}']
DECODE_ONLY = ["--compilation-config", '{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}']


def _ranks(capsys, *flags):
    code = main(["run", *GENERATED, *flags])
    return code, json.loads(capsys.readouterr().out)["ranks"]


def test_the_generated_workload_has_zero_token_steps_and_idle_ranks():
    from ascendgraph import GraphConfig
    from ascendgraph.runtime.ranks import RankOptions, _generated_steps

    config = GraphConfig.from_vllm_args(model="tiny-moe", data_parallel_size=2)
    first, second = (_generated_steps(config, RankOptions(), dp) for dp in (0, 1))
    assert second[0].tokens == 0 and first[0].tokens > 0  # rank 1 holds requests that are not schedulable yet
    assert len(first) != len(second)  # one rank runs out of requests first and is idle until the other is done


def test_the_idle_policy_changes_the_outcome_of_a_generated_run(capsys):
    """vLLM #43547: a zero-token step that returns without the DP sync leaves the ranks' DP
    sequences apart until the engine core's unfinished-requests all-reduce: a deadlock."""
    code, ranks = _ranks(capsys, *SMALL_SIZES, "--idle-policy", "always_dummy")
    assert code == 0 and ranks["error"] is None
    assert ranks["per_rank"][1]["dummy_batches"] > 0
    code, ranks = _ranks(capsys, *SMALL_SIZES, "--idle-policy", "external_launcher_only")
    assert code == 1
    assert ranks["error"]["type"] == "CollectiveDeadlock"
    assert "[sync_dp_state]" in ranks["error"]["message"] and "dp_engine" in ranks["error"]["message"]


def test_the_mc2_skip_path_hangs_an_idle_rank_against_a_serving_one(capsys):
    """vLLM Ascend #13826 (FULL_DECODE_ONLY, the thread's mode): the skip path keeps each rank's
    own mode, so the idle rank's one-token dummy runs eagerly while its peer replays its decode
    graph, in one EP collective. With the mode synced (the fixed policy) the run passes."""
    code, ranks = _ranks(capsys, *DECODE_ONLY, "--mc2-skip", "--dp-sync-policy", "vllm_ascend")
    assert code == 1
    error = ranks["error"]
    assert error["type"] == "CollectiveMismatch" and error["rules"] == ["graph_never_meets_eager"]
    assert "ep#" in error["message"] and "rank 1: eager" in error["message"]
    assert "rank 0: graph:FULL:" in error["message"]
    assert ranks["per_rank"][1]["dummy_batches"] >= 1 and ranks["per_rank"][1]["skipped_syncs"] >= 1
    code, ranks = _ranks(capsys, *DECODE_ONLY, "--mc2-skip", "--dp-sync-policy", "fixed")
    assert code == 0 and ranks["error"] is None


def test_with_piecewise_graphs_the_skip_paths_idle_dummy_replays_a_graph(capsys):
    """FULL_AND_PIECEWISE (tiny-moe's default): the one-token dummy replays a PIECEWISE graph
    (vLLM 0.27.1 does not split the MoE layers out of piecewise graphs), so no graph meets an
    eager collective and the skip path passes (docs/ranks.md)."""
    code, ranks = _ranks(capsys, "--mc2-skip", "--dp-sync-policy", "vllm_ascend")
    assert code == 0 and ranks["error"] is None
    assert ranks["per_rank"][1]["skipped_syncs"] > 0
