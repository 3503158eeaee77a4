"""Rank-scoped fault plans: ``rank=R:<site>=<terms>`` (docs/ranks.md, docs/faults.md).

A multi-rank fault plan is the single-rank grammar (docs/faults.md) where a rule may carry a
rank prefix: ``rank=1:capture_begin=5*off->raise(oom); rank=2:replay=delay(5000)``. Rules
without a prefix apply to every rank (and to the single-rank engine of ``ascendgraph run``).
`split_rank_faults` returns the common plan and one plan per rank; each is then parsed by the
simulator's own parser (so every term is checked there, with its messages).

A rank-scoped rule must act on its rank. With more than one rank, a rank runs capture, replay
and synchronisation on its own simulated device but no model (no tensors, no parameter
updates, no events): a rule on a site or with an action the rank programs never reach is
refused here, naming what is not modelled (`RANK_SITES`), instead of being accepted and
ignored. With one rank, the single-rank engine *is* rank 0, so ``rank=0:`` rules go to it
(`engine_rules`) and every site applies.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

from ascendgraph.errors import ConfigError

__all__ = ["RANK_SITES", "split_rank_faults", "engine_rules"]

_PREFIX = re.compile(r"^rank\s*=\s*(?P<rank>[^:]*):(?P<rule>.*)$", re.DOTALL)

# site -> None (reached by every rank program) or why a rank-scoped rule on it is refused.
RANK_SITES: Mapping[str, Optional[str]] = {
    "capture_begin": None,
    "capture_end": None,
    "replay": None,  # raise, delay, hang; not perturb (below)
    "malloc": None,  # the capture's allocations
    "synchronize": None,  # after each replay
    "task_update": "the rank simulation runs no attention parameter update (task_update is the single-rank "
                   "engine's site)",
    "event_record": "the rank simulation records no events (event_record is the single-rank engine's site)",
}
_PERTURB_REASON = ("replay=perturb changes replayed outputs, and the ranks compute no tensors (meta tensors: "
                   "only the single-rank engine checks numerics)")


def _check_modelled(rank: int, rule: str) -> None:
    site, sep, body = rule.partition("=")
    site = site.strip()
    if not rule.strip():
        raise ConfigError(f"fault plan: rank={rank}: has no rule; write rank={rank}:site=term "
                          "(e.g. rank=1:replay=hang)", key="fault_plan")
    if not sep or site not in RANK_SITES:
        return  # the simulator's parser names the bad site or form
    reason = RANK_SITES[site]
    if reason is not None:
        raise ConfigError(f"fault plan: rank={rank}:{rule[:40]} is not modelled per rank: {reason}; give the rule "
                          "without a rank prefix to run it in the single-rank engine", key="fault_plan")
    if site == "replay" and "perturb" in body:
        raise ConfigError(f"fault plan: rank={rank}:{rule[:40]} is not modelled per rank: {_PERTURB_REASON}; give "
                          "the rule without a rank prefix", key="fault_plan")


def split_rank_faults(spec: Optional[str], world_size: int) -> tuple[str, dict[int, str]]:
    """(rules for every rank, {rank: that rank's own rules}); a bad rank, an empty rank rule or
    (with more than one rank) a rank rule the rank programs do not model is a ConfigError."""
    if spec is None:
        return "", {}
    if not isinstance(spec, str):
        raise ConfigError(f"fault plan must be a string, got {spec!r}", key="fault_plan")
    common: list[str] = []
    own: dict[int, list[str]] = {}
    for raw in spec.split(";"):
        rule = raw.strip()
        if not rule:
            continue
        match = _PREFIX.match(rule)
        if match is None:
            if rule.startswith("rank"):
                raise ConfigError(f"fault plan: cannot read rank prefix of {rule[:40]!r}; write rank=R:site=term",
                                  key="fault_plan")
            common.append(rule)
            continue
        text = match.group("rank").strip()
        if not re.fullmatch(r"[0-9]{1,6}", text) or int(text) >= world_size:
            raise ConfigError(f"fault plan: rank {text[:20]!r} in {rule[:40]!r} must be an integer from 0 to "
                              f"{world_size - 1} (the world has {world_size} ranks)", key="fault_plan")
        body = match.group("rule").strip()
        if not body:
            raise ConfigError(f"fault plan: {rule[:40]!r} has no rule after the rank prefix; write "
                              f"rank={int(text)}:site=term", key="fault_plan")
        if world_size > 1:
            _check_modelled(int(text), body)
        own.setdefault(int(text), []).append(body)
    return "; ".join(common), {rank: "; ".join(rules) for rank, rules in own.items()}


def engine_rules(spec: Optional[str], world_size: int) -> Optional[str]:
    """The plan of the single-rank engine: the rules without a prefix, and with one rank also
    rank 0's own (that engine is rank 0); None when empty. Refuses what `split_rank_faults` does."""
    if spec is None:
        return None
    common, own = split_rank_faults(spec, max(1, world_size))
    if world_size <= 1 and 0 in own:
        common = "; ".join(p for p in (common, own[0]) if p)
    return common or None
