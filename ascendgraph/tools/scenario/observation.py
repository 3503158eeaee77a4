"""What a scenario run observed, the device it runs on, and the result it is judged into."""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

from ascendgraph.tools.scenario.model import Scenario, config_namespace

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.device import Device, DeviceStats
    from ascendgraph.runtime.report import Report


# --------------------------------------------------------------------------- results


@dataclass
class ScenarioResult:
    """What running a scenario showed: the outcome, every miss, the invariants."""

    scenario: Scenario
    outcome: str
    seconds: float
    mismatches: list[str] = field(default_factory=list)
    error: Optional[BaseException] = None  # the error, or the capture failure behind a fallback
    invariants: dict[str, str] = field(default_factory=dict)  # name -> "held" | "skipped: ..." | "violated: ..."
    report: Optional["Report"] = None
    traceback: Optional[str] = None  # of an error whose type was not the expected one

    @property
    def passed(self) -> bool:
        return not self.mismatches

    @property
    def name(self) -> str:
        return self.scenario.name

    def error_summary(self) -> Optional[dict[str, str]]:
        if self.error is None:
            return None
        return {"type": type(self.error).__name__, "message": str(self.error)}

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.scenario.name,
            "path": str(self.scenario.path),
            "kind": self.scenario.kind,
            "description": self.scenario.description,
            "expected": self.scenario.expect.outcome,
            "expected_error_type": self.scenario.expect.error_type,
            "outcome": self.outcome,
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "error": self.error_summary(),
            "mismatches": list(self.mismatches),
            "invariants": dict(self.invariants),
        }

    def explain(self) -> str:
        """Why the scenario missed its expectation (empty when it passed)."""
        if self.passed:
            return ""
        lines = [f"scenario {self.name} ({self.scenario.path}): expected {self.scenario.expected_text}, observed {self.outcome}"]
        lines += [f"  - {m}" for m in self.mismatches]
        if self.error is not None:
            first = str(self.error).strip().splitlines()[0] if str(self.error).strip() else ""
            lines.append(f"  error: {type(self.error).__name__}: {first}")
        if self.traceback:
            lines.append("  traceback of the unexpected error:")
            lines += ["    " + line for line in self.traceback.rstrip().splitlines()]
        return "\n".join(lines)


# --------------------------------------------------------------------------- running


def _figures(stats: "DeviceStats") -> dict[str, int]:
    """The resource figures a failure must give back."""
    return {
        "streams_in_use": stats.streams_in_use,
        "graphs_alive": stats.graphs_alive,
        "pool_bytes": stats.pool_bytes,
        "suspended_replays": int(stats.extra.get("suspended_replays", 0)),
    }


def _compare_figures(label: str, before: Mapping[str, int], after: Mapping[str, int]) -> list[str]:
    return [
        f"{label}: {name} {after[name]} != {before[name]} before"
        for name in before
        if after.get(name) != before[name]
    ]


def _device_lost(device: "Device") -> bool:
    try:
        return bool(device.stats().extra.get("device_lost"))
    except Exception:  # pragma: no cover - stats never raise on the simulator
        return True


def _exception_matches(exc: Optional[BaseException], name: str) -> bool:
    return exc is not None and any(cls.__name__ == name for cls in type(exc).__mro__)


@dataclass
class _Observation:
    """Everything a run showed, before it is judged."""

    error: Optional[BaseException] = None  # raised out of the run, or the run's error
    traceback: Optional[str] = None
    report: Optional["Report"] = None
    engine: Any = None
    device: Optional["Device"] = None
    capture_failure: Optional[BaseException] = None  # the capture error (raised or fallen back from)
    invariant_notes: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


class _RequestAudit:
    """Which requests each served step carried and how far it was from eager."""

    def __init__(self, engine: Any) -> None:
        self.batches: list[Any] = []
        self.records: list[Any] = []
        for route, runner in list(engine.runners.items()):
            engine.runners[route] = self._wrap(runner)
        engine.observers.append(self)

    def _wrap(self, runner: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def audited(batch: Any) -> Any:
            self.batches.append(batch)
            return runner(batch)

        return audited

    def on_step(self, engine: Any, record: Any) -> None:
        self.records.append(record)

    def violations(self, engine: Any, report: "Report") -> list[str]:
        from ascendgraph.runtime.workload import RequestStatus

        problems = []
        states = engine.scheduler.states
        open_ids = [rid for rid, s in states.items() if s.status not in (RequestStatus.FINISHED, RequestStatus.FAILED)]
        if open_ids:
            problems.append(f"requests neither completed nor failed: {', '.join(open_ids)}")
        total = report.requests_total
        if report.requests_completed + report.requests_failed != total or total != len(states):
            problems.append(
                f"report counts {report.requests_completed} completed + {report.requests_failed} failed "
                f"of {total} (scheduler holds {len(states)})"
            )
        finished = {rid for rid, s in states.items() if s.status is RequestStatus.FINISHED}
        for index, batch in enumerate(self.batches):
            ids = [r.request_id for r in batch.requests]
            record = self.records[index] if index < len(self.records) else None
            wrong = record is None or not record.max_abs_diff <= (record.tolerance or engine.atol)
            silent = sorted(finished.intersection(ids)) if wrong else []
            if silent:
                why = "was never checked" if record is None else f"differed from eager by {record.max_abs_diff:.3g}"
                problems.append(f"step {batch.step} {why} but requests {', '.join(silent)} completed (silently wrong)")
        return problems


def _namespace(scenario: Scenario) -> Any:
    return config_namespace(scenario.config)


def _sim_device(scenario: Scenario, *, soc: str, stream_limit: Optional[int]) -> "Device":
    from ascendgraph.device import get_device

    spec = scenario.device
    profile: Any = spec.profile if spec.profile is not None else soc  # a name, a JSON path or a table
    options: dict[str, Any] = {"profile": profile, "seed": scenario.run.seed, "env": dict(spec.env)}
    if stream_limit is not None:
        options["stream_limit"] = stream_limit
    if spec.faults is not None:
        options["faults"] = spec.faults
    if spec.stream_error is not None:
        options["stream_error"] = spec.stream_error
    if spec.require_task_updates is not None:
        options["require_task_updates"] = spec.require_task_updates
    return get_device("sim", **options)
