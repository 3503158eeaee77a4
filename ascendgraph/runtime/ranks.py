"""Many ranks in one process: DP/TP/EP lock-step simulation (docs/ranks.md).

Theory of operation. `run_ranks` builds one *rank* per position of the [DP][PP][TP] layout
(`ascendgraph.parallel.layout`). Each rank owns its simulator device (its stream budget,
graph pool, fault plan and environment), its graph dispatcher and its workload shard (the
batches its DP rank's scheduler forms; TP ranks of one DP rank share them). Each rank runs
as a program (a generator) under the device's collective fabric (`sim.fabric`), which steps
the programs in a seeded order, so a seed reproduces a run exactly.

A rank's program:

1. **Capture, as an agreed phase** (``capture_agreement="agreed"``): the capture lists are
   compared first (a world all-reduce of which keys each rank would capture; only the keys
   every rank has are captured), then each key is captured on the rank's device: a graph
   holding the step's TP all-reduce and MoE dispatch / combine on the EP group, so the
   device charges the streams those communicators cost. A world all-reduce of who failed
   follows: any failure makes *every* rank fall back to eager (``on_capture_error="eager"``)
   or abort (``"raise"``). ``"per_rank"`` is the old behaviour: each rank decides alone.
2. **Steps** until the DP ranks agree nothing is left (the periodic unfinished-requests
   all-reduce, every ``unfinished_interval`` steps): dispatch, DP sync and re-dispatch
   (`ascendgraph.parallel.coordination` under ``dp_sync_policy``), the post-sync decision
   (checked by the fabric), then the forward: a replay whose captured collectives meet as
   ``graph:<key>``, or eager collectives; then speculative decoding's proposer call: one
   DP sync (mode NONE, always padded), then its draft forwards, whose collectives meet on
   the EP group (``draft_steps="agreed"`` runs the DP maximum on every rank).
   An idle DP rank runs `execute_dummy_batch`; a zero-token step with requests left follows
   ``idle_policy``.

What is modelled per step is the coordination and the collectives, not the model: no
tensors are computed (the devices use meta tensors), so 64 ranks step quickly.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Any, Generator, Optional, Protocol, Sequence, runtime_checkable

from ascendgraph.config import GraphConfig
from ascendgraph.device import CollectiveFabric, Device, VirtualClock, get_device
from ascendgraph.dispatch import GraphDispatcher
from ascendgraph.errors import CaptureError, ConfigError, DeviceUnavailable, GraphHang, rewrite_capture_error
from ascendgraph.modes import GraphMode
from ascendgraph.parallel.coordination import (
    MODE_NONE,
    dp_sync_contribution,
    dp_sync_result,
    StepPlan,
    execute_dummy_batch_tokens,
    first_dispatch,
    get_policy,
    idle_step_joins_sync,
    redispatch_after_sync,
)
from ascendgraph.parallel.fingerprints import EAGER, default_collective_timeout_s, graph_how
from ascendgraph.parallel.layout import ParallelLayout, RankCoords, check_heads_split
from ascendgraph.resolve import resolve
from ascendgraph.parallel.rank_faults import split_rank_faults
from ascendgraph.runtime.ranks_options import CAPTURE_AGREEMENTS, DRAFT_STEP_POLICIES, RankOptions, Step
from ascendgraph.runtime.workload import WorkloadSpec, generate_workload, simulate_steps

__all__ = ["Step", "RankOptions", "RankSummary", "RanksReport", "run_ranks", "build_rank", "layout_of",
           "rank_program", "CAPTURE_AGREEMENTS", "DRAFT_STEP_POLICIES"]

log = logging.getLogger(__name__)

MC2_TOKENS_PER_RANK = 512  # vLLM Ascend _MC2_TOKENS_PER_RANK_LIMIT (ascend_forward_context.py:35@182b75ea); PR #8987 (closed, not merged) proposed 256 on A2
EAGER_FORWARD_US = 2000.0  # nominal virtual time of one eager forward (host launch bound)
_MODE_NAMES = {0: "NONE", 1: "PIECEWISE", 2: "FULL"}
PP_NOT_SIMULATED = ("pipeline parallelism: no activations pass between stages (no send/recv); each stage runs "
                    "its own DP / TP / EP collectives only, so a PP communication hang is not detected")


@dataclass
class RankSummary:
    """What one rank did (the report's ``ranks`` section)."""

    rank: int
    dp_rank: int
    tp_rank: int
    batches_by_mode: dict[str, int] = field(default_factory=lambda: {"FULL": 0, "PIECEWISE": 0, "NONE": 0})
    replays: int = 0
    dummy_batches: int = 0
    skipped_syncs: int = 0
    graphs_captured: int = 0
    streams_in_use: int = 0
    capture_fallback: bool = False
    collectives_met: int = 0
    clock_us: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class RanksReport:
    """The outcome of a multi-rank run."""

    layout: ParallelLayout
    options: RankOptions
    ranks: list[RankSummary]
    collectives_met: dict[str, int]
    error: Optional[BaseException] = None
    dropped_keys: int = 0
    # The rank whose own failure is the run's error; None when the run succeeded or the fabric
    # found the error (a mismatch, deadlock or timeout names its ranks itself).
    failed_rank: Optional[int] = None

    @property
    def not_simulated(self) -> list[str]:
        """What this layout has that the rank programs do not simulate (said in text and JSON)."""
        gaps = []
        if self.layout.pp > 1:
            gaps.append(PP_NOT_SIMULATED)
        return gaps

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_json(self) -> dict[str, Any]:
        error = None
        if self.error is not None:
            error = {"type": type(self.error).__name__, "message": str(self.error),
                     "ranks": list(getattr(self.error, "ranks", ()) or ()),
                     "straggler": getattr(self.error, "straggler", None),
                     "rules": list(getattr(self.error, "rules", ()) or ()),
                     "rank": self.failed_rank}
        return {
            "layout": {"dp": self.layout.dp, "pp": self.layout.pp, "tp": self.layout.tp,
                       "world_size": self.layout.world_size, "ep": self.layout.ep},
            "policies": {"dp_sync_policy": self.options.dp_sync_policy, "idle_policy": self.options.idle_policy,
                         "capture_agreement": self.options.capture_agreement,
                         "draft_steps": self.options.draft_steps},
            "collectives_met": dict(self.collectives_met),
            "capture_keys_dropped": self.dropped_keys,
            "per_rank": [r.to_json() for r in self.ranks],
            "not_simulated": self.not_simulated,
            "error": error,
        }

    def format_text(self) -> str:
        lines = [f"ranks: {self.layout.describe()}; dp sync {self.options.dp_sync_policy}, idle "
                 f"{self.options.idle_policy}, capture {self.options.capture_agreement}"]
        met = ", ".join(f"{g} {n}" for g, n in sorted(self.collectives_met.items())) or "none"
        lines.append(f"  collectives met: {met}")
        for r in self.ranks:
            modes = ", ".join(f"{m} {n}" for m, n in r.batches_by_mode.items() if n)
            lines.append(f"  rank {r.rank} (dp {r.dp_rank}, tp {r.tp_rank}): batches {modes or 'none'}; replays "
                         f"{r.replays}; dummy {r.dummy_batches}; graphs {r.graphs_captured}"
                         f"{' (fell back to eager)' if r.capture_fallback else ''}; collectives {r.collectives_met}")
        for gap in self.not_simulated:
            lines.append(f"  NOT SIMULATED: {gap}")
        if self.error is not None:
            on_rank = f" on rank {self.failed_rank}" if self.failed_rank is not None else ""
            lines.append(f"  FAILED{on_rank}: {type(self.error).__name__}: {self.error}")
        return "\n".join(lines)


# --------------------------------------------------------------------------- one rank


@runtime_checkable
class RankDevice(Device, VirtualClock, CollectiveFabric, Protocol):
    """What a rank's device provides: the `Device` operations, a `VirtualClock` (the time a rank
    spends between collectives) and a `CollectiveFabric` (where the ranks meet)."""


def _rank_device(device: Device) -> RankDevice:
    if not isinstance(device, RankDevice):
        missing = [c.__name__ for c in (VirtualClock, CollectiveFabric) if not isinstance(device, c)]
        raise DeviceUnavailable(f"device {device.name!r} cannot run ranks: it lacks {', '.join(missing)} "
                                "(ascendgraph.device capabilities); multi-rank runs need the sim device")
    return device


class _Rank:
    """One rank: its device, dispatcher, graphs and counters."""

    def __init__(self, coords: RankCoords, config: GraphConfig, options: RankOptions, layout: ParallelLayout,
                 faults: Optional[str], steps: Sequence[Step]) -> None:
        self.coords = coords
        self.config = config
        self.options = options
        self.layout = layout
        self.steps = list(steps)
        limit = options.stream_limits.get(coords.rank)
        self.device = _rank_device(get_device("sim", profile=options.sim_profile or config.soc, meta_tensors=True,
                                              faults=faults, seed=options.seed, env=dict(options.env or {}),
                                              stream_limit=limit))
        stream_limit = limit or self.device.stats().stream_limit
        self.resolution = resolve(config, env=options.env, stream_limit=stream_limit,
                                  device_profile=self.device.profile)
        self.capture_sizes = list(options.capture_sizes_by_rank.get(coords.rank, self.resolution.capture_sizes))
        self.set_mode(self.resolution.mode)
        self.graphs: dict[str, Any] = {}
        self.summary = RankSummary(coords.rank, coords.dp_rank, coords.tp_rank)
        self.hidden = config.model.hidden_size
        self.moe = options.moe if options.moe is not None else config.model.num_experts > 0
        self.sp_tp = layout.tp if options.sequence_parallel else 1
        self.dropped = 0
        self.fabric_types: tuple[Any, Any] = (None, None)

    def call(self, group: str, op: str, shape: tuple, dtype: str, *, how: str = EAGER, site: str = "",
             params: tuple = (), rows: Optional[list[list[int]]] = None, reduce: str = "sum",
             local_us: float = 0.0) -> Any:
        """A collective call for the fabric (its `Collective` class, reached through the device)."""
        return self.fabric_types[0](group=group, op=op, shape=shape, dtype=dtype, how=how, site=site,
                                    params=params, rows=rows, reduce=reduce, local_us=local_us)

    def decision(self, value: tuple, *, padded: int) -> Any:
        return self.fabric_types[1](group="dp", value=value, sp_tp=self.sp_tp, padded=padded)

    def set_mode(self, mode: GraphMode) -> None:
        self.dispatcher = GraphDispatcher(
            mode, capture_sizes=self.capture_sizes if mode is not GraphMode.NONE else [],
            max_num_seqs=self.config.max_num_seqs, uniform_decode_query_len=self.config.uniform_decode_query_len,
            max_loras=self.config.max_loras, specialize_lora=self.config.cudagraph_specialize_lora)

    def dispatch(self, tokens: int, uniform: bool, valid: Optional[frozenset[int]]) -> tuple[int, int, str]:
        modes = None if valid is None else {GraphMode(v) for v in valid}
        mode, key = self.dispatcher.dispatch(tokens, uniform_decode=uniform, valid_modes=modes)
        name = "eager" if mode is GraphMode.NONE else f"{mode.name}:{key.num_tokens}" + (
            f"x{key.num_reqs}" if key.num_reqs is not None else "")
        return int(mode.value), key.num_tokens, name

    # -- the collectives of one forward --------------------------------------------
    def forward_collectives(self, padded: int, moe_tokens: int, global_bs: int) -> list[tuple[str, str, tuple, str, tuple]]:
        """The collectives of one forward (one representative layer): the TP all-reduce of
        the attention output, then MoE dispatch and combine on the EP group."""
        calls: list[tuple[str, str, tuple, str, tuple]] = []
        if self.layout.tp > 1:
            calls.append(("tp", "all_reduce", (padded, self.hidden), "bfloat16", ()))
        if self.moe and self.layout.ep > 1:
            params = (("global_bs", global_bs),)
            calls.append(("ep", "mc2_dispatch", (moe_tokens, self.hidden), "bfloat16", params))
            calls.append(("ep", "mc2_combine", (moe_tokens, self.hidden), "bfloat16", params))
        return calls

    def capture(self, keys: Sequence[tuple[GraphMode, Any]]) -> None:
        import torch

        ops = torch.ops.ascendgraph
        for mode, key in keys:
            name = f"{mode.name}:{key.num_tokens}" + (f"x{key.num_reqs}" if key.num_reqs is not None else "")
            graph = self.device.new_graph(name)
            x = torch.empty(key.num_tokens, self.hidden, device=self.device.torch_device)
            kind = "full" if mode is GraphMode.FULL else "piecewise"
            with self.device.graph(graph, graph_kind=kind):
                if self.layout.tp > 1:
                    x = ops.all_reduce(x, "tp", self.layout.tp)
                if self.moe and self.layout.ep > 1:
                    x = ops.moe_combine(ops.moe_dispatch(x, "ep", self.layout.ep, 0), "ep", self.layout.ep, 0)
            self.graphs[name] = graph
        self.summary.graphs_captured = len(self.graphs)
        self.summary.streams_in_use = self.device.stats().streams_in_use

    def release(self) -> None:
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()


def _program(rank: _Rank) -> Generator[Any, Any, None]:
    """The program of one rank (see the module docstring)."""
    options, layout, c = rank.options, rank.layout, rank.coords
    dp = layout.dp
    last_clock = rank.device.clock()[0]  # the host clock, injected delays included

    def elapsed(extra: float = 0.0) -> float:
        nonlocal last_clock
        now = rank.device.clock()[0]
        spent, last_clock = now - last_clock + extra, now
        return spent

    # 1. capture
    keys = rank.dispatcher.capture_order()
    if options.capture_agreement == "agreed":
        # two world all-reduces: the largest size any rank captures, then which keys each has
        local_max = max((k.num_tokens for _, k in keys), default=0)
        largest = yield rank.call("world", "all_reduce", (1,), "int32", rows=[[local_max]], reduce="max",
                                  site="capture_sizes", local_us=elapsed())
        size = largest[0][0] + 1
        rows = [[0] * size for _ in range(2)]
        for mode, key in keys:
            rows[0 if mode is GraphMode.FULL else 1][key.num_tokens] = 1
        agreed = yield rank.call("world", "all_reduce", (2, size), "int32", rows=rows, site="capture_list",
                                   local_us=elapsed())
        world_size = layout.world_size
        kept = [(m, k) for m, k in keys if agreed[0 if m is GraphMode.FULL else 1][k.num_tokens] == world_size]
        rank.dropped = len(keys) - len(kept)
        if rank.dropped:  # dispatch only to what every rank captures
            rank.capture_sizes = sorted({k.num_tokens for _, k in kept})
            rank.set_mode(rank.dispatcher.mode if kept else GraphMode.NONE)
            keys = [(m, k) for m, k in rank.dispatcher.capture_order() if (m, k) in kept]
        else:
            keys = kept
    failure: Optional[BaseException] = None
    try:
        rank.capture(keys)
    except RuntimeError as exc:
        failure = rewrite_capture_error(exc)
        rank.release()
    if options.capture_agreement == "agreed":
        flags = [[0] * layout.world_size]
        flags[0][c.rank] = 1 if failure is not None else 0
        outcome = yield rank.call("world", "all_reduce", (1, layout.world_size), "int32", rows=flags,
                                    site="capture_outcome", local_us=elapsed())
        failed = [r for r, v in enumerate(outcome[0]) if v]
        if failed:
            if options.on_capture_error == "raise":
                if failure is not None:
                    raise failure
                raise CaptureError(f"capture aborted on every rank together: rank(s) {failed} failed to capture",
                                   peer_abort=True, rank=c.rank)
            rank.release()
            rank.set_mode(GraphMode.NONE)
            rank.summary.capture_fallback = True
            rank.summary.graphs_captured = 0
    elif failure is not None:
        if options.on_capture_error == "raise":
            raise failure
        rank.set_mode(GraphMode.NONE)
        rank.summary.capture_fallback = True
        rank.summary.graphs_captured = 0

    # 2. steps
    policy = get_policy(options.dp_sync_policy_by_rank.get(c.rank, options.dp_sync_policy))
    q = rank.config.uniform_decode_query_len
    index = 0
    step_no = 0
    running = True  # the engine core's view: some DP rank still has requests (vLLM engines_running)
    while True:
        if step_no >= options.max_steps:
            raise ConfigError(f"rank {c.rank} ran {options.max_steps} steps without the DP ranks agreeing they "
                              "are done", key="max_steps")
        has_work = index < len(rank.steps)
        if not has_work and (dp == 1 or not running):
            return
        step = rank.steps[index] if has_work else None
        index += 1 if has_work else 0
        dummy = step is None
        skipped = False
        if step is not None and step.tokens == 0:
            skipped = not idle_step_joins_sync(options.idle_policy)  # vLLM #43547: returns without the DP sync
            tokens, uniform = 1, False
            dummy = True
        elif step is None:
            tokens, uniform = execute_dummy_batch_tokens(q)
        else:
            tokens, uniform = step.tokens, step.uniform_decode
        if not skipped:
            rank.summary.dummy_batches += int(dummy)
            yield from _sync_and_forward(rank, policy, tokens, uniform, elapsed, site="dp_sync")
            drafts = 0 if step is None else step.draft_steps
            if options.draft_steps == "agreed" and dp > 1 and rank.config.num_speculative_tokens:
                most = yield rank.call("dp", "all_reduce", (1,), "int32", rows=[[drafts]], reduce="max",
                                       site="draft_steps", local_us=elapsed())
                drafts = most[0][0]
            if drafts:  # the proposer: one DP sync per call (mode NONE, always padded), then its draft forwards
                yield from _sync_and_forward(rank, policy, max(1, tokens), uniform, elapsed, site="draft_sync",
                                             draft=True, forwards=drafts)
        # vLLM v1/engine/core.py DPEngineCoreProc: after every step, _has_global_unfinished_reqs counts it
        # and every 32nd (unfinished_interval) runs ParallelConfig.sync_dp_state, a [2] int32 sum
        # (unfinished, pending pause) on the engine core's own DP group: another communicator than the
        # workers' DP sync, so a rank that skipped a sync waits there while its peers wait in the sync.
        step_no += 1
        if dp > 1 and step_no % options.unfinished_interval == 0:
            reduced = yield rank.call("dp_engine", "all_reduce", (2,), "int32",
                                      rows=[[1 if index < len(rank.steps) else 0, 0]], site="sync_dp_state",
                                      local_us=elapsed())
            running = reduced[0][0] > 0


def _sync_and_forward(rank: _Rank, policy: Any, tokens: int, uniform: bool, elapsed: Any, *, site: str,
                      draft: bool = False, forwards: int = 1) -> Generator[Any, Any, bool]:
    """The DP sync and re-dispatch, the post-sync check, then ``forwards`` forwards. A draft
    (vLLM Ascend's proposers, e.g. spec_decode/llm_base_proposer.py:805-825): one sync per
    proposer call with ``is_draft_model=True`` (mode NONE, always padded to the DP maximum),
    then the proposer's own dispatch at the padded size (no mode restriction) for each of its
    draft forwards."""
    options, layout, c = rank.options, rank.layout, rank.coords
    plan = first_dispatch(tokens, uniform_decode=uniform, dispatch=rank.dispatch, sp_tp=rank.sp_tp)
    sync_mode = MODE_NONE if draft else plan.mode
    rows = dp_sync_contribution(policy, num_tokens=plan.num_tokens_padded, mode=sync_mode, dp_size=layout.dp,
                                dp_rank=c.dp_rank, skip=options.mc2_skip)
    reduced = None
    if rows is not None:
        reduced = yield rank.call("dp", "all_reduce", (len(rows), layout.dp), "int32", rows=rows, site=site,
                                    local_us=elapsed())
    sync = dp_sync_result(policy, reduced, num_tokens=plan.num_tokens_padded, mode=sync_mode, dp_size=layout.dp,
                          sequence_parallel=rank.sp_tp > 1, draft=draft)
    if draft and sync.num_tokens_across_dp is not None:
        mode, padded, key = rank.dispatch(sync.num_tokens_across_dp[c.dp_rank], uniform, None)
        plan = StepPlan(mode, padded, key, sync.num_tokens_across_dp)
    elif not draft:
        plan = redispatch_after_sync(plan, sync, dp_rank=c.dp_rank, uniform_decode=uniform, dispatch=rank.dispatch)
    if sync.skipped:
        rank.summary.skipped_syncs += 1
    elif layout.dp > 1:
        yield rank.decision((plan.mode, plan.key, plan.num_tokens_across_dp), padded=plan.num_tokens_padded)
    for _ in range(forwards):
        yield from _forward(rank, plan, sync, elapsed, draft=draft)
    return sync.skipped


def _forward(rank: _Rank, plan: Any, sync: Any, elapsed: Any, *, draft: bool) -> Generator[Any, Any, None]:
    layout = rank.layout
    rank.summary.batches_by_mode[_MODE_NAMES[plan.mode]] += 1
    graph = rank.graphs.get(plan.key) if plan.mode != MODE_NONE else None
    extra = 0.0
    if graph is not None:
        graph.replay()
        rank.device.synchronize()  # a hang fault surfaces here: the rank stops (GraphHang)
        rank.summary.replays += 1
        how = graph_how(plan.key)
    else:
        extra = EAGER_FORWARD_US
        how = EAGER
    # MoE: the forward context pads to the DP maximum, rounded up to tp (vLLM Ascend
    # ascend_forward_context.py: padded_num_tokens); global_bs is 0 (with mc2_mask) unless the
    # DP all-reduce was skipped (PR #8039).
    across = plan.num_tokens_across_dp or (plan.num_tokens_padded,)
    moe_tokens = -(-max(across) // layout.tp) * layout.tp
    global_bs = MC2_TOKENS_PER_RANK * layout.ep if sync.skipped else 0
    for group, op, shape, dtype, params in rank.forward_collectives(plan.num_tokens_padded, moe_tokens, global_bs):
        yield rank.call(group, op, shape, dtype, how=how, params=params, site="draft" if draft else "forward",
                          local_us=elapsed(extra))
        extra = 0.0


# --------------------------------------------------------------------------- the run


# Generated multi-rank workloads: a DP rank's requests come in two bursts (half, then the rest
# BURST_GAP steps later), and DP rank r's first burst is schedulable (r mod STAGGER_CYCLE) *
# RANK_STAGGER steps after rank 0's (a load balancer filling the ranks in turn; the cycle keeps
# a large world's last ranks from idling for hundreds of steps). Every request is in its rank's
# scheduler from the start but schedulable only from its burst's step (a KV consumer waiting
# for its KV transfer, vLLM's WAITING_FOR_REMOTE_KVS): a rank that holds requests none of
# which is schedulable yet runs a zero-token step (`--idle-policy`, vLLM #43547), and a rank
# whose requests are all done is idle (`execute_dummy_batch`) until every DP rank is done
# (vLLM Ascend #13826's variable-length tail).
BURST_GAP = 12
RANK_STAGGER = 3
STAGGER_CYCLE = 4


def _generated_steps(config: GraphConfig, options: RankOptions, dp_rank: int) -> list[Step]:
    seed = options.seed + dp_rank
    requests = generate_workload(WorkloadSpec(num_requests=options.requests, seed=seed,
                                              burst_size=max(1, -(-options.requests // 2)), burst_gap=BURST_GAP),
                                 vocab_size=config.model.vocab_size)
    offset = (dp_rank % STAGGER_CYCLE) * RANK_STAGGER
    requests = [dataclasses.replace(r, arrival_step=r.arrival_step + offset) for r in requests]
    steps = simulate_steps(requests, max_num_seqs=config.max_num_seqs,
                           max_num_batched_tokens=config.max_num_batched_tokens,
                           num_speculative_tokens=config.num_speculative_tokens, block_size=config.block_size,
                           vocab_size=config.model.vocab_size, seed=seed)
    return [Step(0) if b is None else
            Step(b.num_tokens, b.uniform_decode, config.num_speculative_tokens if not b.has_prefill else 0)
            for b in steps]


def build_rank(config: GraphConfig, options: RankOptions, layout: ParallelLayout, rank: int) -> _Rank:
    """One rank of the layout with its device, fault plan and workload shard."""
    common, by_rank = split_rank_faults(options.faults, layout.world_size)
    coords = layout.coords(rank)
    steps = (options.steps.get(coords.dp_rank, ()) if options.steps is not None
             else _generated_steps(config, options, coords.dp_rank))
    plan = "; ".join(p for p in (common, by_rank.get(coords.rank, "")) if p) or None
    return _Rank(coords, config, options, layout, plan, steps)


def layout_of(config: GraphConfig) -> ParallelLayout:
    return ParallelLayout(dp=config.data_parallel_size, tp=config.tensor_parallel_size,
                          pp=getattr(config, "pipeline_parallel_size", 1) or 1)


def rank_program(rank: _Rank, collective_types: tuple[Any, Any]) -> Generator[Any, Any, None]:
    """The program of one rank, yielding ``collective_types`` = (Collective, Decision) objects
    (the fabric's, or any executor's that reads the same fields: the gloo tier)."""
    rank.fabric_types = collective_types
    return _program(rank)


def run_ranks(config: GraphConfig, options: RankOptions = RankOptions()) -> RanksReport:
    """Run every rank of ``config``'s layout (dp x pp x tp) on the simulator; never raises for
    a failed run (the error is in the report); bad options raise ConfigError."""
    check_heads_split(config)
    layout = layout_of(config)
    options.check_layout(layout)
    split_rank_faults(options.faults, layout.world_size)  # a bad rank prefix fails before any device
    ranks = [build_rank(config, options, layout, rank) for rank in range(layout.world_size)]
    timeout = options.timeout_s if options.timeout_s is not None else default_collective_timeout_s(
        options.env, expansion_mode=(options.env or {}).get("HCCL_OP_EXPANSION_MODE", ""))
    fabric = ranks[0].device.collective_fabric(layout, seed=options.seed, timeout_s=timeout)
    types = (fabric.collective_type, fabric.decision_type)
    error: Optional[BaseException] = None
    try:
        fabric.run({r.coords.rank: rank_program(r, types) for r in ranks})
    except (RuntimeError, GraphHang) as exc:  # collective errors, capture errors, device failures
        error = exc
    for r in ranks:
        r.summary.collectives_met = fabric.stats.met_by_rank.get(r.coords.rank, 0)
        r.summary.clock_us = fabric.clock_us.get(r.coords.rank, 0.0)
        r.release()
    return RanksReport(layout, options, [r.summary for r in ranks], dict(fabric.stats.met), error,
                       dropped_keys=max((getattr(r, "dropped", 0) for r in ranks), default=0),
                       failed_rank=fabric.stats.failed_rank)
