"""What changes while an engine runs: `EngineState`.

The engine (`ascendgraph.runtime.engine.Engine`) owns one state object and hands it to each
stage it composes; everything else a stage uses is fixed when the engine is built and given to
the stage's constructor. Which stage writes which field:

    mode, dispatcher, decisions         resolved by the engine; CaptureStage's eager fallback
                                        switches them to NONE and appends its decision
    lenient                             the engine, while it makes the device
    captured, capture_seconds,          CaptureStage
    capture_fallback,
    graphs_captured_before_failure
    error                               ServeStage (a hang, a lost device, stale parameters);
                                        the caller of capture() / serve() for what they raise
    first_mismatch                      CheckStage
    counters, batches_by_route          ServeStage

ReportStage reads all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ascendgraph.dispatch import GraphDispatcher
from ascendgraph.errors import NumericalMismatch
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Decision
from ascendgraph.runtime.stages.records import Counters
from ascendgraph.xlite import NATIVE, XLITE

__all__ = ["EngineState"]


@dataclass
class EngineState:
    """The mutable state of one engine (see the module docstring for who writes what)."""

    mode: GraphMode
    dispatcher: GraphDispatcher
    decisions: list[Decision]
    lenient: list[str] = field(default_factory=list)  # declared leniencies of the device (report "lenient")
    captured: bool = False
    capture_seconds: float = 0.0
    capture_fallback: Optional[BaseException] = None
    graphs_captured_before_failure: Optional[int] = None  # set when a capture fails
    error: Optional[BaseException] = None
    first_mismatch: Optional[NumericalMismatch] = None
    counters: Counters = field(default_factory=Counters)
    batches_by_route: dict[str, int] = field(default_factory=lambda: {XLITE: 0, NATIVE: 0})
