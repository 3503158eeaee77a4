"""The diagnosis of a whole log: failures, configuration, stream plan."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Optional

from ascendgraph.errors import (
    ConfigError,
)
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import DEFAULT_MAX_STREAMS, StreamPlan, plan_stream_budget, sample_sizes
from ascendgraph.tools.diagnose.classes import (
    EMPTY_LOG_NOTE, FAILURE_CLASSES, FAILURES_FOUND, MAX_INCIDENTS, NOTHING_FOUND,
)
from ascendgraph.tools.diagnose.incidents import Failure, _Scanner
from ascendgraph.tools.diagnose.logconfig import LogConfig


# --------------------------------------------------------------------------- diagnosis


@dataclass
class Diagnosis:
    source: str
    lines_read: int
    failures: list[Failure]
    config: LogConfig
    stream_plan: Optional[StreamPlan]
    aiv_plan: Optional[StreamPlan]
    suggested_sizes: Optional[list[int]]
    notes: list[str]

    @property
    def exit_code(self) -> int:
        return FAILURES_FOUND if self.failures else NOTHING_FOUND


def _plan(
    config: LogConfig, *, num_layers: Optional[int], stream_limit: int, stream_failure: bool
) -> tuple[Optional[StreamPlan], Optional[StreamPlan], Optional[list[int]], list[str]]:
    notes: list[str] = []
    layers = num_layers or config.num_hidden_layers
    sizes = config.sizes
    mode, mode_source = config.mode()
    if config.enforce_eager:
        return None, None, None, ["the log runs with enforce_eager: no graphs are captured, no stream plan"]
    if not sizes:
        return None, None, None, ["the log shows no capture sizes (cudagraph_capture_sizes): no stream plan"]
    if not layers:
        return None, None, None, [
            "the log shows no layer count (num_hidden_layers): pass --num-layers N for a stream plan"
        ]
    if mode is None:
        mode = GraphMode.FULL_AND_PIECEWISE
        notes.append("cudagraph_mode is not in the log: planned as FULL_AND_PIECEWISE (the O2 default)")
    if mode is GraphMode.NONE:
        return None, None, None, ["cudagraph_mode is NONE in the log: no graphs are captured, no stream plan"]
    if config.hccl_op_expansion_mode is None:
        notes.append("HCCL_OP_EXPANSION_MODE is not in the log: planned as unset (FFTS+)")
    for name, label in (("tensor_parallel_size", "tp"), ("data_parallel_size", "dp")):
        if getattr(config, name) is None:
            notes.append(f"{name} is not in the log: planned as {label}=1")

    def plan(expansion: Optional[str]) -> StreamPlan:
        return plan_stream_budget(
            num_hidden_layers=layers,
            capture_sizes=sizes,
            mode=mode,
            tensor_parallel_size=config.tensor_parallel_size or 1,
            data_parallel_size=config.data_parallel_size or 1,
            enable_expert_parallel=bool(config.enable_expert_parallel),
            is_moe=config.is_moe,
            prefill_context_parallel_size=config.prefill_context_parallel_size or 1,
            decode_context_parallel_size=config.decode_context_parallel_size or 1,
            hccl_op_expansion_mode=expansion,
            max_streams=stream_limit,
        )

    try:
        current = plan(config.hccl_op_expansion_mode)
        aiv = plan("AIV") if current.expansion_mode != "AIV" else None
    except ConfigError as exc:
        return None, None, None, [f"no stream plan: {exc}"]
    suggestion: Optional[list[int]] = None
    if not current.fits:
        suggestion = list(current.sizes)
    elif stream_failure and len(sizes) > 1:
        # The planner's budget is a safe estimate; this stack ran out earlier (other processes
        # hold streams, or it has fewer). Halving the list is the next thing to try.
        suggestion = sample_sizes(sizes, max(1, len(sizes) // 2))
        notes.append(
            f"the planner expects these {len(sizes)} sizes to fit {stream_limit} streams, yet the stack ran out: "
            "other processes may hold streams; the suggestion halves the list (or re-run `ascendgraph diagnose` "
            "with a lower --stream-limit)"
        )
    return current, aiv, suggestion, notes


def diagnose_lines(
    lines: Iterable[str],
    *,
    source: str = "<lines>",
    num_layers: Optional[int] = None,
    stream_limit: int = DEFAULT_MAX_STREAMS,
) -> Diagnosis:
    """Diagnose an iterable of log lines (the Python API; `diagnose_file` reads a path or stdin)."""
    scanner = _Scanner()
    for number, raw in enumerate(lines, 1):
        scanner.feed(number, raw)
    failures = scanner.failures()
    stream_failures = [f for f in failures if FAILURE_CLASSES[f.classification].stream_related]
    # Plan for the configuration of the last stream failure (the latest attempt), else the whole log's.
    config = stream_failures[-1].config if stream_failures else scanner.config
    if stream_failures:
        # Values printed after the failure started (e.g. the layer count in a later summary) still help.
        _fill_missing(config, scanner.config)
    plan, aiv, suggestion, notes = _plan(
        config, num_layers=num_layers, stream_limit=stream_limit, stream_failure=bool(stream_failures)
    )
    if scanner.lines_read == 0:
        notes = [EMPTY_LOG_NOTE]  # nothing else to say about no lines
    if scanner.dropped_incidents:
        notes.append(f"{scanner.dropped_incidents} further error sites were not analysed (more than {MAX_INCIDENTS})")
    return Diagnosis(
        source=source,
        lines_read=scanner.lines_read,
        failures=failures,
        config=config,
        stream_plan=plan,
        aiv_plan=aiv,
        suggested_sizes=suggestion,
        notes=notes,
    )


def _fill_missing(config: LogConfig, later: LogConfig) -> None:
    for name in ("num_hidden_layers", "tensor_parallel_size", "data_parallel_size", "hccl_op_expansion_mode",
                 "architecture", "cudagraph_mode"):
        if getattr(config, name) is None and getattr(later, name) is not None:
            config.set(name, getattr(later, name), later.sources.get(name, 0))
    if not config.sizes and later.sizes:
        config.captured_cases = list(later.captured_cases)
        if later.capture_sizes:
            config.set("capture_sizes", list(later.capture_sizes), later.sources.get("capture_sizes", 0))
    if not config.captured_phases:
        config.captured_phases = list(later.captured_phases)
        config.decode_only_full = later.decode_only_full
