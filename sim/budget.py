"""The stream budget: how many streams captured graphs hold, charged like the planner says.

Theory of operation. `ascendgraph.sizes.plan_stream_budget` models a stack's streams
(SEMANTICS §9) and returns a `StreamPlan`; the device is handed that plan before capture
(`SimDevice.set_stream_plan`). The ledger then charges exactly the plan's numbers:

* ``reserved_streams`` and ``full_graph_reserve`` are held from the moment the plan is set;
* each piecewise graph costs ``streams_per_piecewise_graph``;
* each FULL graph costs ``streams_per_full_graph`` (1), taken from the FULL reserve while
  it lasts (FULL_AND_PIECEWISE), then from the general budget;
* the budget is ``plan.max_streams``.

So with the same parallel config the first capture refused is the one the planner says
does not fit. Without a plan every graph costs one stream against the device's stream
limit. A charge is returned when its graph is reset, freed, or its capture fails.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from ascendgraph.errors import ConfigError

__all__ = ["GRAPH_KINDS", "StreamCharge", "StreamLedger"]

GRAPH_KINDS = ("full", "piecewise")


@dataclass(frozen=True)
class StreamCharge:
    kind: str
    streams: int  # drawn from the general budget
    from_full_reserve: bool


class StreamLedger:
    def __init__(self, stream_limit: int) -> None:
        self.stream_limit = stream_limit
        self.plan: Optional[Any] = None
        self._general_used = 0
        self._full_reserve_used = 0
        self._charges = 0

    # -- configuration
    def set_plan(self, plan: Optional[Any]) -> None:
        if plan is not None:
            for name in ("reserved_streams", "full_graph_reserve", "streams_per_piecewise_graph",
                         "streams_per_full_graph", "max_streams"):
                if not hasattr(plan, name):
                    raise ConfigError(
                        f"set_stream_plan expects an ascendgraph.sizes.StreamPlan, got {plan!r} "
                        f"(it has no {name!r})",
                        key="stream_plan",
                    )
        self.plan = plan

    # -- figures
    @property
    def budget(self) -> int:
        return int(self.plan.max_streams) if self.plan is not None else self.stream_limit

    @property
    def reserved(self) -> int:
        if self.plan is None:
            return 0
        return int(self.plan.reserved_streams) + int(self.plan.full_graph_reserve)

    @property
    def in_use(self) -> int:
        return self.reserved + self._general_used

    @property
    def graphs_charged(self) -> int:
        return self._charges

    def cost(self, kind: str) -> tuple[int, bool]:
        """(streams drawn from the general budget, drawn from the FULL reserve?) for one graph."""
        if kind not in GRAPH_KINDS:
            raise ConfigError(
                f"graph_kind must be one of {', '.join(GRAPH_KINDS)}, got {kind!r}", key="graph_kind"
            )
        plan = self.plan
        if plan is None:
            return 1, False
        if kind == "piecewise":
            # A plan for a mode without piecewise graphs prices them at 0; charge one stream.
            return max(1, int(plan.streams_per_piecewise_graph)), False
        if self._full_reserve_used < int(plan.full_graph_reserve):
            return 0, True
        return int(plan.streams_per_full_graph), False

    def fits(self, kind: str) -> bool:
        streams, _ = self.cost(kind)
        return self.in_use + streams <= self.budget

    # -- charging
    def charge(self, kind: str) -> StreamCharge:
        """Take one graph's streams; the caller checked `fits` (and raised the stack's error)."""
        streams, from_reserve = self.cost(kind)
        if from_reserve:
            self._full_reserve_used += 1
        self._general_used += streams
        self._charges += 1
        return StreamCharge(kind, streams, from_reserve)

    def release(self, charge: StreamCharge) -> None:
        if charge.from_full_reserve:
            self._full_reserve_used = max(0, self._full_reserve_used - 1)
        self._general_used = max(0, self._general_used - charge.streams)
        self._charges = max(0, self._charges - 1)
