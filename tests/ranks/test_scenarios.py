"""Every multi-rank scenario file (tests/ranks/scenario_files/*.toml, kind = "ranks") fails
with its error under the buggy policy and meets its expectation under the fixed one
(ascendgraph.tools.scenario.ranks, docs/ranks.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascendgraph.config import GraphConfig
from ascendgraph.runtime.ranks import RankOptions, Step, run_ranks
from ascendgraph.tools.scenario.model import ScenarioError
from ascendgraph.tools.scenario.ranks import discover_rank_scenarios, load_rank_scenario, run_rank_scenario

FILES = discover_rank_scenarios(Path(__file__).parent / "scenario_files")
NAMED = ("#13826", "#43547", "#12036", "#9689", "#6011", "#13688")


def test_every_named_issue_has_a_scenario():
    issues = " ".join(load_rank_scenario(path).issue for path in FILES)
    assert all(number in issues for number in NAMED)


@pytest.mark.parametrize("side", ["buggy", "fixed"])
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_each_side_meets_its_expectation(path, side):
    scenario = load_rank_scenario(path)
    report, misses = run_rank_scenario(scenario, side)
    assert misses == [], f"{scenario.issue} ({side}): {misses}"
    if side == "buggy":
        assert report.error is not None  # every buggy policy is caught
        if type(report.error).__name__.startswith("Collective"):
            assert "flight record" in str(report.error)


def test_a_scenario_that_misses_its_expectation_says_how(tmp_path):
    text = (Path(__file__).parent / "scenario_files" / "graph_meets_eager.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('dp_sync_policy = "pre_6011"', 'dp_sync_policy = "fixed"'))
    _, misses = run_rank_scenario(load_rank_scenario(bad), "buggy")
    assert misses == ["expected CollectiveMismatch, the run passed"]


@pytest.mark.parametrize("edit, key", [
    (("kind = \"ranks\"", "kind = \"engine\""), "kind"),
    (("[buggy.expect]", "[buggy.expectation]"), "expectation"),
    (("dp_sync_policy = \"pre_6011\"", "dp_sync_polizy = \"pre_6011\""), "dp_sync_polizy"),
    (("0 = [[4, true, 0], [4, true, 0]]", "0 = [[4, 1, 0]]"), "[ranks.steps] 0"),
])
def test_a_bad_file_names_the_key(tmp_path, edit, key):
    text = (Path(__file__).parent / "scenario_files" / "graph_meets_eager.toml").read_text()
    assert edit[0] in text
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace(edit[0], edit[1]))
    with pytest.raises(ScenarioError) as info:
        load_rank_scenario(bad)
    assert key in str(info.value)


def test_a_seed_reproduces_a_run_exactly():
    config = GraphConfig.from_vllm_args(model="tiny-moe", data_parallel_size=2, tensor_parallel_size=2)
    first = run_ranks(config, RankOptions(requests=3, seed=5)).to_json()
    again = run_ranks(config, RankOptions(requests=3, seed=5)).to_json()
    assert first == again
    assert first["error"] is None and first["collectives_met"]["ep"] > 0


def test_a_delayed_rank_is_named_the_straggler_past_hccl_exec_timeout():
    config = GraphConfig.from_vllm_args(model="tiny-moe", data_parallel_size=2,
                                        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY",
                                                            "cudagraph_capture_sizes": [1, 2, 4, 8]})
    steps = {0: [Step(8, True)] * 3, 1: [Step(8, True)] * 3}
    late = run_ranks(config, RankOptions(steps=steps, faults="rank=1:replay=1*off->delay(5000)",
                                         env={"HCCL_EXEC_TIMEOUT": "2"}))
    assert type(late.error).__name__ == "CollectiveTimeout" and late.error.straggler == 1
    in_time = run_ranks(config, RankOptions(steps=steps, faults="rank=1:replay=1*off->delay(1000)",
                                            env={"HCCL_EXEC_TIMEOUT": "2"}))
    assert in_time.error is None
    assert in_time.ranks[0].clock_us >= 1_000_000  # rank 0 waited for rank 1 on its virtual clock


@pytest.mark.parametrize("sizes, rule", [([1, 2, 4], "graph_never_meets_eager"), ([1, 2, 4, 16], "same_graph_key")])
def test_capture_lists_are_compared_before_capture(sizes, rule):
    config = GraphConfig.from_vllm_args(model="tiny-moe", tensor_parallel_size=2,
                                        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY",
                                                            "cudagraph_capture_sizes": [1, 2, 4, 8]})
    steps = {0: [Step(8, True)] * 2}
    per_rank = run_ranks(config, RankOptions(steps=steps, capture_agreement="per_rank",
                                             capture_sizes_by_rank={1: sizes}))
    assert type(per_rank.error).__name__ == "CollectiveMismatch" and rule in per_rank.error.rules
    agreed = run_ranks(config, RankOptions(steps=steps, capture_sizes_by_rank={1: sizes}))
    assert agreed.error is None and agreed.dropped_keys >= 1
    assert [r.graphs_captured for r in agreed.ranks] == [3, 3]  # only the sizes every rank has


def test_an_agreed_abort_names_the_failing_rank_and_its_peers_give_up_by_constructor(monkeypatch):
    """Agreed capture outcome, on_capture_error=raise: rank 1 runs out of memory, rank 0 gives up
    with it. The peer's abort is built with ``peer_abort`` and ``rank`` (a sealed class refuses any
    field set later); the run's error is rank 1's own, and the report names rank 1."""
    from ascendgraph.errors import CaptureError
    from ascendgraph.runtime import ranks as ranks_module

    aborts = []

    class SealedCaptureError(CaptureError):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            aborts.append(self)
            object.__setattr__(self, "sealed", True)

        def __setattr__(self, name, value):
            if getattr(self, "sealed", False):
                raise AssertionError(f"{name} = {value!r} set on a built CaptureError")
            super().__setattr__(name, value)

    monkeypatch.setattr(ranks_module, "CaptureError", SealedCaptureError)
    config = GraphConfig.from_vllm_args(model="tiny-moe", tensor_parallel_size=2,
                                        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY",
                                                            "cudagraph_capture_sizes": [1, 2, 4, 8]})
    report = run_ranks(config, RankOptions(steps={0: [Step(2, True)] * 2}, on_capture_error="raise",
                                           faults="rank=1:capture_begin=2*off->raise(oom)"))
    assert type(report.error).__name__ == "OutOfMemoryError" and report.failed_rank == 1
    assert [(abort.peer_abort, abort.rank) for abort in aborts] == [(True, 0)]
    assert report.to_json()["error"]["rank"] == 1 and "FAILED on rank 1: OutOfMemoryError" in report.format_text()


def test_captured_collectives_charge_streams_per_communicator():
    """A graph holding TP and EP collectives holds one more stream per group under AIV
    (sim/budget.py); the MoE pair on one group is charged once."""
    def streams(**config):
        base = {"model": "tiny-moe", "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY",
                                                            "cudagraph_capture_sizes": [1, 2]}}
        report = run_ranks(GraphConfig.from_vllm_args(**base, **config),
                           RankOptions(steps={d: [Step(1, True)] for d in range(config.get("data_parallel_size", 1))},
                                       env={"HCCL_OP_EXPANSION_MODE": "AIV"}))
        assert report.error is None, report.error
        return report.ranks[0].streams_in_use - report.ranks[0].graphs_captured

    alone = streams()
    assert streams(data_parallel_size=2) == alone + 2  # the EP group (dp x tp = 2): 2 graphs x 1 stream
    assert streams(data_parallel_size=2, tensor_parallel_size=2) == alone + 4  # EP and TP groups


def test_shards_cover_every_job_once():
    from ascendgraph.tools.scenario.sweep import parse_shard, plan_jobs

    seeds = range(0, 5)
    every = plan_jobs(FILES, seeds)
    shards = [plan_jobs(FILES, seeds, parse_shard(f"{i}/3")) for i in range(3)]
    assert sorted((job for shard in shards for job in shard), key=repr) == sorted(every, key=repr)
    assert len(every) == len(FILES) * 2 * 5
    with pytest.raises(Exception, match="i/n"):
        parse_shard("3/3")


def test_a_sweep_over_seeds_meets_every_expectation(capsys):
    from ascendgraph.tools.scenario.sweep import main

    path = Path(__file__).parent / "scenario_files" / "sync_tensors_differ.toml"
    assert main([str(path), "--seeds", "0:3", "--json"]) == 0
    assert '"jobs": 6, "missed": []' in capsys.readouterr().out


BASE = (Path(__file__).parent / "scenario_files" / "mc2_skip_unsynced_mode.toml").read_text()


@pytest.mark.parametrize("edit, key", [
    # issue 33: not type- or range-checked (mc2_skip = "false" ran as true; seeds, steps, ranks outside the world)
    (("mc2_skip = true", 'mc2_skip = "false"'), "mc2_skip"),
    (("[buggy]\n", '[buggy]\nseed = "3"\n'), "seed"),
    (("[buggy]\n", "[buggy]\nseed = -1\n"), "seed"),
    (("[buggy]\n", "[buggy]\nstream_limits = { 7 = 40 }\n"), "stream_limits"),
    (("[buggy]\n", "[buggy]\ndp_sync_policy_by_rank = { 5 = \"vllm\" }\n"), "dp_sync_policy_by_rank"),
    (("[buggy]\n", "[buggy]\ncapture_sizes_by_rank = { 1 = [1000000000] }\n"), "capture_sizes_by_rank"),
    (("[ranks]\n", "[ranks]\nunfinished_interval = 1000000000\n"), "unfinished_interval"),
    (("[ranks]\n", "[ranks]\nmax_steps = 100000000000\n"), "max_steps"),
    (("0 = [[4, true, 0], [4, true, 0], [4, true, 0]]", "0 = [[4, true, 100000000]]"), "[ranks.steps] 0"),
    (("0 = [[4, true, 0], [4, true, 0], [4, true, 0]]", "2 = [[4, true, 0]]"), "steps"),
    (("0 = [[4, true, 0], [4, true, 0], [4, true, 0]]", "'\u00b2' = [[4, true, 0]]"), "[ranks.steps]"),
    # about seven malformed fields raised KeyError / AttributeError / TypeError / ValueError
    (("[config]\nmodel = \"tiny-moe\"", "config = 3\n[configx]\nmodel = \"tiny-moe\""), "config"),
    (("[buggy.expect.ranks.0]\nskipped_syncs = 1", "[buggy.expect.ranks.9]\nskipped_syncs = 1"), "ranks.9"),
    (("[buggy.expect.ranks.0]\nskipped_syncs = 1", "[buggy.expect.ranks.x]\nskipped_syncs = 1"), "ranks.x"),
    (("[buggy.expect]\n", "[buggy.expect]\nstraggler = \"one\"\n"), "straggler"),
    (("[buggy.expect]\n", "[buggy.expect]\nstraggler = 4\n"), "straggler"),
    (("[ranks]\n", "[ranks]\nenv = 3\n"), "env"),
    (("[ranks]\n", "[ranks]\nfaults = 3\n"), "faults"),
    (("[ranks]\n", "[ranks]\nfaults = \"rank=3:replay=hang\"\n"), "fault"),
    (("[ranks]\n", "[ranks]\ntimeout_s = \"2\"\n"), "timeout_s"),
    (("data_parallel_size = 2", "data_parallel_size = \"two\""), "[config]"),
    (("data_parallel_size = 2", "data_parallel_size = 4096\ntensor_parallel_size = 2"), "[config]"),
    (("[buggy]\n", "[buggy]\ndp_sync_policy_by_rank = { 0 = 3 }\n"), "dp_sync_policy_by_rank"),
])
def test_a_malformed_rank_file_is_one_line_naming_the_key(tmp_path, edit, key):
    assert edit[0] in BASE, edit[0]
    bad = tmp_path / "bad.toml"
    bad.write_text(BASE.replace(edit[0], edit[1], 1))
    with pytest.raises(ScenarioError) as info:
        load_rank_scenario(bad)
    message = str(info.value)
    assert key in message and "\n" not in message, message


def test_a_malformed_rank_file_through_the_sweep_is_exit_2(tmp_path, capsys):
    from ascendgraph.tools.scenario.sweep import main

    bad = tmp_path / "bad.toml"
    bad.write_text(BASE.replace("mc2_skip = true", 'mc2_skip = "false"'))
    assert main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert "mc2_skip" in err and len(err.strip().splitlines()) == 1
