"""`ascendgraph diagnose`: find graph-capture failures in a vLLM / vLLM Ascend log.

Theory of operation. The log is read once, line by line (any size, any encoding: bytes
that are not UTF-8 become U+FFFD; an input whose first 64 KiB are mostly binary — control
bytes, or bytes that are no text in any encoding — is refused as "not a text log"). Each line loses its decorations — ANSI colours, vLLM's
``(Worker_TP3 pid=123)`` process tags and its ``ERROR 04-20 21:27:00 [file.py:12]``
prefix — and what is left is matched against `LINE_SIGNATURES`, a table of the texts
that mark a capture failure (docs/semantics.md §8 and the texts in `ascendgraph.errors`).

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
docs/semantics.md §9 is printed with a smaller size list that fits.

Modules: `classes` (failure classes, line signatures, line anatomy), `logconfig` (the
configuration a log prints), `incidents` (classification), `diagnosis` (a whole log),
`reading` (bounded streaming input), `formatting` (text and JSON). The command line is
`ascendgraph.cli.diagnose`.
"""

from __future__ import annotations

from ascendgraph.tools.diagnose.classes import (
    EMPTY_LOG_NOTE,
    FAILURE_CLASSES,
    LINE_SIGNATURES,
    FailureClass,
    UnreadableLog,
)
from ascendgraph.tools.diagnose.diagnosis import Diagnosis, diagnose_lines
from ascendgraph.tools.diagnose.formatting import diagnosis_to_json, format_diagnosis
from ascendgraph.tools.diagnose.incidents import Failure
from ascendgraph.tools.diagnose.logconfig import LogConfig
from ascendgraph.tools.diagnose.reading import binary_share, diagnose_file

__all__ = [
    "FailureClass",
    "FAILURE_CLASSES",
    "LINE_SIGNATURES",
    "Failure",
    "LogConfig",
    "Diagnosis",
    "UnreadableLog",
    "EMPTY_LOG_NOTE",
    "binary_share",
    "diagnose_lines",
    "diagnose_file",
    "diagnosis_to_json",
    "format_diagnosis",
]
