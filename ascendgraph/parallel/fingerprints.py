"""Collective fingerprints and the rules that decide whether they may meet.

A collective is a meeting point: every member of its group arrives with a *fingerprint*
(group, sequence number in the group, op, shape, dtype, and how it runs: ``eager`` or
``graph:<key>`` for a collective captured in a graph and issued by its replay). The
collective completes when every member has arrived and the fingerprints are compatible
under every rule of `COMPATIBILITY_RULES`; otherwise the ranks would hang or corrupt each
other on a real cluster, and the simulator raises ``CollectiveMismatch`` naming the rule.

The rules, each with its source:

* ``same_op`` / ``same_dtype`` / ``same_shape``: every rank of a communicator issues the
  same collective, with the same element count and type, at the same position
  (torch.distributed's collective contract; gloo checks op, shape and count only under
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` and passes a dtype of equal byte size silently).
* ``graph_never_meets_eager``: HCCL cannot pair a collective launched from a captured graph
  with an eagerly launched one (vLLM Ascend PR #6011, "HCCL does not support eager/graph
  mode communication": mixed modes across DP ranks hang A2 + AIV).
* ``same_graph_key``: captured collectives are task sequences of one graph; a replay of the
  graph for one padded size meets only replays of the graph for the same size (the padded
  size is what DP padding agrees on: vLLM ``v1/worker/dp_utils.py`` ``_post_process_dp_padding``
  pads every rank to the maximum once the synced mode is not NONE). Except MC2 with
  ``global_bs > 0``: vLLM Ascend's skip path lets each rank run its own token count and passes
  ``global_bs`` without ``mc2_mask`` so that the MC2 kernel pairs uneven counts
  (``should_skip_allreduce_across_dp_group``, vllm_ascend/utils.py:1099-1112 at 182b75ea:
  "each rank may have a different number of tokens, so MC2 needs a non-zero global_bs"), so
  uneven all-decode replays (FULL 4x4 on one rank, FULL 8x8 on another, both within
  ``global_bs / ep``) meet; ``mc2_token_counts`` still caps them.
* ``mc2_token_counts``: MC2 dispatch/combine with ``global_bs = 0`` (with ``mc2_mask``:
  the DP all-reduce ran, so every rank is padded to one count) needs equal token counts on
  every rank; with ``global_bs > 0`` (the all-reduce skipped) counts may differ but none may
  exceed ``global_bs / ep`` (vLLM Ascend PR #8039 and ``should_skip_allreduce_across_dp_group``
  in ``vllm_ascend/utils.py`` at 182b75ea).

The wait timeout is HCCL's execution timeout: ``HCCL_EXEC_TIMEOUT`` seconds when set
(0: never), else 1836 s, or 1091 s under the AIV expansion mode (CANN environment-variable
reference, HCCL_EXEC_TIMEOUT: A2/A3 default 1836, AIV range [0, 1091], default 1091).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Optional, Sequence

from ascendgraph.errors import ConfigError

__all__ = [
    "EAGER",
    "graph_how",
    "Fingerprint",
    "MeetingViolation",
    "CompatibilityRule",
    "COMPATIBILITY_RULES",
    "MC2_OPS",
    "check_meeting",
    "DEFAULT_HCCL_EXEC_TIMEOUT_S",
    "AIV_HCCL_EXEC_TIMEOUT_S",
    "default_collective_timeout_s",
]

EAGER = "eager"
MC2_OPS = ("mc2_dispatch", "mc2_combine")
DEFAULT_HCCL_EXEC_TIMEOUT_S = 1836.0
AIV_HCCL_EXEC_TIMEOUT_S = 1091.0


def graph_how(key: str) -> str:
    """How a collective captured in the graph of ``key`` runs at replay: ``graph:<key>``."""
    return f"graph:{key}"


@dataclass(frozen=True)
class Fingerprint:
    """What one rank brings to a meeting point. ``site`` (who issued it: ``dp_sync``,
    ``unfinished``, ``moe_dispatch``, ...) is for the flight recorder only: real
    communicators do not see it, so no rule reads it."""

    group: str
    members: tuple[int, ...]
    seq: int
    op: str
    shape: tuple[int, ...]
    dtype: str
    how: str = EAGER
    params: tuple[tuple[str, int], ...] = ()
    site: str = ""

    @property
    def is_graph(self) -> bool:
        return self.how != EAGER

    def param(self, name: str, default: int = 0) -> int:
        return dict(self.params).get(name, default)

    def __str__(self) -> str:
        shape = "x".join(str(d) for d in self.shape) or "scalar"
        extra = "".join(f" {k}={v}" for k, v in self.params)
        site = f" [{self.site}]" if self.site else ""
        return f"{self.group}#{self.seq} {self.op}({shape} {self.dtype}{extra}) {self.how}{site}"


@dataclass(frozen=True)
class MeetingViolation:
    """One broken rule at one meeting: the rule, its source, and what each rank brought."""

    rule: str
    source: str
    detail: str


@dataclass(frozen=True)
class CompatibilityRule:
    name: str
    description: str
    source: str
    check: Callable[[Mapping[int, Fingerprint]], Optional[str]] = field(repr=False)


def _differ(fps: Mapping[int, Fingerprint], attr: Callable[[Fingerprint], object], what: str) -> Optional[str]:
    values = {rank: attr(fp) for rank, fp in fps.items()}
    if len(set(map(repr, values.values()))) <= 1:
        return None
    shown = ", ".join(f"rank {rank}: {value}" for rank, value in sorted(values.items()))
    return f"{what} differ ({shown})"


def _same_op(fps: Mapping[int, Fingerprint]) -> Optional[str]:
    return _differ(fps, lambda f: f.op, "ops")


def _same_dtype(fps: Mapping[int, Fingerprint]) -> Optional[str]:
    return _differ(fps, lambda f: f.dtype, "dtypes")


def _same_shape(fps: Mapping[int, Fingerprint]) -> Optional[str]:
    # MC2 token counts (dim 0) follow their own rule; the rest of the shape must agree
    return _differ(fps, lambda f: f.shape[1:] if f.op in MC2_OPS else f.shape, "shapes")


def _graph_never_meets_eager(fps: Mapping[int, Fingerprint]) -> Optional[str]:
    kinds = {rank: ("graph" if fp.is_graph else "eager") for rank, fp in fps.items()}
    if len(set(kinds.values())) <= 1:
        return None
    return "a captured collective meets an eager one (" + ", ".join(
        f"rank {rank}: {fps[rank].how}" for rank in sorted(fps)) + ")"


def _same_graph_key(fps: Mapping[int, Fingerprint]) -> Optional[str]:
    if not all(fp.is_graph for fp in fps.values()):
        return None
    if all(fp.op in MC2_OPS and fp.param("global_bs") > 0 for fp in fps.values()):
        return None  # the MC2 skip path: each rank replays its own decode size (mc2_token_counts caps it)
    return _differ(fps, lambda f: f.how, "graph keys")


def _mc2_token_counts(fps: Mapping[int, Fingerprint]) -> Optional[str]:
    if not all(fp.op in MC2_OPS for fp in fps.values()):
        return None
    counts = {rank: (fp.shape[0] if fp.shape else 0) for rank, fp in fps.items()}
    global_bs = {rank: fp.param("global_bs") for rank, fp in fps.items()}
    if len(set(global_bs.values())) > 1:
        return "global_bs differs (" + ", ".join(f"rank {r}: {v}" for r, v in sorted(global_bs.items())) + ")"
    bs = next(iter(global_bs.values()))
    if bs == 0:
        if len(set(counts.values())) > 1:
            return ("global_bs=0 (mc2_mask, ranks padded to one count) but the token counts differ ("
                    + ", ".join(f"rank {r}: {v}" for r, v in sorted(counts.items())) + ")")
        return None
    limit = bs // max(1, len(fps))
    over = {r: v for r, v in counts.items() if v > limit}
    if over:
        return (f"global_bs={bs} allows at most {limit} tokens per rank, but "
                + ", ".join(f"rank {r} has {v}" for r, v in sorted(over.items())))
    return None


COMPATIBILITY_RULES: tuple[CompatibilityRule, ...] = (
    CompatibilityRule("same_op", "every rank issues the same collective at this position",
                      "torch.distributed collective contract; gloo checks it only with TORCH_DISTRIBUTED_DEBUG=DETAIL",
                      _same_op),
    CompatibilityRule("same_dtype", "every rank contributes the same element type",
                      "torch.distributed collective contract (gloo passes a dtype of equal byte size silently)",
                      _same_dtype),
    CompatibilityRule("same_shape", "every rank contributes the same shape (MC2 token counts: see mc2_token_counts)",
                      "torch.distributed collective contract; vLLM Ascend #9689 ([4, dp] met [2, dp])",
                      _same_shape),
    CompatibilityRule("graph_never_meets_eager", "a collective replayed from a graph never meets an eager one",
                      "vLLM Ascend PR #6011 (HCCL does not pair eager and graph communication; mixed DP modes hang)",
                      _graph_never_meets_eager),
    CompatibilityRule("same_graph_key", "replayed collectives meet replays of the graph of the same key",
                      "vLLM dp_utils.py _post_process_dp_padding (one padded size across DP); not MC2 with global_bs > 0 "
                      "(vllm_ascend/utils.py:1099-1112 @182b75ea, the skip path's uneven counts)",
                      _same_graph_key),
    CompatibilityRule("mc2_token_counts", "MC2: global_bs=0 needs equal token counts, global_bs>0 caps them at "
                      "global_bs/ep", "vLLM Ascend PR #8039; should_skip_allreduce_across_dp_group (utils.py, 182b75ea)",
                      _mc2_token_counts),
)


def check_meeting(fps: Mapping[int, Fingerprint]) -> list[MeetingViolation]:
    """Every rule the fingerprints of one meeting break (empty: they may meet)."""
    found = []
    for rule in COMPATIBILITY_RULES:
        detail = rule.check(fps)
        if detail is not None:
            found.append(MeetingViolation(rule.name, rule.source, detail))
    return found


def default_collective_timeout_s(env: Optional[Mapping[str, str]] = None, *, expansion_mode: str = "") -> Optional[float]:
    """HCCL's execution timeout in seconds (None: never times out). See the module docstring."""
    raw = (env or {}).get("HCCL_EXEC_TIMEOUT")
    aiv = expansion_mode.strip().upper() == "AIV"
    if raw is None or not str(raw).strip():
        return AIV_HCCL_EXEC_TIMEOUT_S if aiv else DEFAULT_HCCL_EXEC_TIMEOUT_S
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise ConfigError(f"HCCL_EXEC_TIMEOUT must be a number of seconds, got {raw!r}",
                          key="HCCL_EXEC_TIMEOUT") from None
    if not value >= 0 or value == float("inf"):
        raise ConfigError(f"HCCL_EXEC_TIMEOUT must be a finite number >= 0, got {raw!r}", key="HCCL_EXEC_TIMEOUT")
    if aiv:
        return AIV_HCCL_EXEC_TIMEOUT_S if value == 0 or value > AIV_HCCL_EXEC_TIMEOUT_S else value
    return None if value == 0 else value


def fingerprints_text(fps: Sequence[Fingerprint]) -> str:
    return "; ".join(str(fp) for fp in fps)
