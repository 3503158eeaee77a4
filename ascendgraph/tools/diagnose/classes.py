"""The failure classes `diagnose` reports, the line signatures that mark them, and the
anatomy of a log line (process tags, level prefixes)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from ascendgraph.errors import (
    ADDRESS_MISMATCH,
    CAPTURE_ERROR_SIGNATURES,
    LAUNCH_BLOCKING_MESSAGE,
    OLD_HDK_GUIDANCE,
    OOM_DURING_CAPTURE_GUIDANCE,
    RESOURCE_ALLOC_GUIDANCE,
    STREAM_EXHAUSTION_GUIDANCE,
    TASK_QUEUE_2_DURING_CAPTURE,
    TEXT_EL0009,
    TEXT_STREAMS_INSUFFICIENT,
    ConfigError,
    UnreadableLog,
)


SCHEMA_VERSION = 1
NOTHING_FOUND = 0
FAILURES_FOUND = 1

INCIDENT_WINDOW = 40  # lines of one process without a hit that end an incident
MERGE_GAP = 3000  # lines between two incidents beyond which they are separate failures
MAX_INCIDENT_TEXT = 400  # lines of text kept per incident for classification
MAX_INCIDENTS = 20_000
RECENT_LINES = 80  # per-process look-back for "was this during a capture?"
WRAP = 100
EMPTY_LOG_NOTE = "the log is empty (0 lines): nothing to diagnose"


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
