"""Every multi-rank scenario fails with its error under the buggy policy and passes (or fails
cleanly, together) under the fixed one (ascendgraph.parallel.scenarios, docs/ranks.md)."""

from __future__ import annotations

import pytest

from ascendgraph.config import GraphConfig
from ascendgraph.parallel.scenarios import RANK_SCENARIOS, RankScenario
from ascendgraph.runtime.ranks import RankOptions, Step, run_ranks


def _run(scenario: RankScenario, which: str):
    options = dict(scenario.common)
    options.update(scenario.buggy if which == "buggy" else scenario.fixed)
    steps = {dp: [Step(*s) for s in items] for dp, items in scenario.steps.items()}
    return run_ranks(GraphConfig.from_vllm_args(**scenario.config), RankOptions(steps=steps, **options))


@pytest.mark.parametrize("scenario", RANK_SCENARIOS, ids=lambda s: s.name)
def test_the_buggy_policy_fails_with_the_named_error(scenario):
    report = _run(scenario, "buggy")
    assert report.error is not None, scenario.catches
    assert type(report.error).__name__ == scenario.expect_buggy, report.error
    if scenario.buggy_rule is not None:
        assert scenario.buggy_rule in report.error.rules
    if scenario.buggy_straggler is not None:
        assert report.error.straggler == scenario.buggy_straggler
        assert f"the straggler is rank {scenario.buggy_straggler}" in str(report.error)
    assert "flight record" in str(report.error) or scenario.expect_buggy not in (
        "CollectiveMismatch", "CollectiveTimeout", "CollectiveDeadlock")


@pytest.mark.parametrize("scenario", RANK_SCENARIOS, ids=lambda s: s.name)
def test_the_fixed_policy_passes(scenario):
    report = _run(scenario, "fixed")
    if scenario.expect_fixed == "ok":
        assert report.error is None, report.error
        assert sum(r.collectives_met for r in report.ranks) > 0
    else:  # every rank stops together with the original error: no rank is left waiting
        assert type(report.error).__name__ == scenario.expect_fixed


def test_capture_fallback_is_agreed_by_every_rank():
    scenario = next(s for s in RANK_SCENARIOS if s.name == "capture_fallback_on_one_rank")
    report = _run(scenario, "fixed")
    assert [r.capture_fallback for r in report.ranks] == [True, True]
    assert all(r.replays == 0 and r.batches_by_mode["NONE"] > 0 for r in report.ranks)


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
