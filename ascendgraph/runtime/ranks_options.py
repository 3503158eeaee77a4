"""The options of a multi-rank run and their bounds (docs/ranks.md "Limits").

`RankOptions` checks every field's type and range itself, so the API, the CLI and rank
scenario files (`ascendgraph.tools.scenario.ranks`) refuse the same values with the same
one-line ConfigError; `RankOptions.check_layout` checks the ranks it names against a layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from ascendgraph.errors import ConfigError
from ascendgraph.parallel.coordination import get_policy, idle_step_joins_sync
from ascendgraph.parallel.layout import MAX_WORLD_SIZE, ParallelLayout

__all__ = ["Step", "RankOptions", "CAPTURE_AGREEMENTS", "DRAFT_STEP_POLICIES", "MAX_SCRIPTED_STEPS"]

CAPTURE_AGREEMENTS = ("agreed", "per_rank")
DRAFT_STEP_POLICIES = ("agreed", "local")

# Bounds of the run options (docs/ranks.md "Limits"): generous for any real scenario, small
# enough that a mistyped number is refused (ConfigError, exit 2) instead of running for days.
MAX_SEED = 2**63 - 1
MAX_REQUESTS = 1_000_000  # per DP rank, as `ascendgraph run --requests`
MAX_STEPS = 100_000  # steps of one rank (max_steps)
MAX_SCRIPTED_STEPS = 10_000  # scripted steps per DP rank
MAX_STEP_TOKENS = 131_072  # tokens of one scripted step (the workload's longest sequence)
MAX_DRAFT_STEPS = 64  # draft steps of one step (vLLM's num_speculative_tokens is a handful)
MAX_UNFINISHED_INTERVAL = 1_024  # vLLM's engine core syncs every 32 steps
MAX_CAPTURE_SIZES = 1_024  # capture sizes of one rank
MAX_CAPTURE_SIZE = 65_536  # one capture size (tokens)
MAX_STREAM_LIMIT = 1_000_000  # as `--stream-limit`
MAX_TIMEOUT_S = 86_400.0  # one day of virtual time


def _int_in(name: str, value: Any, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{name} must be an integer from {low} to {high}, got {value!r}",
                          key=name.split()[-1])
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}", key=name.split()[-1])
    return value


def _rank_keyed(name: str, table: Any) -> Mapping[int, Any]:
    if not isinstance(table, Mapping):
        raise ConfigError(f"{name} must be a table keyed by rank, got {table!r}", key=name)
    for rank in table:
        _int_in(f"{name} rank", rank, 0, MAX_WORLD_SIZE - 1)
    return table


@dataclass(frozen=True)
class Step:
    """One scheduled step of a DP rank: tokens (0: requests left but nothing schedulable),
    whether it is a uniform decode batch, and how many draft steps its proposer runs."""

    tokens: int
    uniform_decode: bool = False
    draft_steps: int = 0

    def __post_init__(self) -> None:
        _int_in("step tokens", self.tokens, 0, MAX_STEP_TOKENS)
        _bool("step uniform_decode", self.uniform_decode)
        _int_in("step draft_steps", self.draft_steps, 0, MAX_DRAFT_STEPS)


@dataclass(frozen=True)
class RankOptions:
    """How to run the ranks (see the module docstring for each policy)."""

    dp_sync_policy: str = "fixed"
    dp_sync_policy_by_rank: Mapping[int, str] = field(default_factory=dict)  # per-rank overrides (#9689)
    idle_policy: str = "always_dummy"
    capture_agreement: str = "agreed"
    draft_steps: str = "agreed"
    on_capture_error: str = "raise"
    faults: Optional[str] = None  # a plan with optional rank=R: prefixes (docs/ranks.md)
    seed: int = 0
    requests: int = 16  # per DP rank (generated workloads)
    steps: Optional[Mapping[int, Sequence[Step]]] = None  # scripted workload per DP rank
    moe: Optional[bool] = None  # None: the model preset has experts
    mc2_skip: bool = False  # should_skip_allreduce_across_dp_group's answer (MoE KV consumer under MC2)
    sequence_parallel: bool = False
    unfinished_interval: int = 32  # vLLM's DP engines all-reduce "unfinished requests" every N steps
    timeout_s: Optional[float] = None  # None: HCCL_EXEC_TIMEOUT's default (env)
    stream_limits: Mapping[int, int] = field(default_factory=dict)  # per rank
    # per rank: capture sizes that differ from the configuration's (a rank started differently)
    capture_sizes_by_rank: Mapping[int, Sequence[int]] = field(default_factory=dict)
    env: Optional[Mapping[str, str]] = None
    sim_profile: Optional[str] = None
    max_steps: int = 100_000

    def __post_init__(self) -> None:
        for name, table in (("dp_sync_policy_by_rank", self.dp_sync_policy_by_rank),
                            ("stream_limits", self.stream_limits), ("capture_sizes_by_rank", self.capture_sizes_by_rank)):
            _rank_keyed(name, table)
        if not isinstance(self.dp_sync_policy, str):
            raise ConfigError(f"dp_sync_policy must be a policy name, got {self.dp_sync_policy!r}", key="dp_sync_policy")
        get_policy(self.dp_sync_policy)
        for name in self.dp_sync_policy_by_rank.values():
            if not isinstance(name, str):
                raise ConfigError(f"dp_sync_policy_by_rank values must be policy names, got {name!r}",
                                  key="dp_sync_policy_by_rank")
            get_policy(name)
        if not isinstance(self.idle_policy, str):
            raise ConfigError(f"idle_policy must be a policy name, got {self.idle_policy!r}", key="idle_policy")
        idle_step_joins_sync(self.idle_policy)
        _int_in("seed", self.seed, 0, MAX_SEED)
        _int_in("requests", self.requests, 1, MAX_REQUESTS)
        _int_in("max_steps", self.max_steps, 1, MAX_STEPS)
        _bool("mc2_skip", self.mc2_skip)
        _bool("sequence_parallel", self.sequence_parallel)
        if self.moe is not None:
            _bool("moe", self.moe)
        for name in ("faults", "sim_profile"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise ConfigError(f"{name} must be a string, got {value!r}", key=name)
        if self.env is not None and (not isinstance(self.env, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.env.items())):
            raise ConfigError(f"env must map variable names to string values, got {self.env!r}", key="env")
        if self.timeout_s is not None:
            if isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (int, float)) \
                    or not 0 <= self.timeout_s <= MAX_TIMEOUT_S:
                raise ConfigError(f"timeout_s must be a number of seconds from 0 to {MAX_TIMEOUT_S:g}, got "
                                  f"{self.timeout_s!r}", key="timeout_s")
        for rank, limit in self.stream_limits.items():
            _int_in(f"stream_limits[{rank}] stream_limit", limit, 1, MAX_STREAM_LIMIT)
        for rank, sizes in self.capture_sizes_by_rank.items():
            if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence) or len(sizes) > MAX_CAPTURE_SIZES:
                raise ConfigError(f"capture_sizes_by_rank[{rank}] must be a list of at most {MAX_CAPTURE_SIZES} "
                                  f"sizes, got {sizes!r}"[:200], key="capture_sizes_by_rank")
            for size in sizes:
                _int_in(f"capture_sizes_by_rank[{rank}] size", size, 1, MAX_CAPTURE_SIZE)
        if self.steps is not None:
            for dp_rank, items in _rank_keyed("steps", self.steps).items():
                if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) \
                        or len(items) > MAX_SCRIPTED_STEPS:
                    raise ConfigError(f"steps of DP rank {dp_rank} must be a list of at most {MAX_SCRIPTED_STEPS} "
                                      "steps", key="steps")
                if not all(isinstance(step, Step) for step in items):
                    raise ConfigError(f"steps of DP rank {dp_rank} must be Step objects", key="steps")
        for name, value, allowed in (("capture_agreement", self.capture_agreement, CAPTURE_AGREEMENTS),
                                     ("draft_steps", self.draft_steps, DRAFT_STEP_POLICIES),
                                     ("on_capture_error", self.on_capture_error, ("raise", "eager"))):
            if value not in allowed:
                raise ConfigError(f"{name} must be one of {', '.join(allowed)}, got {value!r}", key=name)
        _int_in("unfinished_interval", self.unfinished_interval, 1, MAX_UNFINISHED_INTERVAL)

    def check_layout(self, layout: ParallelLayout) -> None:
        """Every rank this run names lies inside ``layout`` (a ConfigError naming the key)."""
        for name, table, size, what in (("dp_sync_policy_by_rank", self.dp_sync_policy_by_rank, layout.world_size, "rank"),
                                        ("stream_limits", self.stream_limits, layout.world_size, "rank"),
                                        ("capture_sizes_by_rank", self.capture_sizes_by_rank, layout.world_size, "rank"),
                                        ("steps", self.steps or {}, layout.dp, "DP rank")):
            outside = sorted(r for r in table if r >= size)
            if outside:
                raise ConfigError(f"{name} names {what} {outside[0]}, outside the layout ({layout.describe()}: "
                                  f"{what}s 0 to {size - 1})", key=name)
