"""`ascendgraph doctor`: what this machine's stack and environment mean for graph mode.

Theory of operation. `collect_facts` gathers everything without side effects worth
worrying about: package versions come from distribution metadata (torch_npu is never
imported here: on a half-installed machine importing it fails, or worse), the CANN
toolkit and HDK driver versions come from their install files, and whether ``--device
npu`` would work comes from `ascendgraph.device.backend_availability`, the one guarded
path that may touch torch_npu. Then every rule of `RULES` — a data table of (subject,
predicate, severity, message, fix) — is checked against those facts. Rules never look at
the process directly: the environment, the install roots and the probes are arguments,
so tests inject them.

Severities: ``breaks`` (graph mode cannot work with this value), ``weakens`` (it works,
but captures fewer sizes or runs slower), ``note`` (worth knowing). The command exits 1
when something breaks graph mode, else 0 — so ``ascendgraph doctor && vllm serve ...``
stops early on a broken environment.

Modules: `facts` (what is known about a machine, the reference configuration), `rules` (the
`RULES` table and `check`), `probes` (reading the machine: `collect_facts`), `report` (`doctor`,
text and JSON). The command line is `ascendgraph.cli.doctor`.
"""

from __future__ import annotations

from ascendgraph.tools.doctor.facts import (
    GRAPH_ENV_NAMES,
    GRAPH_ENV_VARS,
    HDK_SUBJECT,
    STREAM_SUBJECT,
    DoctorFacts,
    ReferenceConfig,
    Severity,
    StreamCheck,
)
from ascendgraph.tools.doctor.probes import collect_facts, parse_version_numbers
from ascendgraph.tools.doctor.report import DoctorReport, doctor, format_report, report_to_json
from ascendgraph.tools.doctor.rules import RULES, Finding, Rule, check

__all__ = [
    "Severity",
    "Rule",
    "Finding",
    "StreamCheck",
    "ReferenceConfig",
    "DoctorFacts",
    "DoctorReport",
    "GRAPH_ENV_VARS",
    "GRAPH_ENV_NAMES",
    "HDK_SUBJECT",
    "STREAM_SUBJECT",
    "RULES",
    "collect_facts",
    "parse_version_numbers",
    "check",
    "doctor",
    "report_to_json",
    "format_report",
]
