"""What each communicator of a layout carries and costs (``ascendgraph explain`` with -dp / -tp).

Per communicator kind (world, dp, tp, ep): its group size and number of groups, the
collectives one step issues on it, whether they are captured in graphs (then they meet at
replay as ``graph:<key>``) and the streams a captured graph holds for it. The stream figures
are the simulator's physical model (sim/budget.py: one more stream per group under HCCL's
AIV expansion, two under FFTS+; a test keeps the two tables equal); vLLM Ascend's own budget
formula is the stream plan's (`ascendgraph.sizes`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ascendgraph.parallel.layout import ParallelLayout

__all__ = ["COLLECTIVE_STREAMS_PER_GROUP", "Communicator", "communicators", "format_communicators",
           "communicators_to_json"]

COLLECTIVE_STREAMS_PER_GROUP = {"AIV": 1, "FFTS+": 2}


@dataclass(frozen=True)
class Communicator:
    name: str
    size: int
    groups: int
    per_step: str
    captured: bool
    streams_per_graph: int


def communicators(layout: ParallelLayout, *, moe: bool, expansion_mode: str = "") -> list[Communicator]:
    """The communicators of ``layout`` with more than one member."""
    expansion = "AIV" if expansion_mode.strip().upper() == "AIV" else "FFTS+"
    per_group = COLLECTIVE_STREAMS_PER_GROUP[expansion]
    found = []
    if layout.world_size > 1:
        found.append(Communicator("world", layout.world_size, 1,
                                  "capture agreement at start-up: largest size, capture list, who failed", False, 0))
    if layout.dp > 1:
        found.append(Communicator("dp", layout.dp, len(layout.groups("dp")),
                                  "DP metadata sync (int32 all-reduce) every step; unfinished-requests all-reduce",
                                  False, 0))
    if layout.tp > 1:
        found.append(Communicator("tp", layout.tp, len(layout.groups("tp")),
                                  "all-reduce of each layer's output", True, per_group))
    if moe and layout.ep > 1:
        found.append(Communicator("ep", layout.ep, len(layout.groups("ep")),
                                  "MoE dispatch and combine of each MoE layer", True, per_group))
    return found


def format_communicators(found: list[Communicator], *, expansion_mode: str = "") -> str:
    expansion = "AIV" if expansion_mode.strip().upper() == "AIV" else "FFTS+"
    lines = [f"communicators (HCCL expansion {expansion}; docs/ranks.md):"]
    for c in found:
        where = (f"captured: +{c.streams_per_graph} stream(s) per graph" if c.captured
                 else "eager (CPU group), never captured")
        lines.append(f"  {c.name:<5} {c.groups} group(s) of {c.size}: {c.per_step}; {where}")
    extra = sum(c.streams_per_graph for c in found)
    lines.append(f"  a captured graph holds 1 + {extra} stream(s)")
    return "\n".join(lines)


def communicators_to_json(found: list[Communicator]) -> list[dict[str, Any]]:
    return [dict(c.__dict__) for c in found]
