"""The per-step coordination of data-parallel ranks, as pure functions with their sources.

Every DP rank decides, each step, which graph (if any) its batch replays and how far it is
padded; the DP ranks must agree, because the step's MoE / EP collectives pair them up. The
functions below are our own re-statements of what vLLM Ascend and vLLM do (read at the
sources named; no code is copied). Each takes the collective from outside, split in two so a
caller can meet its peers in between: ``*_contribution`` gives this rank's rows of the
all-reduced int32 tensor (or None when the policy skips the all-reduce), ``*_result`` reads
the reduced tensor. `sync_metadata_across_dp` and `determine_batch_execution_and_padding`
compose them around an ``all_reduce`` callable for callers that need no meeting point.

Sources (vLLM Ascend at commit 182b75ea, vllm_ascend/worker/model_runner_v1.py unless said):

* ``NPUModelRunner._sync_metadata_across_dp``: a ``[2, dp]`` int32 all-reduce of (tokens,
  runtime mode) on the DP CPU group; the mode agreed is the minimum (``_post_process_cudagraph_mode``);
  padded to the maximum when ``allow_dp_padding``. Its *skip path*: when
  ``should_skip_allreduce_across_dp_group`` (vllm_ascend/utils.py) is true it returns the
  rank's own tokens and its own, unsynced, mode (vLLM Ascend #13826: ranks then mix graph and
  eager in one EP collective and hang).
* ``_determine_batch_execution_and_padding``: dispatch, then sync with ``allow_dp_padding``
  decided from the rank's *local* mode, then re-dispatch at the agreed size with
  ``valid_modes={synced mode}``, asserting the key's size is the agreed one.
* ``NPUWorker.execute_dummy_batch`` (vllm_ascend/worker/worker.py): an idle DP rank runs a
  dummy uniform-decode batch of ``uniform_decode_query_len`` tokens, so it still joins the sync.
* vLLM ``vllm/v1/worker/dp_utils.py`` ``coordinate_batch_across_dp`` / ``_synchronize_dp_ranks``:
  a ``[4, dp]`` all-reduce (unpadded, padded, ubatch, mode); the mode agreed is the minimum
  and padding follows the *synced* mode (``should_dp_pad = synced != NONE``).
* vLLM #43547: ``execute_model`` returns early on a zero-token step (requests left, nothing
  schedulable) without joining ``coordinate_batch_across_dp`` unless the executor is
  ``external_launcher``; PR #44601 runs the dummy step for every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence

from ascendgraph.errors import ConfigError

__all__ = [
    "MODE_NONE",
    "DpSyncPolicy",
    "DP_SYNC_POLICIES",
    "IDLE_POLICIES",
    "SyncResult",
    "StepPlan",
    "Dispatch",
    "AllReduce",
    "should_skip_allreduce_across_dp_group",
    "dp_sync_contribution",
    "dp_sync_result",
    "sync_metadata_across_dp",
    "coordinate_batch_across_dp",
    "first_dispatch",
    "redispatch_after_sync",
    "RedispatchFailed",
    "determine_batch_execution_and_padding",
    "execute_dummy_batch_tokens",
    "idle_step_joins_sync",
    "get_policy",
]

MODE_NONE = 0  # vLLM's CUDAGraphMode values for runtime modes: NONE 0, PIECEWISE 1, FULL 2


@dataclass(frozen=True)
class DpSyncPolicy:
    """How a DP rank syncs its step metadata: the tensor it all-reduces, whether it honours
    the MC2 skip path, and whether DP padding follows the local or the synced mode."""

    name: str
    rows: int  # 2: vLLM Ascend's (tokens, mode); 4: vLLM's (unpadded, padded, ubatch, mode)
    honours_skip: bool
    padding_from: str  # "local" | "synced"
    source: str
    known_bug: str = ""
    syncs_mode: bool = True  # False: only the token counts are agreed (before vLLM Ascend PR #6011)


DP_SYNC_POLICIES: Mapping[str, DpSyncPolicy] = {
    "vllm_ascend": DpSyncPolicy(
        "vllm_ascend", 2, True, "local",
        "vLLM Ascend 182b75ea: NPUModelRunner._sync_metadata_across_dp and _determine_batch_execution_and_padding",
        "the MC2 skip path returns the local, unsynced mode (#13826); padding follows the local mode",
    ),
    "fixed": DpSyncPolicy(
        "fixed", 2, False, "synced",
        "vLLM Ascend's sync without the skip path under graph mode (#13826's fix), padding on the synced mode "
        "(as vLLM's _synchronize_dp_ranks)",
    ),
    "pre_6011": DpSyncPolicy(
        "pre_6011", 2, False, "local",
        "vLLM Ascend before PR #6011: the token counts are synced, each rank keeps its own runtime mode",
        "ranks mix graph and eager in one collective (#6011: A2 + AIV hangs)", syncs_mode=False,
    ),
    "vllm": DpSyncPolicy(
        "vllm", 4, False, "synced",
        "vLLM vllm/v1/worker/dp_utils.py: coordinate_batch_across_dp / _synchronize_dp_ranks",
    ),
}

# What a DP rank does on a step with zero scheduled tokens while it still has requests.
IDLE_POLICIES: Mapping[str, str] = {
    "external_launcher_only": "vLLM #43547: returns without the DP sync unless the executor is external_launcher",
    "always_dummy": "vLLM PR #44601 (the fix of #43547): a dummy step joins the DP sync on every backend",
}


def get_policy(name: str) -> DpSyncPolicy:
    policy = DP_SYNC_POLICIES.get(name)
    if policy is None:
        raise ConfigError(f"unknown DP sync policy {name!r}; policies: {', '.join(DP_SYNC_POLICIES)}",
                          key="dp_sync_policy")
    return policy


def idle_step_joins_sync(idle_policy: str, *, executor_backend: str = "mp") -> bool:
    """Whether a zero-token step (requests left) joins the DP sync (vLLM #43547 / PR #44601)."""
    if idle_policy not in IDLE_POLICIES:
        raise ConfigError(f"unknown idle policy {idle_policy!r}; policies: {', '.join(IDLE_POLICIES)}",
                          key="idle_policy")
    return idle_policy == "always_dummy" or executor_backend == "external_launcher"


@dataclass(frozen=True)
class SyncResult:
    """What the DP sync hands back: the agreed maximum, the per-rank padded token counts
    (None when dp == 1), the mode to use, and whether the all-reduce was skipped."""

    max_tokens: int
    num_tokens_across_dp: Optional[tuple[int, ...]]
    synced_mode: int
    skipped: bool = False


@dataclass(frozen=True)
class StepPlan:
    """A rank's decision for one step: runtime mode value, padded tokens, graph key."""

    mode: int
    num_tokens_padded: int
    key: str
    num_tokens_across_dp: Optional[tuple[int, ...]] = None


# dispatch(num_tokens, uniform_decode, valid_modes or None) -> (mode value, padded tokens, key)
Dispatch = Callable[[int, bool, Optional[frozenset[int]]], tuple[int, int, str]]
AllReduce = Callable[[list[list[int]]], list[list[int]]]  # sum over the DP group


def should_skip_allreduce_across_dp_group(
    *, is_moe: bool, is_kv_consumer: bool, decode_needs_mc2: bool, prefill_needs_mc2: bool,
    uniform_cudagraph_mode: bool, recompute_scheduler_enable: bool = False, hierarchical_comm: bool = False,
) -> bool:
    """vllm_ascend/utils.py ``should_skip_allreduce_across_dp_group`` (182b75ea): never with
    hierarchical communication; always for dense models; for MoE only on KV-consumer ranks whose
    decode needs MC2 and whose prefill also does under one graph routine (or with the
    recompute scheduler)."""
    if hierarchical_comm:
        return False
    if not is_moe:
        return True
    if not is_kv_consumer:
        return False
    return decode_needs_mc2 and ((prefill_needs_mc2 and uniform_cudagraph_mode) or recompute_scheduler_enable)


def dp_sync_contribution(policy: DpSyncPolicy, *, num_tokens: int, mode: int, dp_size: int, dp_rank: int,
                         skip: bool = False) -> Optional[list[list[int]]]:
    """This rank's rows of the all-reduced tensor, or None when the policy skips the all-reduce."""
    if dp_size == 1 or (skip and policy.honours_skip):
        return None
    rows = [[0] * dp_size for _ in range(policy.rows)]
    if policy.rows == 2:
        rows[0][dp_rank], rows[1][dp_rank] = num_tokens, mode
    else:  # vLLM: unpadded, padded, should_ubatch (never here), mode
        rows[0][dp_rank], rows[1][dp_rank], rows[3][dp_rank] = num_tokens, num_tokens, mode
    return rows


def dp_sync_result(policy: DpSyncPolicy, reduced: Optional[Sequence[Sequence[int]]], *, num_tokens: int,
                   mode: int, dp_size: int, sequence_parallel: bool = False, oproj_tp: bool = False,
                   embedding_tp: bool = False, draft: bool = False) -> SyncResult:
    """Read the reduced tensor (None: the all-reduce was skipped or dp == 1). DP padding
    (``allow_dp_padding``, model_runner_v1.py:2776-2781) holds when the deciding mode is not
    NONE, or under sequence parallelism, o_proj TP or embedding TP; a draft model's sync
    always pads (``is_draft_model``, model_runner_v1.py:700)."""
    if dp_size == 1:
        return SyncResult(num_tokens, None, mode)
    if reduced is None:  # the skip path: own tokens, own (unsynced) mode
        return SyncResult(num_tokens, tuple([num_tokens] * dp_size), mode, skipped=True)
    tokens = tuple(int(v) for v in (reduced[0] if policy.rows == 2 else reduced[1]))
    synced = int(min(reduced[1] if policy.rows == 2 else reduced[3])) if policy.syncs_mode else mode
    deciding_mode = mode if policy.padding_from == "local" else synced
    pad = deciding_mode != MODE_NONE or sequence_parallel or oproj_tp or embedding_tp or draft
    across = tuple([max(tokens)] * dp_size) if pad else tokens
    return SyncResult(max(tokens), across, synced)


def sync_metadata_across_dp(policy: DpSyncPolicy, all_reduce: AllReduce, *, num_tokens: int, mode: int,
                            dp_size: int, dp_rank: int, skip: bool = False, sequence_parallel: bool = False,
                            oproj_tp: bool = False, embedding_tp: bool = False, draft: bool = False) -> SyncResult:
    """vLLM Ascend's ``_sync_metadata_across_dp`` under ``policy`` (contribution, all-reduce, result);
    ``draft``: the drafter's call (``is_draft_model=True``: mode NONE, always padded)."""
    mode = MODE_NONE if draft else mode
    rows = dp_sync_contribution(policy, num_tokens=num_tokens, mode=mode, dp_size=dp_size, dp_rank=dp_rank, skip=skip)
    reduced = all_reduce(rows) if rows is not None else None
    return dp_sync_result(policy, reduced, num_tokens=num_tokens, mode=mode, dp_size=dp_size,
                          sequence_parallel=sequence_parallel, oproj_tp=oproj_tp, embedding_tp=embedding_tp,
                          draft=draft)


def coordinate_batch_across_dp(all_reduce: AllReduce, *, num_tokens_unpadded: int, dp_size: int, dp_rank: int,
                               num_tokens_padded: Optional[int] = None, cudagraph_mode: int = 0,
                               ) -> tuple[bool, Optional[tuple[int, ...]], int]:
    """vLLM's ``coordinate_batch_across_dp`` without microbatching: (should_ubatch,
    num_tokens_after_padding, synced_cudagraph_mode)."""
    if dp_size == 1:
        return False, None, cudagraph_mode
    padded = num_tokens_unpadded if num_tokens_padded is None else num_tokens_padded
    if padded < num_tokens_unpadded:
        raise ConfigError(f"num_tokens_padded {padded} < num_tokens_unpadded {num_tokens_unpadded}",
                          key="num_tokens_padded")
    rows = [[0] * dp_size for _ in range(4)]
    rows[0][dp_rank], rows[1][dp_rank], rows[3][dp_rank] = num_tokens_unpadded, padded, cudagraph_mode
    reduced = all_reduce(rows)
    synced = int(min(reduced[3]))
    padded_row = tuple(int(v) for v in reduced[1])
    across = tuple([max(padded_row)] * dp_size) if synced != MODE_NONE else padded_row
    return False, across, synced


def _pad_for_sequence_parallelism(num_tokens: int, sp_tp: int) -> int:
    return num_tokens if sp_tp <= 1 else -(-num_tokens // sp_tp) * sp_tp


def first_dispatch(num_tokens: int, *, uniform_decode: bool, dispatch: Dispatch, sp_tp: int = 1,
                   force_eager: bool = False) -> StepPlan:
    """The local dispatch before the sync (sequence-parallel padding first, as vLLM Ascend)."""
    padded = _pad_for_sequence_parallelism(num_tokens, sp_tp)
    if force_eager:
        return StepPlan(MODE_NONE, padded, f"eager:{padded}")
    mode, tokens, key = dispatch(padded, uniform_decode, None)
    if sp_tp > 1 and tokens % sp_tp:
        raise ConfigError(f"sequence parallelism needs the padded size {tokens} to be a multiple of tp={sp_tp}",
                          key="tensor_parallel_size")
    return StepPlan(mode, tokens, key)


class RedispatchFailed(RuntimeError):
    """The re-dispatch at the agreed size found no graph of the synced mode: vLLM's dispatcher
    asserts there (``assert CUDAGraphMode.NONE in allowed_modes``, vllm/v1/cudagraph_dispatcher.py
    in 0.27.1) and the rank stops."""


def redispatch_after_sync(plan: StepPlan, sync: SyncResult, *, dp_rank: int, uniform_decode: bool,
                          dispatch: Dispatch) -> StepPlan:
    """Re-dispatch at the agreed size with ``valid_modes={synced mode}`` only
    (model_runner_v1.py:2789-2792): where no graph of that mode matches, vLLM's dispatcher
    asserts, so does this (`RedispatchFailed`)."""
    if sync.num_tokens_across_dp is None:
        return plan
    padded = sync.num_tokens_across_dp[dp_rank]
    try:
        mode, tokens, key = dispatch(padded, uniform_decode, frozenset({sync.synced_mode}))
    except ConfigError as exc:
        raise RedispatchFailed(f"re-dispatch at the agreed size {padded} with valid_modes={{{sync.synced_mode}}}: "
                               f"{exc}") from None
    if tokens != padded:
        raise ConfigError(f"re-dispatch at the agreed size {padded} gave a key of {tokens} tokens",
                          key="num_tokens_across_dp")
    return StepPlan(mode, tokens, key, sync.num_tokens_across_dp)


def determine_batch_execution_and_padding(
    policy: DpSyncPolicy, all_reduce: AllReduce, *, num_tokens: int, uniform_decode: bool, dispatch: Dispatch,
    dp_size: int, dp_rank: int, skip: bool = False, sp_tp: int = 1, oproj_tp: bool = False,
    embedding_tp: bool = False,
) -> tuple[StepPlan, SyncResult]:
    """vLLM Ascend's ``_determine_batch_execution_and_padding``: dispatch, sync, re-dispatch."""
    plan = first_dispatch(num_tokens, uniform_decode=uniform_decode, dispatch=dispatch, sp_tp=sp_tp)
    sync = sync_metadata_across_dp(policy, all_reduce, num_tokens=plan.num_tokens_padded, mode=plan.mode,
                                   dp_size=dp_size, dp_rank=dp_rank, skip=skip, sequence_parallel=sp_tp > 1,
                                   oproj_tp=oproj_tp, embedding_tp=embedding_tp)
    return redispatch_after_sync(plan, sync, dp_rank=dp_rank, uniform_decode=uniform_decode, dispatch=dispatch), sync


def execute_dummy_batch_tokens(uniform_decode_query_len: int = 1) -> tuple[int, bool]:
    """``NPUWorker.execute_dummy_batch``: (tokens, uniform_decode) of an idle rank's dummy batch."""
    return max(1, uniform_decode_query_len), True
