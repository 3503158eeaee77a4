"""`ascendgraph diagnose`: find graph-capture failures in a vLLM / vLLM Ascend log.

Theory of operation. The log is read once, line by line (any size, any encoding: bytes
that are not UTF-8 become U+FFFD; an input whose first 64 KiB are mostly binary — control
bytes, or bytes that are no text in any encoding — is refused as "not a text log"). Each line loses its decorations — ANSI colours, vLLM's
``(Worker_TP3 pid=123)`` process tags and its ``ERROR 04-20 21:27:00 [file.py:12]``
prefix — and what is left is matched against `LINE_SIGNATURES`, a table of the texts
that mark a capture failure (SEMANTICS §8 and the texts in `ascendgraph.errors`).

One failure prints many lines: the runtime's own report, the exception message, a
traceback, the same message again when vLLM re-raises it, and once per rank. So:

1. *Incidents*: the hits of one process that follow each other closely (fewer than
   `INCIDENT_WINDOW` of its lines apart) form one incident; the incident's whole text is
   classified at once, exactly as `rewrite_capture_error` classifies an exception
   message (a message vLLM Ascend already rewrote keeps the class it was given).
2. *Findings*: incidents of the same class merge into one finding unless the engine
   restarted in between, a process of the finding began capturing again, or they lie
   more than `MERGE_GAP` lines apart. Each finding is one failure, reported with the line
   where it first shows, its class and the guidance `rewrite_capture_error` would give.

Alongside, the configuration the log prints (vLLM's non-default args and engine config
line, vLLM Ascend's capture and stream-budget lines, pasted ``export`` / ``vllm serve``
lines) is collected; when it names capture sizes and a layer count, the stream plan of
SEMANTICS §9 is printed with a smaller size list that fits.
"""

from __future__ import annotations

import bisect
import gzip
import io
import re
import sys
import textwrap
import zlib
from collections import deque
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Iterable, Iterator, Optional, Sequence

from ascendgraph.errors import (
    ADDRESS_MISMATCH,
    CAPTURE_ERROR_SIGNATURES,
    LAUNCH_BLOCKING_MESSAGE,
    OLD_HDK_GUIDANCE,
    RESOURCE_ALLOC_GUIDANCE,
    STREAM_EXHAUSTION_GUIDANCE,
    TASK_QUEUE_2_DURING_CAPTURE,
    TEXT_EL0009,
    TEXT_STREAMS_INSUFFICIENT,
    ConfigError,
    classify_capture_error,
)
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import DEFAULT_MAX_STREAMS, StreamPlan, plan_stream_budget, sample_sizes

__all__ = [
    "FailureClass",
    "FAILURE_CLASSES",
    "LINE_SIGNATURES",
    "Failure",
    "LogConfig",
    "Diagnosis",
    "UnreadableLog",
    "diagnose_lines",
    "diagnose_file",
    "diagnosis_to_json",
    "format_diagnosis",
]

SCHEMA_VERSION = 1
NOTHING_FOUND = 0
FAILURES_FOUND = 1

INCIDENT_WINDOW = 40  # lines of one process without a hit that end an incident
MERGE_GAP = 3000  # lines between two incidents beyond which they are separate failures
MAX_LINE_BYTES = 1 << 20  # longer physical lines are cut (binary junk, giant dumps)
MAX_INCIDENT_TEXT = 400  # lines of text kept per incident for classification
MAX_INCIDENTS = 20_000
RECENT_LINES = 80  # per-process look-back for "was this during a capture?"
WRAP = 100


class UnreadableLog(ConfigError):
    """The log file (or standard input) cannot be read."""


# --------------------------------------------------------------------------- classes


@dataclass(frozen=True)
class FailureClass:
    """What a failure is: its name, the ascendgraph error it maps to, and the guidance."""

    name: str
    error_class: Optional[str]
    guidance: str
    stream_related: bool = False


ADDRESS_MISMATCH_GUIDANCE = (
    "A captured graph was replayed with inputs at other device addresses than it was captured "
    "with (vLLM Ascend checks this only with debug logging on; without the check the replay reads "
    "stale buffers). Something between capture and replay re-allocated a graph input: keep graph "
    "inputs in persistent buffers and copy new data into them, and look for custom ops or patches "
    "that replace those buffers. Re-run with --enforce-eager to confirm the failure is graph-related."
)
OOM_DURING_CAPTURE_GUIDANCE = (
    "Device memory ran out while graphs were being captured: the graph pool is filled after the KV "
    "cache has taken its share. Leave more room (a lower gpu_memory_utilization), capture fewer sizes "
    "or lower max_cudagraph_capture_size, or capture decode batches only (FULL_DECODE_ONLY)."
)
CAPTURE_ERROR_GUIDANCE = (
    "Graph capture failed with runtime error code {code}, which matches no known signature (vLLM "
    "Ascend re-raises such errors unchanged). Look the code up in the CANN runtime error codes and "
    "read the plog files (default $HOME/ascend/log/debug) from the time of the failure; re-run with "
    "--enforce-eager to confirm the failure is capture-related."
)

_SIGNATURE_CLASSES = {
    name: FailureClass(name, cls.__name__, guidance, stream_related=True)
    for name, cls, guidance, _ in CAPTURE_ERROR_SIGNATURES
}
FAILURE_CLASSES: dict[str, FailureClass] = {
    **_SIGNATURE_CLASSES,
    "launch_blocking": FailureClass("launch_blocking", "ConfigError", LAUNCH_BLOCKING_MESSAGE),
    "task_queue_2": FailureClass("task_queue_2", "CaptureConstraintError", TASK_QUEUE_2_DURING_CAPTURE),
    "address_mismatch": FailureClass("address_mismatch", "AssertionError", ADDRESS_MISMATCH_GUIDANCE),
    "oom_during_capture": FailureClass("oom_during_capture", None, OOM_DURING_CAPTURE_GUIDANCE),
    "capture_error": FailureClass("capture_error", "CaptureError", CAPTURE_ERROR_GUIDANCE),
}


# --------------------------------------------------------------------------- line signatures


def _first_clause(text: str, stop: str = ". ") -> str:
    """The opening of a message, lower-cased: what survives wrapping and re-raising."""
    return text.split(stop, 1)[0].strip().lower()


_ERROR_CODE_CONTEXT = r"(?:error code is|error code|result =|result:|ret(?:code)?\s*[=:]|error:?)\s*"


@dataclass(frozen=True)
class LineSignature:
    """A text that marks a capture failure on one line (matched on the lower-cased message)."""

    kind: str
    pattern: "re.Pattern[str]"
    # The class a line with this text has, whatever else the failure says: vLLM Ascend's
    # rewritten messages were already classified by the rewriter.
    decides: Optional[str] = None


def _literal(text: str) -> "re.Pattern[str]":
    return re.compile(re.escape(text.lower()))


LINE_SIGNATURES: tuple[LineSignature, ...] = (
    LineSignature("rewritten_old_hdk", _literal(_first_clause(OLD_HDK_GUIDANCE)), "old_hdk"),
    LineSignature("rewritten_stream", _literal(_first_clause(STREAM_EXHAUSTION_GUIDANCE)), "stream_exhaustion"),
    LineSignature("rewritten_resource_alloc", _literal(_first_clause(RESOURCE_ALLOC_GUIDANCE, " (")),
                  "resource_alloc"),
    # Older vLLM Ascend (2025) wording for the same stream budget failure.
    LineSignature("legacy_stream", _literal("ACLgraph has insufficient available streams"), "stream_exhaustion"),
    LineSignature("alloc_sq_cq", _literal("alloc sq cq fail")),
    # "[Error]: Stream resources are insufficient." without its "[Error]: " label.
    LineSignature("streams_insufficient", _literal(TEXT_STREAMS_INSUFFICIENT.split(": ", 1)[1].rstrip("."))),
    LineSignature("el0009", _literal(_first_clause(TEXT_EL0009, "("))),
    # An error code where runtimes print one ("error code is 207008", "runtime result = 207005"),
    # not digits in a request id or a number ("chatcmpl-207005", "0.207005 s", "207,008 tokens").
    LineSignature("code_207008", re.compile(_ERROR_CODE_CONTEXT + r"207008(?!\d)")),
    LineSignature("code_207005", re.compile(_ERROR_CODE_CONTEXT + r"207005(?!\d)")),
    LineSignature("resource_alloc_fail", _literal("resource alloc fail")),
    LineSignature("capture_api_error", re.compile(r"aclmdlricapture\w*\(.*?\), error code is (\d+)")),
    LineSignature("address_mismatch", _literal(_first_clause(ADDRESS_MISMATCH.split(".")[0])), "address_mismatch"),
    LineSignature("launch_blocking", _literal(_first_clause(LAUNCH_BLOCKING_MESSAGE)), "launch_blocking"),
    LineSignature("task_queue_2", _literal(_first_clause(TASK_QUEUE_2_DURING_CAPTURE, ",")), "task_queue_2"),
    LineSignature("oom", re.compile(r"npu out of memory|outofmemoryerror|\bout of memory\b")),
)


def _may_match(lower: str) -> bool:
    """Cheap pre-filter: every signature contains one of these words (most lines contain none)."""
    return (
        "2070" in lower
        or "alloc" in lower
        or "insufficient" in lower
        or "acl graph" in lower
        or "aclgraph" in lower
        or "aclmdlricapture" in lower
        or "task_queue_enable" in lower
        or "out of memory" in lower
        or "outofmemory" in lower
    )


# Rewritten classes first (the rewriter already decided), in the rewriter's priority order.
_DECIDING_PRIORITY = ("old_hdk", "stream_exhaustion", "resource_alloc", "launch_blocking", "task_queue_2",
                      "address_mismatch")

# Text that says "a capture is (or was just) under way" — for telling an out-of-memory
# error during capture from one elsewhere.
_CAPTURE_CONTEXT = ("capture_model", "capture_begin", "capture_end", "_capture", "aclgraph", "acl graph",
                    "npugraph", "npu/graphs.py", "torch.npu.graph", "cuda graph", "cudagraph", "graph capture",
                    "capturing")
_CAPTURE_START = ("starting to capture acl graphs", "capturing acl graphs", "capturing cuda graphs",
                  "capturing npu graphs")
_CAPTURE_DONE = ("graph capturing finished", "capturing finished")
# A new serving session (the engine starts again): failures before and after are different.
_SESSION_START = ("initializing a v1 llm engine", "vllm api server version", "non-default args")
_MARKERS = re.compile("|".join(re.escape(m) for m in _SESSION_START + _CAPTURE_START + _CAPTURE_DONE))
# Log levels of advice and progress: an out-of-memory *error* never comes at these levels.
_ADVISORY_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN")


# --------------------------------------------------------------------------- line anatomy

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_PROCESS_TAGS = re.compile(r"^\s*((?:\([A-Za-z][\w.\-]*(?: pid=\d+)?\)\s*)+)")
_TAG = re.compile(r"\(([A-Za-z][\w.\-]*)(?: pid=\d+)?\)")
_LEVEL_PREFIX = re.compile(
    r"^(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?\s+\[[^\]]*\]\s?"
)


@dataclass(frozen=True)
class LogLine:
    number: int
    message: str
    process: Optional[str]
    level: Optional[str]


def split_line(number: int, raw: str, previous_process: Optional[str]) -> LogLine:
    """Strip colours, process tags and the logger prefix; untagged lines keep the last tag."""
    text = _ANSI.sub("", raw) if "\x1b" in raw else raw
    process = previous_process
    tags = _PROCESS_TAGS.match(text)
    if tags:
        names = _TAG.findall(tags.group(1))
        process = names[-1] if names else previous_process
        text = text[tags.end():]
    level = None
    prefix = _LEVEL_PREFIX.match(text)
    if prefix:
        level = prefix.group("level")
        text = text[prefix.end():]
    return LogLine(number=number, message=text, process=process, level=level)


# --------------------------------------------------------------------------- configuration


@dataclass
class LogConfig:
    """The graph-mode configuration a log shows; ``sources`` gives the line of each value."""

    cudagraph_mode: Optional[str] = None
    capture_sizes: Optional[list[int]] = None
    captured_cases: list[int] = field(default_factory=list)
    captured_phases: list[str] = field(default_factory=list)  # runtime modes seen capturing: FULL, PIECEWISE
    decode_only_full: bool = True
    num_hidden_layers: Optional[int] = None
    tensor_parallel_size: Optional[int] = None
    data_parallel_size: Optional[int] = None
    prefill_context_parallel_size: Optional[int] = None
    decode_context_parallel_size: Optional[int] = None
    max_num_seqs: Optional[int] = None
    enable_expert_parallel: Optional[bool] = None
    enforce_eager: Optional[bool] = None
    hccl_op_expansion_mode: Optional[str] = None
    architecture: Optional[str] = None
    sources: dict[str, int] = field(default_factory=dict)

    def copy(self) -> "LogConfig":
        return LogConfig(**{**self.__dict__, "captured_cases": list(self.captured_cases),
                            "captured_phases": list(self.captured_phases), "sources": dict(self.sources)})

    def set(self, name: str, value: Any, line: int) -> None:
        setattr(self, name, value)
        self.sources[name] = line

    @property
    def sizes(self) -> list[int]:
        """The configured sizes, else the sizes the log shows being captured."""
        if self.capture_sizes:
            return sorted(set(self.capture_sizes))
        return sorted(set(self.captured_cases))

    def mode(self) -> tuple[Optional[GraphMode], str]:
        """The graph mode and where it came from ("log", "capture lines", "assumed")."""
        if self.cudagraph_mode:
            try:
                return GraphMode.parse(self.cudagraph_mode), "log"
            except ConfigError:
                pass
        phases = set(self.captured_phases)
        if phases == {"PIECEWISE"}:
            return GraphMode.PIECEWISE, "capture lines"
        if phases == {"FULL", "PIECEWISE"}:
            return GraphMode.FULL_AND_PIECEWISE, "capture lines"
        if phases == {"FULL"}:
            return (GraphMode.FULL_DECODE_ONLY if self.decode_only_full else GraphMode.FULL), "capture lines"
        return None, "not in the log"

    @property
    def is_moe(self) -> bool:
        return bool(self.architecture and "moe" in self.architecture.lower())

    def as_dict(self) -> dict[str, Any]:
        mode, mode_source = self.mode()
        return {
            "cudagraph_mode": mode.name if mode else None,
            "cudagraph_mode_source": mode_source,
            "capture_sizes": self.sizes or None,
            "num_hidden_layers": self.num_hidden_layers,
            "tensor_parallel_size": self.tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "prefill_context_parallel_size": self.prefill_context_parallel_size,
            "decode_context_parallel_size": self.decode_context_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "enable_expert_parallel": self.enable_expert_parallel,
            "enforce_eager": self.enforce_eager,
            "hccl_op_expansion_mode": self.hccl_op_expansion_mode,
            "architecture": self.architecture,
            "sources": dict(self.sources),
        }


_CONFIG_PREFILTER = re.compile(r"cudagraph|parallel|layers|hccl_op_expansion_mode|ffts\+|eager|architecture"
                               r"|captur|num_seqs|num-seqs|-tp|-dp|-pcp|-dcp")
_Q = r"""['"]?"""
_SIZES = re.compile(rf"(?<![\w]){_Q}cudagraph_capture_sizes{_Q}\s*[:=]\s*\[([\d,\s]*)\]")
_MODE = re.compile(
    rf"(?<![\w]){_Q}cudagraph_mode{_Q}\s*[:=]\s*"
    r"(?:<CUDAGraphMode\.(?P<enum>\w+)[^>]*>|[\[(]\s*(?P<a>\d)\s*,\s*(?P<b>\d)\s*[\])]"
    r"|['\"]?(?:CUDAGraphMode\.)?(?P<word>[A-Za-z_]+|\d)['\"]?)"
)
_INT_KEYS = ("tensor_parallel_size", "data_parallel_size", "prefill_context_parallel_size",
             "decode_context_parallel_size", "num_hidden_layers", "max_num_seqs")
_INT_VALUE = re.compile(rf"(?<![\w]){_Q}({'|'.join(_INT_KEYS)}){_Q}\s*[:=]\s*['\"]?(\d+)")
_INT_FLAG = re.compile(
    r"(?<!\S)--(tensor-parallel-size|data-parallel-size|prefill-context-parallel-size|"
    r"decode-context-parallel-size|max-num-seqs)(?:=|\s+)(\d+)"
)
_SHORT_FLAG = re.compile(r"(?<!\S)-(tp|dp|pcp|dcp)(?:=|\s+)(\d+)")
_SHORT_FLAGS = {"tp": "tensor_parallel_size", "dp": "data_parallel_size",
                "pcp": "prefill_context_parallel_size", "dcp": "decode_context_parallel_size"}
_LAYERS_NOTE = re.compile(r"\(layers:\s*(\d+)\)")
_BOOL_VALUE = re.compile(rf"(?<![\w]){_Q}(enable_expert_parallel|enforce_eager){_Q}\s*[:=]\s*(True|False|true|false)")
# A flag on a pasted command line: followed by the line's end, a continuation backslash or another flag
# (not "re-run with --enforce-eager to ..." in prose).
_BOOL_FLAG = re.compile(r"(?<!\S)--(enable-expert-parallel|enforce-eager)(?=\s*\\?\s*$|\s+-)")
_ARCHITECTURE = re.compile(rf"{_Q}architectures{_Q}\s*[:=]\s*\[\s*['\"](\w+)['\"]|resolved architecture:\s*(\w+)",
                           re.IGNORECASE)
_HCCL = re.compile(r"HCCL_OP_EXPANSION_MODE['\"]?\s*[=:]\s*['\"]?([A-Za-z_+]+)")
_FFTS_WARNING = "communication is performed using ffts+"
_CASES = re.compile(r"starting to capture acl graphs for cases:\s*\[([\d,\s]*)\],\s*mode:\s*(\w+)"
                    r"(?:,\s*uniform_decode:\s*(true|false))?", re.IGNORECASE)
_CAPTURE_BAR = re.compile(r"capturing (?:cuda|acl|npu) graphs \((decode|mixed prefill-decode),\s*(\w+)\)",
                          re.IGNORECASE)


def _int_list(text: str) -> list[int]:
    return [int(v) for v in re.findall(r"\d+", text)]


def _mode_name(match: "re.Match[str]") -> Optional[str]:
    if match.group("enum"):
        return match.group("enum")
    if match.group("a") is not None:
        member = GraphMode.from_pair(GraphMode(int(match.group("a"))), GraphMode(int(match.group("b"))))
        return member.name if member else None
    word = match.group("word")
    if word in ("None", "null"):  # a repr of "not set", not the mode NONE
        return None
    if word.isdigit():
        try:
            return GraphMode(int(word)).name
        except ValueError:
            return None
    return word.upper()


def update_config(config: LogConfig, line: LogLine, lower: Optional[str] = None) -> None:
    """Take whatever graph-mode settings this line shows (later lines win)."""
    message = line.message
    lower = message.lower() if lower is None else lower
    if not _CONFIG_PREFILTER.search(lower):
        return
    number = line.number
    # Each pattern runs only when its key word is on the line: most lines carry none.
    if "cudagraph_capture_sizes" in lower:
        for match in _SIZES.finditer(message):
            sizes = _int_list(match.group(1))
            if sizes:
                config.set("capture_sizes", sizes, number)
    if "cudagraph_mode" in lower:
        for match in _MODE.finditer(message):
            name = _mode_name(match)
            if name:
                config.set("cudagraph_mode", name, number)
    if "_size" in lower or "num_hidden_layers" in lower or "max_num_seqs" in lower:
        for key, value in _INT_VALUE.findall(message):
            config.set(key, int(value), number)
    if "-" in message:
        for flag, value in _INT_FLAG.findall(message):
            config.set(flag.replace("-", "_"), int(value), number)
        for flag, value in _SHORT_FLAG.findall(message):
            config.set(_SHORT_FLAGS[flag], int(value), number)
        for flag in _BOOL_FLAG.findall(message):
            config.set(flag.replace("-", "_"), True, number)
    if "layers:" in lower:
        for value in _LAYERS_NOTE.findall(message):
            config.set("num_hidden_layers", int(value), number)
    if "enable_expert_parallel" in lower or "enforce_eager" in lower:
        for key, value in _BOOL_VALUE.findall(message):
            config.set(key, value.lower() == "true", number)
    if "architecture" in lower:
        for listed, resolved in _ARCHITECTURE.findall(message):
            config.set("architecture", listed or resolved, number)
    if _FFTS_WARNING in lower:
        config.set("hccl_op_expansion_mode", "FFTS+", number)
    elif "hccl_op_expansion_mode" in lower:
        for match in _HCCL.finditer(message):
            # "... set HCCL_OP_EXPANSION_MODE=AIV" is advice (vLLM Ascend's FFTS+ warning, our hints).
            if re.search(r"\bset\s*$", message[max(0, match.start() - 8):match.start()], re.IGNORECASE):
                continue
            config.set("hccl_op_expansion_mode", match.group(1).upper(), number)
    if "captur" in lower:
        for sizes_text, mode, uniform in _CASES.findall(message):
            config.captured_cases = sorted(set(config.captured_cases) | set(_int_list(sizes_text)))
            config.sources.setdefault("captured_cases", number)
            _add_phase(config, mode.upper(), uniform.lower() == "true" if uniform else None)
        for kind, mode in _CAPTURE_BAR.findall(message):
            _add_phase(config, mode.upper(), kind.lower() == "decode")


def _add_phase(config: LogConfig, mode: str, uniform_decode: Optional[bool]) -> None:
    if mode not in ("FULL", "PIECEWISE"):
        return
    if mode not in config.captured_phases:
        config.captured_phases.append(mode)
    if mode == "FULL" and uniform_decode is False:
        config.decode_only_full = False


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
                excerpt=line.message.strip()[:200],
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


# --------------------------------------------------------------------------- reading


def iter_log_lines(stream: BinaryIO) -> Iterator[str]:
    """Decoded lines of a byte stream; invalid UTF-8 becomes U+FFFD, over-long lines are cut."""
    while True:
        chunk = stream.readline(MAX_LINE_BYTES)
        if not chunk:
            return
        if len(chunk) == MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            while True:  # skip the rest of the physical line
                rest = stream.readline(MAX_LINE_BYTES)
                if not rest or rest.endswith(b"\n"):
                    break
        yield chunk.decode("utf-8", errors="replace").rstrip("\r\n")


def _maybe_gunzip(stream: BinaryIO) -> BinaryIO:
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=stream)  # type: ignore[return-value]
    return stream


_READ_HINT = "pass a readable vLLM log file, or - to read standard input"

SNIFF_BYTES = 64 * 1024  # how much of the (decompressed) log the text check looks at
MAX_CONTROL_SHARE = 0.08  # control bytes (NUL included; tab, newlines, form feed and ESC excepted)
MAX_UNDECODABLE_SHARE = 0.75  # bytes that are not UTF-8 (other encodings stay readable below this)
_TEXT_CONTROLS = frozenset("\t\n\r\f\v\x1b")
EMPTY_LOG_NOTE = "the log is empty (0 lines): nothing to diagnose"


class _Rejoined(io.RawIOBase):
    """The bytes already read for the text check, then the rest of the stream."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        super().__init__()
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            count = min(len(buffer), len(self._head))
            buffer[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def binary_share(head: bytes) -> tuple[float, float]:
    """(control share, undecodable share) of a sample; a leading run of NULs (a log truncated
    in place, e.g. by logrotate's copytruncate) is left out."""
    text = head.lstrip(b"\0").decode("utf-8", errors="replace")
    if not text:
        return 0.0, 0.0
    controls = sum(1 for c in text if (c < " " and c not in _TEXT_CONTROLS) or c == "\x7f")
    return controls / len(text), text.count("\ufffd") / len(text)


def _check_text(source: str, head: bytes) -> None:
    controls, undecodable = binary_share(head)
    if controls > MAX_CONTROL_SHARE or undecodable > MAX_UNDECODABLE_SHARE:
        raise UnreadableLog(
            f"{source} does not look like a text log ({controls:.0%} control bytes, {undecodable:.0%} not UTF-8 "
            f"in its first {len(head)} bytes); {_READ_HINT} (plain text or .gz)",
            key="LOGFILE",
        )


def _text_stream(source: str, stream: BinaryIO) -> BinaryIO:
    """The (gunzipped) stream, after checking that its start looks like text."""
    stream = _maybe_gunzip(stream)
    head = stream.read(SNIFF_BYTES)
    _check_text(source, head)
    return io.BufferedReader(_Rejoined(head, stream))  # type: ignore[return-value]


def diagnose_file(
    path: str,
    *,
    num_layers: Optional[int] = None,
    stream_limit: int = DEFAULT_MAX_STREAMS,
    stdin: Optional[BinaryIO] = None,
) -> Diagnosis:
    """Diagnose a log file (plain or gzip), or standard input for ``-``.

    Unreadable, or not text (its first 64 KiB, after gunzip, hold more than 8 % control
    bytes or more than 75 % bytes that are not UTF-8) -> UnreadableLog."""
    source = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            raw = stdin if stdin is not None else sys.stdin.buffer
            handle: BinaryIO = raw if hasattr(raw, "peek") else io.BufferedReader(raw)  # type: ignore[arg-type]
            return diagnose_lines(iter_log_lines(_text_stream(source, handle)), source=source,
                                  num_layers=num_layers, stream_limit=stream_limit)
        with open(path, "rb") as handle:
            return diagnose_lines(iter_log_lines(_text_stream(source, handle)), source=source,
                                  num_layers=num_layers, stream_limit=stream_limit)
    except (OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise UnreadableLog(f"cannot read log {source!r}: {reason}; {_READ_HINT}", key="LOGFILE") from None


# --------------------------------------------------------------------------- output


def diagnosis_to_json(diagnosis: Diagnosis) -> dict[str, Any]:
    """The `diagnose --json` document."""
    plan = diagnosis.stream_plan
    return {
        "schema_version": SCHEMA_VERSION,
        "source": diagnosis.source,
        "lines_read": diagnosis.lines_read,
        "failures": [f.as_dict() for f in diagnosis.failures],
        "config": diagnosis.config.as_dict(),
        "stream_plan": plan.as_dict() if plan else None,
        "aiv_stream_plan": diagnosis.aiv_plan.as_dict() if diagnosis.aiv_plan else None,
        "suggested_capture_sizes": diagnosis.suggested_sizes,
        "notes": list(diagnosis.notes),
    }


def _sizes_text(sizes: Sequence[int], limit: int = 24) -> str:
    from ascendgraph.explanation import format_sizes

    return format_sizes(list(sizes), limit=limit)


def _wrap(text: str, indent: str) -> list[str]:
    lines: list[str] = []
    for paragraph in text.split("\n"):
        lines.append(textwrap.fill(paragraph, WRAP, initial_indent=indent, subsequent_indent=indent))
    return lines


def _config_lines(config: LogConfig) -> list[str]:
    mode, mode_source = config.mode()
    src = config.sources

    def at(name: str) -> str:
        return f" (line {src[name]})" if name in src else ""

    rows = []
    if mode is not None:
        origin = at("cudagraph_mode") if mode_source == "log" else f" (from the {mode_source})"
        rows.append(("cudagraph_mode", f"{mode.name}{origin}"))
    sizes = config.sizes
    if sizes:
        origin = at("capture_sizes") if config.capture_sizes else f" (captured{at('captured_cases')})"
        rows.append(("capture sizes", f"{len(sizes)}: {_sizes_text(sizes)}{origin}"))
    for name, label in (("num_hidden_layers", "layers"), ("tensor_parallel_size", "tensor_parallel_size"),
                        ("data_parallel_size", "data_parallel_size"),
                        ("prefill_context_parallel_size", "prefill_context_parallel_size"),
                        ("decode_context_parallel_size", "decode_context_parallel_size"),
                        ("enable_expert_parallel", "enable_expert_parallel"), ("enforce_eager", "enforce_eager"),
                        ("hccl_op_expansion_mode", "HCCL_OP_EXPANSION_MODE"), ("architecture", "architecture")):
        value = getattr(config, name)
        if value is not None:
            rows.append((label, f"{value}{at(name)}"))
    return [f"  {label:<30}{value}" for label, value in rows]


def format_diagnosis(diagnosis: Diagnosis) -> str:
    """The human report: each failure with its line, class and guidance; then config, plan, suggestion."""
    count = len(diagnosis.failures)
    noun = "capture failure" if count == 1 else "capture failures"
    if diagnosis.lines_read == 0:
        return f"{diagnosis.source}: {EMPTY_LOG_NOTE}"
    lines = [f"{diagnosis.source}: {count or 'no'} {noun} in {diagnosis.lines_read} lines"]
    for index, failure in enumerate(diagnosis.failures, 1):
        error = f" ({failure.error_class})" if failure.error_class else ""
        lines += ["", f"{index}. line {failure.line}: {failure.classification}{error}"]
        lines.append(f"   seen: {failure.excerpt}")
        if failure.occurrences > 1 or len(failure.processes) > 1:
            where = f" on {', '.join(failure.processes)}" if len(failure.processes) > 1 else ""
            lines.append(f"   the same failure is reported {failure.occurrences} times{where}, "
                         f"up to line {failure.last_line} (one failure, collapsed)")
        lines.append("   guidance:")
        lines += _wrap(failure.guidance, "     ")
    config_rows = _config_lines(diagnosis.config)
    if config_rows:
        lines += ["", "configuration in the log"] + config_rows
    plan = diagnosis.stream_plan
    if plan is not None:
        verdict = "fits" if plan.fits else f"DOES NOT FIT: at most {plan.max_num_sizes} sizes fit"
        lines += ["", (
            f"stream plan: {plan.graphs_per_size} graph(s) and {plan.streams_per_size} streams per size "
            f"({plan.expansion_mode}), {plan.reserved_streams + plan.full_graph_reserve} reserved, budget "
            f"{plan.max_streams}; {len(plan.requested_sizes)} sizes configured: {verdict}"
        )]
        aiv = diagnosis.aiv_plan
        if aiv is not None and aiv.max_num_sizes > plan.max_num_sizes:
            lines.append(f"  with HCCL_OP_EXPANSION_MODE=AIV: up to {aiv.max_num_sizes} sizes fit "
                         f"({'all' if aiv.fits else 'not all'} {len(aiv.requested_sizes)})")
    if diagnosis.suggested_sizes:
        sizes = diagnosis.suggested_sizes
        lines += ["", f"suggested capture sizes ({len(sizes)}): {_sizes_text(sizes, limit=40)}"]
        lines.append(f"  --compilation-config '{{\"cudagraph_capture_sizes\": [{', '.join(map(str, sizes))}]}}'")
    if diagnosis.notes:
        lines += ["", "notes:"] + [f"  - {note}" for note in diagnosis.notes]
    return "\n".join(lines)
