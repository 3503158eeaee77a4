"""The multi-rank rules: layout and groups, collective compatibility, the DP coordination
functions (vLLM Ascend 182b75ea and vLLM as pure functions), rank-scoped fault plans."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ascendgraph.errors import ConfigError
from ascendgraph.parallel.coordination import (
    dp_sync_result,
    DP_SYNC_POLICIES,
    coordinate_batch_across_dp,
    determine_batch_execution_and_padding,
    execute_dummy_batch_tokens,
    get_policy,
    idle_step_joins_sync,
    should_skip_allreduce_across_dp_group,
    sync_metadata_across_dp,
)
from ascendgraph.parallel.fingerprints import (
    Fingerprint,
    check_meeting,
    default_collective_timeout_s,
    graph_how,
)
from ascendgraph.parallel.layout import ParallelLayout
from ascendgraph.parallel.rank_faults import split_rank_faults

PACKAGE = Path(__file__).resolve().parents[2] / "ascendgraph" / "parallel"


def test_the_parallel_rules_import_no_runtime_cli_tools_or_torch():
    for path in PACKAGE.glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        bad = {m for m in names if m.split(".")[0] in ("torch", "sim", "hw")
               or m.startswith(("ascendgraph.runtime", "ascendgraph.cli", "ascendgraph.tools"))}
        assert bad == set(), path.name


# --------------------------------------------------------------------------- layout


def test_ranks_are_ordered_dp_pp_tp_like_vllm():
    layout = ParallelLayout(dp=2, tp=2, pp=2)
    assert layout.world_size == 8 and layout.ep == 4
    assert [(c.dp_rank, c.pp_rank, c.tp_rank) for c in layout.ranks()][:4] == [(0, 0, 0), (0, 0, 1), (0, 1, 0), (0, 1, 1)]
    assert layout.group("tp", 5) == (4, 5)
    assert layout.group("dp", 5) == (1, 5)
    assert layout.group("pp", 5) == (5, 7)
    assert layout.group("ep", 5) == (0, 1, 4, 5)  # DP x TP of pp stage 0
    assert layout.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert layout.group("world", 3) == tuple(range(8))


@pytest.mark.parametrize("bad", [0, -1, True, 2.0])
def test_a_bad_size_is_refused_with_its_name(bad):
    with pytest.raises(ConfigError, match="tp size"):
        ParallelLayout(tp=bad)


def test_an_unknown_group_is_refused():
    with pytest.raises(ConfigError, match="unknown group 'sp'"):
        ParallelLayout(dp=2).group("sp", 0)


# --------------------------------------------------------------------------- fingerprints


def _fp(rank_op="all_reduce", shape=(2, 2), dtype="int32", how="eager", params=()):
    return Fingerprint("dp", (0, 1), 3, rank_op, shape, dtype, how, params)


def test_equal_fingerprints_meet():
    assert check_meeting({0: _fp(), 1: _fp()}) == []


@pytest.mark.parametrize("other, rule", [
    (_fp(rank_op="all_gather"), "same_op"),
    (_fp(dtype="float32"), "same_dtype"),
    (_fp(shape=(4, 2)), "same_shape"),
    (_fp(how=graph_how("FULL:4")), "graph_never_meets_eager"),
])
def test_each_rule_catches_its_difference(other, rule):
    assert [v.rule for v in check_meeting({0: _fp(), 1: other})] == [rule]


def test_graph_keys_must_match_at_replay():
    found = check_meeting({0: _fp(how=graph_how("FULL:4")), 1: _fp(how=graph_how("FULL:8"))})
    assert [v.rule for v in found] == ["same_graph_key"]
    assert "_post_process_dp_padding" in found[0].source


def test_the_mc2_skip_paths_uneven_decode_replays_meet():
    # issue 36 item 4: FULL 4x4 on one rank and FULL 8x8 on another, both within global_bs / ep,
    # is what vLLM Ascend's skip path is for (utils.py:1099-1112); same_graph_key refused it
    def mc2(key, tokens, bs):
        return Fingerprint("ep", (0, 1), 0, "mc2_dispatch", (tokens, 16), "bfloat16", graph_how(key),
                           (("global_bs", bs),))

    assert check_meeting({0: mc2("FULL:4x4", 4, 1024), 1: mc2("FULL:8x8", 8, 1024)}) == []
    assert [v.rule for v in check_meeting({0: mc2("FULL:4x4", 4, 8), 1: mc2("FULL:8x8", 8, 8)})] == ["mc2_token_counts"]
    assert [v.rule for v in check_meeting({0: mc2("FULL:4x4", 4, 0), 1: mc2("FULL:8x8", 8, 0)})] == [
        "same_graph_key", "mc2_token_counts"]


def test_mc2_token_counts_follow_global_bs():
    def mc2(tokens, bs):
        return Fingerprint("ep", (0, 1), 0, "mc2_dispatch", (tokens, 16), "bfloat16", "eager", (("global_bs", bs),))

    assert check_meeting({0: mc2(4, 0), 1: mc2(4, 0)}) == []
    assert [v.rule for v in check_meeting({0: mc2(4, 0), 1: mc2(8, 0)})] == ["mc2_token_counts"]
    assert check_meeting({0: mc2(4, 64), 1: mc2(8, 64)}) == []  # skip path: counts may differ
    assert [v.rule for v in check_meeting({0: mc2(4, 8), 1: mc2(8, 8)})] == ["mc2_token_counts"]  # 8 > 8 / 2


def test_the_timeout_is_hccl_exec_timeout_s_default():
    assert default_collective_timeout_s({}) == 1836.0
    assert default_collective_timeout_s({}, expansion_mode="AIV") == 1091.0
    assert default_collective_timeout_s({"HCCL_EXEC_TIMEOUT": "30"}) == 30.0
    assert default_collective_timeout_s({"HCCL_EXEC_TIMEOUT": "0"}) is None
    assert default_collective_timeout_s({"HCCL_EXEC_TIMEOUT": "5000"}, expansion_mode="AIV") == 1091.0
    with pytest.raises(ConfigError, match="HCCL_EXEC_TIMEOUT"):
        default_collective_timeout_s({"HCCL_EXEC_TIMEOUT": "soon"})


# --------------------------------------------------------------------------- coordination


def _all_reduce_of(contributions):
    """An all-reduce over fixed per-rank rows: the sum every rank would receive."""
    def reduce(_rows):
        out = [[0] * len(contributions[0][0]) for _ in contributions[0]]
        for rows in contributions:
            for i, row in enumerate(rows):
                out[i] = [a + b for a, b in zip(out[i], row)]
        return out
    return reduce


def test_vllm_ascend_sync_takes_the_minimum_mode_and_pads_on_the_local_mode():
    policy = get_policy("vllm_ascend")
    peers = [[[4, 0], [2, 0]], [[0, 40], [0, 0]]]  # rank 0: 4 tokens FULL; rank 1: 40 tokens NONE
    graph_rank = sync_metadata_across_dp(policy, _all_reduce_of(peers), num_tokens=4, mode=2, dp_size=2, dp_rank=0)
    eager_rank = sync_metadata_across_dp(policy, _all_reduce_of(peers), num_tokens=40, mode=0, dp_size=2, dp_rank=1)
    assert graph_rank.synced_mode == eager_rank.synced_mode == 0
    # padding follows each rank's *local* mode: the two ranks hold different num_tokens_across_dp
    assert graph_rank.num_tokens_across_dp == (40, 40)
    assert eager_rank.num_tokens_across_dp == (4, 40)
    fixed = get_policy("fixed")
    assert sync_metadata_across_dp(fixed, _all_reduce_of(peers), num_tokens=4, mode=2, dp_size=2,
                                   dp_rank=0).num_tokens_across_dp == (4, 40)


def test_the_skip_path_returns_the_local_unsynced_mode():
    policy = get_policy("vllm_ascend")
    result = sync_metadata_across_dp(policy, lambda rows: pytest.fail("no all-reduce on the skip path"),
                                     num_tokens=4, mode=2, dp_size=4, dp_rank=1, skip=True)
    assert result.skipped and result.synced_mode == 2 and result.num_tokens_across_dp == (4, 4, 4, 4)
    assert not get_policy("fixed").honours_skip


def test_skip_predicate_as_vllm_ascend_182b75ea():
    base = dict(is_moe=True, is_kv_consumer=True, decode_needs_mc2=True, prefill_needs_mc2=True,
                uniform_cudagraph_mode=True)
    assert should_skip_allreduce_across_dp_group(**base)
    assert not should_skip_allreduce_across_dp_group(**{**base, "hierarchical_comm": True})
    assert should_skip_allreduce_across_dp_group(**{**base, "is_moe": False})
    assert not should_skip_allreduce_across_dp_group(**{**base, "is_kv_consumer": False})
    assert not should_skip_allreduce_across_dp_group(**{**base, "uniform_cudagraph_mode": False})
    assert should_skip_allreduce_across_dp_group(**{**base, "uniform_cudagraph_mode": False,
                                                    "recompute_scheduler_enable": True})


def test_coordinate_batch_across_dp_pads_on_the_synced_mode():
    rows = [[[3, 0], [4, 0], [0, 0], [2, 0]], [[0, 6], [0, 8], [0, 0], [0, 2]]]
    _, across, mode = coordinate_batch_across_dp(_all_reduce_of(rows), num_tokens_unpadded=3, num_tokens_padded=4,
                                                 cudagraph_mode=2, dp_size=2, dp_rank=0)
    assert (across, mode) == ((8, 8), 2)
    rows[1][3][1] = 0  # rank 1 eager: no DP padding anywhere
    _, across, mode = coordinate_batch_across_dp(_all_reduce_of(rows), num_tokens_unpadded=3, num_tokens_padded=4,
                                                 cudagraph_mode=2, dp_size=2, dp_rank=0)
    assert (across, mode) == ((4, 8), 0)
    assert coordinate_batch_across_dp(lambda r: r, num_tokens_unpadded=3, dp_size=1, dp_rank=0,
                                      cudagraph_mode=1) == (False, None, 1)


def _dispatch(tokens, uniform, valid):
    """FULL graphs for 1, 2, 4, 8 uniform-decode tokens; NONE otherwise."""
    for size in (1, 2, 4, 8):
        if uniform and tokens <= size and (valid is None or 2 in valid):
            return 2, size, f"FULL:{size}"
    return 0, tokens, "eager"


def test_determine_batch_execution_and_padding_redispatches_at_the_agreed_size():
    policy = get_policy("fixed")
    # rank 0: 3 decode tokens -> FULL:4; rank 1 contributes 8 tokens, FULL
    peers = [[[4, 0], [2, 0]], [[0, 8], [0, 2]]]
    plan, sync = determine_batch_execution_and_padding(
        policy, _all_reduce_of(peers), num_tokens=3, uniform_decode=True, dispatch=_dispatch, dp_size=2, dp_rank=0)
    assert (sync.num_tokens_across_dp, sync.synced_mode) == ((8, 8), 2)
    assert (plan.mode, plan.num_tokens_padded, plan.key) == (2, 8, "FULL:8")
    # rank 1 eager: the agreed mode is NONE, no padding, and rank 0 re-dispatches eagerly
    peers = [[[4, 0], [2, 0]], [[0, 8], [0, 0]]]
    plan, sync = determine_batch_execution_and_padding(
        policy, _all_reduce_of(peers), num_tokens=3, uniform_decode=True, dispatch=_dispatch, dp_size=2, dp_rank=0)
    assert (sync.num_tokens_across_dp, sync.synced_mode) == ((4, 8), 0)
    assert (plan.mode, plan.num_tokens_padded) == (0, 4)


def test_execute_dummy_batch_is_a_uniform_decode_of_query_len():
    assert execute_dummy_batch_tokens(3) == (3, True)
    assert execute_dummy_batch_tokens(1) == (1, True)


def test_idle_policies():
    assert not idle_step_joins_sync("external_launcher_only")
    assert idle_step_joins_sync("external_launcher_only", executor_backend="external_launcher")
    assert idle_step_joins_sync("always_dummy")
    with pytest.raises(ConfigError, match="unknown idle policy"):
        idle_step_joins_sync("sometimes")
    with pytest.raises(ConfigError, match="unknown DP sync policy 'x'"):
        get_policy("x")
    assert all(p.source for p in DP_SYNC_POLICIES.values())


# --------------------------------------------------------------------------- rank faults


def test_rank_prefixed_rules_go_to_their_rank():
    common, own = split_rank_faults("replay=10%delay(5); rank=1:capture_begin=5*off->raise(oom); "
                                    "rank=2:replay=delay(5000)", 4)
    assert common == "replay=10%delay(5)"
    assert own == {1: "capture_begin=5*off->raise(oom)", 2: "replay=delay(5000)"}


@pytest.mark.parametrize("spec, match", [
    ("rank=4:replay=hang", "from 0 to 3"),
    ("rank=x:replay=hang", "must be an integer"),
    ("rank1:replay=hang", "cannot read rank prefix"),
])
def test_bad_rank_prefixes_are_refused(spec, match):
    with pytest.raises(ConfigError, match=match):
        split_rank_faults(spec, 4)


@pytest.mark.parametrize("rule, what", [
    ("rank=1:task_update=skip_update", "no attention parameter update"),
    ("rank=1:event_record=raise(207005)", "records no events"),
    ("rank=1:replay=perturb(1.0)", "compute no tensors"),
    ("rank=1:", "has no rule after the rank prefix"),
    ("rank=1:  ", "has no rule after the rank prefix"),
])
def test_a_rank_rule_no_rank_acts_on_is_refused_naming_what_is_not_modelled(rule, what):
    # issue 33: these were accepted and ignored (the run printed OK)
    with pytest.raises(ConfigError, match=what):
        split_rank_faults(rule, 2)


def test_with_one_rank_rank_0_rules_go_to_the_engine():
    from ascendgraph.parallel.rank_faults import engine_rules

    # issue 33: `--faults "rank=0:capture_begin=raise(207008)"` with one rank was dropped
    assert engine_rules("rank=0:capture_begin=raise(207008)", 1) == "capture_begin=raise(207008)"
    assert engine_rules("rank=0:task_update=skip_update; replay=delay(1)", 1) == "replay=delay(1); task_update=skip_update"
    assert engine_rules("rank=1:replay=hang", 2) is None  # the rank simulation's, not the engine's


def test_the_redispatch_allows_the_synced_mode_only_and_fails_where_vllms_dispatcher_asserts():
    """model_runner_v1.py:2789-2792: valid_modes={synced}; vLLM's dispatcher asserts when no graph
    of that mode matches and NONE is not allowed."""
    from ascendgraph.parallel.coordination import RedispatchFailed, SyncResult, StepPlan, redispatch_after_sync

    seen = []

    def dispatch(tokens, uniform, valid):
        seen.append(valid)
        if 2 in valid and tokens <= 8:
            return 2, tokens, f"FULL:{tokens}"
        if 0 in valid:
            return 0, tokens, "eager"
        raise ConfigError("no captured graph matches and NONE is not allowed", key="valid_modes")

    plan = StepPlan(2, 4, "FULL:4")
    assert redispatch_after_sync(plan, SyncResult(8, (8, 8), 2), dp_rank=0, uniform_decode=True,
                                 dispatch=dispatch).key == "FULL:8"
    assert seen == [frozenset({2})]
    with pytest.raises(RedispatchFailed, match="agreed size 16"):
        redispatch_after_sync(plan, SyncResult(16, (16, 16), 2), dp_rank=0, uniform_decode=True, dispatch=dispatch)
    assert issubclass(RedispatchFailed, RuntimeError)  # a failed run, not bad input


@pytest.mark.parametrize("flags", [{"oproj_tp": True}, {"embedding_tp": True}, {"sequence_parallel": True},
                                   {"draft": True}])
def test_dp_padding_also_follows_o_proj_tp_embedding_tp_sp_and_the_drafter(flags):
    """allow_dp_padding (model_runner_v1.py:2776-2781) and is_draft_model (model_runner_v1.py:700)."""
    policy = get_policy("vllm_ascend")
    reduced = [[4, 8], [0, 0]]  # both ranks eager
    assert dp_sync_result(policy, reduced, num_tokens=4, mode=0, dp_size=2).num_tokens_across_dp == (4, 8)
    assert dp_sync_result(policy, reduced, num_tokens=4, mode=0, dp_size=2, **flags).num_tokens_across_dp == (8, 8)


def test_the_drafter_syncs_once_per_proposer_call_with_mode_none():
    """A step with two draft forwards: one target sync, one draft_steps agreement, one draft sync
    (vLLM Ascend spec_decode/llm_base_proposer.py:817), then two draft forwards."""
    from ascendgraph.config import GraphConfig
    from ascendgraph.runtime.ranks import RankOptions, Step, run_ranks

    config = GraphConfig.from_vllm_args(model="tiny-moe", data_parallel_size=2, num_speculative_tokens=2,
                                        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY",
                                                            "cudagraph_capture_sizes": [3, 6, 12]})
    report = run_ranks(config, RankOptions(steps={0: [Step(3, True, 2)], 1: [Step(3, True, 2)]},
                                           unfinished_interval=1))
    assert report.error is None
    assert report.collectives_met["dp"] == 3
    assert all(r.replays == 3 for r in report.ranks)  # the target forward and two draft forwards
