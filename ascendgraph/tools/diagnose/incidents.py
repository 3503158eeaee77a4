"""Classification: hits of one process grouped into incidents, incidents into failures."""

from __future__ import annotations

import bisect
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ascendgraph.errors import (
    classify_capture_error,
)
from ascendgraph.tools.diagnose.classes import (
    _ADVISORY_LEVELS, _CAPTURE_CONTEXT, _CAPTURE_DONE, _CAPTURE_START, _DECIDING_PRIORITY, _MARKERS, _SESSION_START,
    _SIGNATURE_CLASSES, FAILURE_CLASSES, INCIDENT_WINDOW, LINE_SIGNATURES, MAX_INCIDENT_TEXT, MAX_INCIDENTS, MERGE_GAP,
    RECENT_LINES, FailureClass, LineSignature, _may_match, split_line,
)
from ascendgraph.tools.diagnose.logconfig import LogConfig, update_config

EXCERPT_CHARS = 200


def shorten(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters: cut at the last word boundary before it, with an
    ellipsis (never mid-word, never silently)."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


# --------------------------------------------------------------------------- incidents


@dataclass
class _Incident:
    process: Optional[str]
    first_line: int
    last_hit_line: int
    excerpt: str
    in_capture: bool
    config: LogConfig
    kinds: set[str] = field(default_factory=set)
    codes: list[str] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    quiet_lines: int = 0


@dataclass
class Failure:
    """One capture failure: where it first shows, what it is, and what to do."""

    line: int
    classification: str
    error_class: Optional[str]
    guidance: str
    excerpt: str
    lines: list[int]
    last_line: int
    processes: list[str]
    config: LogConfig = field(repr=False, default_factory=LogConfig)

    @property
    def occurrences(self) -> int:
        return len(self.lines)

    def as_dict(self) -> dict[str, Any]:
        return {
            "line": self.line,
            "last_line": self.last_line,
            "classification": self.classification,
            "error_class": self.error_class,
            "guidance": self.guidance,
            "excerpt": self.excerpt,
            "occurrences": self.occurrences,
            "lines": self.lines[:50],
            "processes": self.processes,
        }


def _hits(message: str) -> list[tuple[LineSignature, "re.Match[str]"]]:
    lower = message.lower()
    if not _may_match(lower):
        return []
    found = []
    for signature in LINE_SIGNATURES:
        match = signature.pattern.search(lower)
        if match:
            found.append((signature, match))
    return found


def _classify(incident: _Incident) -> Optional[tuple[FailureClass, str]]:
    """(class, guidance) for an incident, or None when it is no capture failure."""
    decided = {s.decides for s in LINE_SIGNATURES if s.kind in incident.kinds and s.decides}
    for name in _DECIDING_PRIORITY:
        if name in decided and name in _SIGNATURE_CLASSES:
            return FAILURE_CLASSES[name], FAILURE_CLASSES[name].guidance
    found = classify_capture_error("\n".join(incident.text))
    if found is not None:
        return FAILURE_CLASSES[found[0]], found[2]
    for name in _DECIDING_PRIORITY:
        if name in decided:
            return FAILURE_CLASSES[name], FAILURE_CLASSES[name].guidance
    if incident.codes or "code_207008" in incident.kinds:
        code = incident.codes[0] if incident.codes else "207008"
        failure_class = FAILURE_CLASSES["capture_error"]
        return failure_class, failure_class.guidance.format(code=code)
    if "oom" in incident.kinds and incident.in_capture:
        return FAILURE_CLASSES["oom_during_capture"], FAILURE_CLASSES["oom_during_capture"].guidance
    return None


class _Scanner:
    """Turns lines into incidents, keeping the per-process state the rules need."""

    def __init__(self) -> None:
        self.config = LogConfig()
        self.incidents: list[_Incident] = []
        self.open: dict[Optional[str], _Incident] = {}
        self.recent: dict[Optional[str], deque[str]] = {}
        self.capturing: dict[Optional[str], bool] = {}
        self.capture_starts: dict[Optional[str], list[int]] = {}
        self.sessions: list[int] = []
        self.lines_read = 0
        self.dropped_incidents = 0
        self._process: Optional[str] = None

    def feed(self, number: int, raw: str) -> None:
        line = split_line(number, raw, self._process)
        self._process = line.process
        self.lines_read = number
        lower = line.message.lower()
        process = line.process

        if _MARKERS.search(lower):
            self._markers(lower, process, number)
        update_config(self.config, line, lower)

        hits = _hits(line.message)
        if hits and line.level in _ADVISORY_LEVELS:
            # INFO / WARNING lines mention memory in advice ("... to avoid running out of memory");
            # an out-of-memory error is raised, so it comes as an ERROR line or a bare traceback line.
            hits = [(s, m) for s, m in hits if s.kind != "oom"]
        incident = self.open.get(process)
        if incident is not None:
            if len(incident.text) < MAX_INCIDENT_TEXT:
                incident.text.append(line.message)
            if hits:
                self._add_hits(incident, hits, number)
            else:
                incident.quiet_lines += 1
                if incident.quiet_lines > INCIDENT_WINDOW:
                    self._close(process)
        elif hits:
            recent = self.recent.get(process, ())
            context = any(token in text for text in recent for token in _CAPTURE_CONTEXT)
            incident = _Incident(
                process=process,
                first_line=number,
                last_hit_line=number,
                excerpt=shorten(line.message.strip(), EXCERPT_CHARS),
                in_capture=bool(self.capturing.get(process)) or context,
                config=self.config.copy(),
                text=[line.message],
            )
            self._add_hits(incident, hits, number)
            self.open[process] = incident
        self.recent.setdefault(process, deque(maxlen=RECENT_LINES)).append(lower)

    def _markers(self, lower: str, process: Optional[str], number: int) -> None:
        if any(marker in lower for marker in _SESSION_START):
            self.sessions.append(number)
            self._close_all()
            self.capturing.clear()
        if any(marker in lower for marker in _CAPTURE_START):
            starts = self.capture_starts.setdefault(process, [])
            if not self.capturing.get(process) or not starts:
                starts.append(number)
            self.capturing[process] = True
        elif any(marker in lower for marker in _CAPTURE_DONE):
            self.capturing[process] = False

    def _add_hits(self, incident: _Incident, hits: list[tuple[LineSignature, "re.Match[str]"]], number: int) -> None:
        incident.last_hit_line = number
        incident.quiet_lines = 0
        for signature, match in hits:
            incident.kinds.add(signature.kind)
            if signature.kind == "capture_api_error":
                incident.codes.append(match.group(1))
        if not incident.in_capture:
            incident.in_capture = any(token in t.lower() for t in incident.text[-3:] for token in _CAPTURE_CONTEXT)

    def _close(self, process: Optional[str]) -> None:
        incident = self.open.pop(process, None)
        if incident is None:
            return
        if len(self.incidents) < MAX_INCIDENTS:
            self.incidents.append(incident)
        else:
            self.dropped_incidents += 1

    def _close_all(self) -> None:
        for process in list(self.open):
            self._close(process)

    def failures(self) -> list[Failure]:
        self._close_all()
        failures: list[Failure] = []
        latest: dict[str, Failure] = {}
        for incident in sorted(self.incidents, key=lambda i: i.first_line):
            classified = _classify(incident)
            if classified is None:
                # An out-of-memory line right after a capture failure belongs to it (a re-raise).
                earlier = latest.get("oom_during_capture")
                if "oom" in incident.kinds and earlier and self._same_failure(earlier, incident):
                    self._merge(earlier, incident)
                continue
            failure_class, guidance = classified
            earlier = latest.get(failure_class.name)
            if earlier is not None and self._same_failure(earlier, incident):
                self._merge(earlier, incident)
                continue
            failure = Failure(
                line=incident.first_line,
                classification=failure_class.name,
                error_class=failure_class.error_class,
                guidance=guidance,
                excerpt=incident.excerpt,
                lines=[incident.first_line],
                last_line=incident.last_hit_line,
                processes=[incident.process] if incident.process else [],
                config=incident.config,
            )
            failures.append(failure)
            latest[failure_class.name] = failure
        return failures

    def _same_failure(self, failure: Failure, incident: _Incident) -> bool:
        start, end = failure.last_line, incident.first_line
        if end - start > MERGE_GAP:
            return False
        if _any_between(self.sessions, start, end):
            return False
        # A process of this failure that starts capturing again is a new attempt.
        return not any(_any_between(self.capture_starts.get(p, []), start, end) for p in failure.processes)

    @staticmethod
    def _merge(failure: Failure, incident: _Incident) -> None:
        failure.lines.append(incident.first_line)
        failure.last_line = max(failure.last_line, incident.last_hit_line)
        if incident.process and incident.process not in failure.processes:
            failure.processes.append(incident.process)


def _any_between(sorted_lines: Sequence[int], start: int, end: int) -> bool:
    index = bisect.bisect_right(sorted_lines, start)
    return index < len(sorted_lines) and sorted_lines[index] < end
