"""Multi-rank rules (docs/ranks.md): the rank layout and its groups, collective fingerprints
and the rules that let them meet, and the per-step coordination of data-parallel ranks.

Pure and torch-free like the other rule modules: the in-process collective fabric that
applies them is `sim.fabric`, the runner that steps many ranks is `ascendgraph.runtime.ranks`.

    layout          ParallelLayout: [DP][PP][TP] rank order, groups world / dp / tp / ep / pp
    fingerprints    Fingerprint, COMPATIBILITY_RULES, check_meeting, the HCCL wait timeout
    coordination    _sync_metadata_across_dp / _determine_batch_execution_and_padding /
                    execute_dummy_batch / coordinate_batch_across_dp as pure functions, and
                    the selectable policies (the buggy ones included)
"""

from ascendgraph.parallel.layout import GROUP_NAMES, ParallelLayout, RankCoords
from ascendgraph.parallel.fingerprints import (
    COMPATIBILITY_RULES,
    EAGER,
    Fingerprint,
    MeetingViolation,
    check_meeting,
    default_collective_timeout_s,
    graph_how,
)
from ascendgraph.parallel.coordination import (
    DP_SYNC_POLICIES,
    IDLE_POLICIES,
    DpSyncPolicy,
    StepPlan,
    SyncResult,
    coordinate_batch_across_dp,
    determine_batch_execution_and_padding,
    execute_dummy_batch_tokens,
    should_skip_allreduce_across_dp_group,
    sync_metadata_across_dp,
)

__all__ = [
    "GROUP_NAMES",
    "ParallelLayout",
    "RankCoords",
    "COMPATIBILITY_RULES",
    "EAGER",
    "Fingerprint",
    "MeetingViolation",
    "check_meeting",
    "default_collective_timeout_s",
    "graph_how",
    "DP_SYNC_POLICIES",
    "IDLE_POLICIES",
    "DpSyncPolicy",
    "StepPlan",
    "SyncResult",
    "coordinate_batch_across_dp",
    "determine_batch_execution_and_padding",
    "execute_dummy_batch_tokens",
    "should_skip_allreduce_across_dp_group",
    "sync_metadata_across_dp",
]
