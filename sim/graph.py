"""SimGraph: torch_npu's NPUGraph on the simulator — a capture-state machine and its replay.

States and transitions, as data (docs/semantics.md §12 texts for the refused ones):

    idle      --capture_begin-->  capturing  --capture_end-->  captured
    captured  --replay-->         captured
    any       --reset-->          idle        (a capture under way is aborted)

A failed capture (an exception inside ``device.graph(...)``, a fault at capture_begin /
capture_end, an OOM) returns the graph to *idle*: nothing recorded is kept, its streams
and pool bytes are given back, and the same object can capture again.

A replay runs the program on the current stream. At a captured ExternalEvent wait whose
event is not recorded it suspends; the device resumes it when the event is recorded.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Optional

from ascendgraph.errors import (
    CAPTURE_END_BEFORE_BEGIN,
    GRAPH_ALREADY_CAPTURED,
    POOL_BEFORE_CAPTURE,
    REPLAY_BEFORE_CAPTURE,
    CaptureConstraintError,
)

if TYPE_CHECKING:  # pragma: no cover
    from sim.budget import StreamCharge
    from sim.capture import Capture
    from sim.program import Program
    from sim.device import SimDevice
    from sim.pool_memory import GraphMemory
    from sim.pools import SimPool, SimPoolHandle
    from sim.streams import SimExternalEvent

__all__ = ["IDLE", "CAPTURING", "CAPTURED", "TRANSITIONS", "REFUSALS", "SimGraph", "GraphHold", "ReplayRun"]

IDLE, CAPTURING, CAPTURED = "idle", "capturing", "captured"

# (state, operation) -> next state; operations missing here are refused below.
TRANSITIONS: dict[tuple[str, str], str] = {
    (IDLE, "capture_begin"): CAPTURING,
    (CAPTURING, "capture_end"): CAPTURED,
    (CAPTURED, "replay"): CAPTURED,
    (CAPTURED, "pool"): CAPTURED,
    (IDLE, "reset"): IDLE,
    (CAPTURING, "reset"): IDLE,
    (CAPTURED, "reset"): IDLE,
}
REFUSALS: dict[tuple[str, str], str] = {
    (CAPTURED, "capture_begin"): GRAPH_ALREADY_CAPTURED,
    (CAPTURING, "capture_begin"): GRAPH_ALREADY_CAPTURED,
    (IDLE, "capture_end"): CAPTURE_END_BEFORE_BEGIN,
    (CAPTURED, "capture_end"): CAPTURE_END_BEFORE_BEGIN,
    (IDLE, "replay"): REPLAY_BEFORE_CAPTURE,
    (CAPTURING, "replay"): REPLAY_BEFORE_CAPTURE,
    (IDLE, "pool"): POOL_BEFORE_CAPTURE,
    (CAPTURING, "pool"): POOL_BEFORE_CAPTURE,
}


class GraphHold:
    """What a captured graph holds on its device; released exactly once."""

    __slots__ = ("charge", "pool", "token", "bytes", "released")

    def __init__(self, charge: "StreamCharge", pool: "SimPool", token: int, nbytes: int) -> None:
        self.charge = charge
        self.pool = pool
        self.token = token
        self.bytes = nbytes
        self.released = False


class ReplayRun:
    """One launched replay: where it is in the program and what it waits for."""

    __slots__ = ("graph", "program", "segment", "waiting_on", "waited", "perturb", "stamp", "number", "ready_us",
                 "reported")

    def __init__(self, graph: "SimGraph", program: "Program", stamp: int = 0) -> None:
        self.graph = graph
        self.program = program
        self.segment = 0
        self.waiting_on: Optional["SimExternalEvent"] = None
        self.stamp = stamp  # the device's event counter at launch (task updates after it are fresh)
        self.number = graph.replays  # this graph's replay count, for messages
        self.perturb = 0.0  # a fault plan's perturb(x): added to the outputs when the run finishes
        self.waited: Optional["SimExternalEvent"] = None  # the event it last suspended on
        self.ready_us = 0.0  # the host clock from which its next segment may start (launch, or the record it waited for)
        self.reported: set[int] = set()  # indexes of the task groups already reported stale for this run


class SimGraph:
    """A graph of the simulated device (create with ``device.new_graph()``)."""

    def __init__(self, device: "SimDevice", name: str) -> None:
        self.device = device
        self.name = name
        self.state = IDLE
        self.generation = 0  # bumps on every capture_begin / reset; stale handles notice
        self.program: Optional["Program"] = None
        self.capture: Optional["Capture"] = None
        self.kind = "full"
        self.capture_time_us = 0.0
        self.capture_wall_s = 0.0
        self.pool_bytes = 0
        self.replays = 0
        self.super_kernel_scopes: tuple[str, ...] = ()  # super_kernel_scope()s opened in the capture
        self.hold: Optional[GraphHold] = None  # what it holds on its device (sim.capturing)
        self.finalizer: Optional[weakref.finalize] = None
        self.pool_handle: Optional["SimPoolHandle"] = None
        # The pool blocks this graph's capture was handed (`sim.pool_memory`). A block freed by
        # Python goes back to the pool, not to the device (torch_npu's private graph pool), and a
        # later capture into the same pool may be handed it; until then, and while the graph
        # lives, a weak reference into it (vLLM Ascend's attention `softmax_lse`, graph outputs)
        # reads the graph's data. Reset releases them.
        self.memory: Optional["GraphMemory"] = None
        # Storages of capture outputs made outside the pool (ops without a meta kernel, meta
        # devices): the graph holds them until reset.
        self.pool_blocks: tuple[Any, ...] = ()

    # -- the state machine
    def transition(self, operation: str) -> str:
        """The state ``operation`` leads to, or torch_npu's refusal (`REFUSALS`)."""
        key = (self.state, operation)
        if key in TRANSITIONS:
            return TRANSITIONS[key]
        raise CaptureConstraintError(REFUSALS[key])

    # -- torch_npu's NPUGraph API
    def capture_begin(
        self, pool: Optional["SimPoolHandle"] = None, capture_error_mode: str = "global", *, graph_kind: str = "full"
    ) -> None:
        """Start capturing on the current stream. ``graph_kind`` ("full" | "piecewise")
        selects the stream charge of the StreamPlan."""
        self.device.captures.begin(self, pool=pool, capture_error_mode=capture_error_mode, graph_kind=graph_kind)

    def capture_end(self) -> None:
        self.device.captures.end(self)

    def replay(self) -> None:
        self.device.replays.replay(self)

    def reset(self) -> None:
        """Delete the captured graph (or abort a capture under way); the object can capture again."""
        self.device.captures.reset(self)

    def pool(self) -> "SimPoolHandle":
        self.transition("pool")
        assert self.pool_handle is not None
        return self.pool_handle

    # -- introspection (tests, reports)
    @property
    def is_captured(self) -> bool:
        return self.state == CAPTURED

    @property
    def num_tasks(self) -> int:
        return self.program.num_tasks if self.program else 0

    def recorded_ops(self) -> list[str]:
        """Names of the recorded ops, in order (empty unless captured)."""
        return self.program.op_names() if self.program else []

    def device_time_us(self) -> float:
        """Device time of one full replay on the virtual clock."""
        return self.program.total_time_us if self.program else 0.0

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "state": self.state,
            "kind": self.kind,
            "tasks": self.num_tasks,
            "pool_bytes": self.pool_bytes,
            "streams": self.hold.charge.streams if self.hold else 0,
            "capture_time_us": self.capture_time_us,
            "capture_wall_s": self.capture_wall_s,
            "device_time_us": self.device_time_us(),
            "replays": self.replays,
            "super_kernel_scopes": list(self.super_kernel_scopes),
        }

    def __repr__(self) -> str:
        return f"<SimGraph {self.name} {self.state}>"
