"""The stream budget: how many streams captured graphs hold, charged from what they hold.

Theory of operation (docs/semantics.md, "Streams"). The simulator never reads the
planner's per-graph numbers: it charges what a captured graph physically holds, so that
"the planner's N sizes fit and N + 1 do not" is evidence about the planner, not a
restatement of it.

* ``reserved_streams`` of the device profile are held from the start (streams the runtime
  keeps for itself);
* every graph holds **1** stream from ``capture_begin`` on (its capture stream);
* a graph that captures collectives of a communication group (the ``ascendgraph::all_reduce``
  ops a tensor-parallel model issues) holds, per group, **1** more stream under HCCL's AIV
  expansion or **2** more under FFTS+ (any other expansion mode: AI_CPU, HOST...);
* under FFTS+ the first collective of a group on the device reserves
  ``FFTS_RESERVED_STREAMS_PER_GROUP`` (40) streams for that group, kept as long as the
  device lives (the communicator's streams).

The budget is the device's stream limit (its profile's ``stream_limit``, a ``stream_limit``
option, or the limit the stack was configured with: a StreamPlan's ``max_streams``; only
that figure of a plan is used). A charge that does not fit is refused before anything is
taken; a graph's charge is returned when it is reset, freed, or its capture fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ascendgraph.errors import ConfigError

__all__ = [
    "GRAPH_KINDS",
    "AIV",
    "FFTS",
    "STREAMS_PER_GRAPH",
    "COLLECTIVE_STREAMS",
    "FFTS_RESERVED_STREAMS_PER_GROUP",
    "expansion_kind",
    "StreamCharge",
    "StreamLedger",
]

GRAPH_KINDS = ("full", "piecewise")
AIV, FFTS = "AIV", "FFTS+"
# What a captured graph holds (docs/semantics.md "Streams", the physical model).
STREAMS_PER_GRAPH = 1
COLLECTIVE_STREAMS = {AIV: 1, FFTS: 2}  # per communication group whose collectives a graph holds
FFTS_RESERVED_STREAMS_PER_GROUP = 40


def expansion_kind(mode: Optional[str]) -> str:
    """AIV for ``HCCL_OP_EXPANSION_MODE=AIV``; every other value (unset, AI_CPU, HOST, FFTS+) is FFTS+."""
    return AIV if (mode or "").strip().upper() == AIV else FFTS


@dataclass
class StreamCharge:
    """The streams one graph holds: its own stream plus its collectives' (per group)."""

    kind: str
    streams: int = STREAMS_PER_GRAPH
    groups: dict[str, int] = field(default_factory=dict)


class StreamLedger:
    def __init__(self, stream_limit: int, *, reserved_streams: int = 0, expansion_mode: Optional[str] = None) -> None:
        self.stream_limit = stream_limit
        self.reserved_streams = reserved_streams
        self.expansion = expansion_kind(expansion_mode)
        self.plan: Optional[Any] = None
        self._graph_streams = 0
        self._group_reserves: dict[str, int] = {}
        self._charges = 0

    # -- configuration
    def set_plan(self, plan: Optional[Any]) -> None:
        """Adopt a StreamPlan's ``max_streams`` as the budget (None: the device's own limit)."""
        if plan is not None and not hasattr(plan, "max_streams"):
            raise ConfigError(
                f"set_stream_plan expects an ascendgraph.sizes.StreamPlan, got {plan!r} (it has no 'max_streams')",
                key="stream_plan",
            )
        self.plan = plan

    def set_expansion_mode(self, mode: Optional[str]) -> None:
        self.expansion = expansion_kind(mode)

    # -- figures
    @property
    def budget(self) -> int:
        return int(self.plan.max_streams) if self.plan is not None else self.stream_limit

    @property
    def reserved(self) -> int:
        """Streams held outside any graph: the profile's reserve plus the FFTS+ group reserves."""
        return self.reserved_streams + sum(self._group_reserves.values())

    @property
    def in_use(self) -> int:
        return self.reserved + self._graph_streams

    @property
    def graphs_charged(self) -> int:
        return self._charges

    def fits(self, streams: int) -> bool:
        return self.in_use + streams <= self.budget

    @staticmethod
    def check_kind(kind: str) -> None:
        if kind not in GRAPH_KINDS:
            raise ConfigError(
                f"graph_kind must be one of {', '.join(GRAPH_KINDS)}, got {kind!r}", key="graph_kind"
            )

    # -- charging
    def begin_graph(self, kind: str) -> Optional[StreamCharge]:
        """The graph's own stream, or None when it does not fit (nothing taken)."""
        self.check_kind(kind)
        if not self.fits(STREAMS_PER_GRAPH):
            return None
        self._graph_streams += STREAMS_PER_GRAPH
        self._charges += 1
        return StreamCharge(kind)

    def collective_cost(self, charge: StreamCharge, group: str) -> int:
        """Streams a collective of ``group`` captured into ``charge``'s graph adds (0 if the
        graph already holds that group's), the group's FFTS+ reserve included."""
        cost = 0
        if group not in charge.groups:
            cost += COLLECTIVE_STREAMS[self.expansion]
        if self.expansion == FFTS and group not in self._group_reserves:
            cost += FFTS_RESERVED_STREAMS_PER_GROUP
        return cost

    def add_collective(self, charge: StreamCharge, group: str) -> bool:
        """Charge a captured collective of ``group``; False (nothing taken) when it does not fit."""
        if not self.fits(self.collective_cost(charge, group)):
            return False
        if self.expansion == FFTS and group not in self._group_reserves:
            self._group_reserves[group] = FFTS_RESERVED_STREAMS_PER_GROUP
        if group not in charge.groups:
            extra = COLLECTIVE_STREAMS[self.expansion]
            charge.groups[group] = extra
            charge.streams += extra
            self._graph_streams += extra
        return True

    def release(self, charge: Optional[StreamCharge]) -> None:
        if charge is None:
            return
        self._graph_streams = max(0, self._graph_streams - charge.streams)
        self._charges = max(0, self._charges - 1)
        charge.streams = 0
        charge.groups.clear()
