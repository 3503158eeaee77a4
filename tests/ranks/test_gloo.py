"""The real-process tier: each rank in its own process on gloo with TORCH_DISTRIBUTED_DEBUG=DETAIL
(ascendgraph.runtime.ranks_gloo). On what both can express, gloo and the in-process fabric
fail or pass together; what gloo cannot see (graph vs eager), only the fabric catches.
Marked slow: every case starts two Python processes with torch (tens of seconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascendgraph.runtime.ranks import RankOptions, Step
from ascendgraph.runtime.ranks_gloo import run_ranks_gloo
from ascendgraph.tools.scenario.ranks import load_rank_scenario, run_rank_scenario

pytestmark = pytest.mark.slow
FILES = Path(__file__).parent / "scenario_files"

# (file, side, what gloo does): "agree" = gloo fails with DETAIL's mismatch exactly when the
# fabric fails, passes when it passes; "fabric_only" = the fabric catches, gloo passes.
CASES = [
    ("sync_tensors_differ", "buggy", "agree"),
    ("sync_tensors_differ", "fixed", "agree"),
    ("zero_token_step_skips_sync", "buggy", "agree"),
    ("graph_meets_eager", "buggy", "fabric_only"),
]


@pytest.mark.parametrize("name, side, relation", CASES, ids=[f"{n}-{s}" for n, s, _ in CASES])
def test_gloo_and_the_fabric(name, side, relation):
    scenario = load_rank_scenario(FILES / f"{name}.toml")
    report, misses = run_rank_scenario(scenario, side)
    assert misses == []
    options = RankOptions(steps={dp: [Step(*s) for s in items] for dp, items in scenario.steps.items()},
                          **{**scenario.common, **scenario.sides[side]})
    outcome = run_ranks_gloo(scenario.config, options, timeout_s=30)
    gloo_failed = any(kind != "ok" for kind, _ in outcome.values())
    if relation == "agree":
        assert gloo_failed == (report.error is not None), outcome
        if gloo_failed:
            assert all("Detected mismatch between collectives" in message for _, message in outcome.values()), outcome
    else:
        assert report.error is not None and not gloo_failed, outcome
