"""The multi-rank scenarios: each named issue, its buggy and its fixed policy (docs/ranks.md).

A scenario is data: a configuration (vLLM flag spelling), a scripted workload per DP rank,
and two sets of run options, the buggy one and the fixed one, each with the outcome it must
produce. ``tests/ranks/test_scenarios.py`` runs every one both ways.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

__all__ = ["RankScenario", "RANK_SCENARIOS"]

_FDO = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4, 8]}


@dataclass(frozen=True)
class RankScenario:
    """``buggy`` / ``fixed``: RankOptions fields; ``expect_*``: an error class name or "ok",
    plus the rule (mismatches) or the straggler (timeouts) when pinned."""

    name: str
    issue: str
    catches: str
    config: Mapping[str, Any]
    steps: Mapping[int, tuple[tuple[int, bool, int], ...]]  # dp_rank -> (tokens, uniform decode, draft steps)
    buggy: Mapping[str, Any]
    fixed: Mapping[str, Any]
    expect_buggy: str
    expect_fixed: str = "ok"
    buggy_rule: Optional[str] = None
    buggy_straggler: Optional[int] = None
    common: Mapping[str, Any] = field(default_factory=dict)


def _decode(tokens: int, n: int, drafts: int = 0) -> tuple[tuple[int, bool, int], ...]:
    return tuple((tokens, True, drafts) for _ in range(n))


RANK_SCENARIOS: tuple[RankScenario, ...] = (
    RankScenario(
        "mc2_skip_unsynced_mode", "vLLM Ascend #13826",
        "the MC2 skip path keeps each DP rank's own mode: one replays a graph, one runs eagerly, in one EP collective",
        {"model": "tiny-moe", "data_parallel_size": 2, "compilation_config": _FDO},
        {0: _decode(4, 3), 1: ((40, False, 0),) + _decode(4, 2)},
        {"dp_sync_policy": "vllm_ascend"}, {"dp_sync_policy": "fixed"},
        "CollectiveMismatch", buggy_rule="graph_never_meets_eager", common={"mc2_skip": True},
    ),
    RankScenario(
        "zero_token_step_skips_sync", "vLLM #43547",
        "a zero-token step (requests left) returns without the DP sync; the ranks' collective sequences drift",
        {"model": "tiny-moe", "data_parallel_size": 2, "compilation_config": _FDO},
        {0: _decode(2, 6), 1: ((2, True, 0), (0, False, 0), (2, True, 0), (2, True, 0))},
        {"idle_policy": "external_launcher_only"}, {"idle_policy": "always_dummy"},
        "CollectiveMismatch", buggy_rule="same_shape", common={"unfinished_interval": 4},
    ),
    RankScenario(
        "draft_steps_differ", "vLLM Ascend #12036",
        "speculative decoding runs a different number of draft steps (each with a DP sync) per rank",
        {"model": "tiny-moe", "data_parallel_size": 2, "num_speculative_tokens": 2,
         "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [3, 6, 12]}},
        {0: _decode(3, 2, drafts=2), 1: _decode(3, 2, drafts=1)},
        {"draft_steps": "local"}, {"draft_steps": "agreed"},
        "CollectiveMismatch", buggy_rule="same_shape",
    ),
    RankScenario(
        "sync_tensors_differ", "vLLM Ascend #9689",
        "a [4, dp] sync tensor (vLLM's coordinate_batch_across_dp) meets a [2, dp] one (vLLM Ascend's) on one group",
        {"model": "tiny-moe", "data_parallel_size": 2, "compilation_config": _FDO},
        {0: _decode(2, 2), 1: _decode(2, 2)},
        {"dp_sync_policy": "vllm_ascend", "dp_sync_policy_by_rank": {1: "vllm"}}, {"dp_sync_policy": "vllm_ascend"},
        "CollectiveMismatch", buggy_rule="same_shape",
    ),
    RankScenario(
        "graph_meets_eager", "vLLM Ascend PR #6011",
        "only token counts are synced: a decode rank replays a FULL graph while a prefill rank runs eagerly",
        {"model": "tiny-moe", "data_parallel_size": 2, "compilation_config": _FDO},
        {0: _decode(4, 2), 1: ((8, False, 0),) + _decode(4, 1)},
        {"dp_sync_policy": "pre_6011"}, {"dp_sync_policy": "fixed"},
        "CollectiveMismatch", buggy_rule="post_sync_invariant",  # caught at the decision, before the EP collective
    ),
    RankScenario(
        "capture_fallback_on_one_rank", "vLLM Ascend #13688",
        "one rank's capture fails (AIV expansion) and it falls back to eager alone: its TP peer replays a graph",
        {"model": "tiny-moe", "tensor_parallel_size": 2, "compilation_config": _FDO},
        {0: _decode(2, 3)},
        {"capture_agreement": "per_rank"}, {"capture_agreement": "agreed"},
        "CollectiveMismatch", buggy_rule="graph_never_meets_eager",
        common={"on_capture_error": "eager", "faults": "rank=1:capture_begin=2*off->raise(207008)",
                "env": {"HCCL_OP_EXPANSION_MODE": "AIV"}},
    ),
    RankScenario(
        "capture_error_on_one_rank", "vLLM #45610",
        "one rank's capture runs out of memory and it stops; its peers wait in their first collective",
        {"model": "tiny-moe", "tensor_parallel_size": 2, "compilation_config": _FDO},
        {0: _decode(2, 3)},
        {"capture_agreement": "per_rank"}, {"capture_agreement": "agreed"},
        "CollectiveTimeout", expect_fixed="OutOfMemoryError", buggy_straggler=1,
        common={"on_capture_error": "raise", "faults": "rank=1:capture_begin=2*off->raise(oom)"},
    ),
)
