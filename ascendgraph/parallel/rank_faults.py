"""Rank-scoped fault plans: ``rank=R:<site>=<terms>`` (docs/ranks.md, docs/faults.md).

A multi-rank fault plan is the single-rank grammar (docs/faults.md) where a rule may carry a
rank prefix: ``rank=1:capture_begin=5*off->raise(oom); rank=2:replay=delay(5000)``. Rules
without a prefix apply to every rank. `split_rank_faults` returns the common plan and one
plan per rank; each is then parsed by the simulator's own parser (so every term is checked
there, with its messages).
"""

from __future__ import annotations

import re
from typing import Optional

from ascendgraph.errors import ConfigError

__all__ = ["split_rank_faults"]

_PREFIX = re.compile(r"^rank\s*=\s*(?P<rank>[^:]*):(?P<rule>.*)$", re.DOTALL)


def split_rank_faults(spec: Optional[str], world_size: int) -> tuple[str, dict[int, str]]:
    """(rules for every rank, {rank: that rank's own rules}); a bad rank is a ConfigError."""
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
        own.setdefault(int(text), []).append(match.group("rule").strip())
    return "; ".join(common), {rank: "; ".join(rules) for rank, rules in own.items()}
