"""The doctor's report: `doctor()` (facts + findings), the text on stdout (`format_report`) and the
``--json`` document (`report_to_json`)."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from ascendgraph.tools.doctor.facts import (
    BROKEN_EXIT,
    DoctorFacts,
    GRAPH_ENV_NAMES,
    GRAPH_ENV_VARS,
    OK_EXIT,
    SCHEMA_VERSION,
    Severity,
    WRAP,
)
from ascendgraph.tools.doctor.probes import collect_facts
from ascendgraph.tools.doctor.rules import Finding, check

__all__ = ["DoctorReport", "doctor", "format_report", "report_to_json"]

# --------------------------------------------------------------------------- report


@dataclass(frozen=True)
class DoctorReport:
    facts: DoctorFacts
    findings: list[Finding] = field(default_factory=list)

    @property
    def broken(self) -> bool:
        return any(f.severity is Severity.BREAKS for f in self.findings)

    @property
    def exit_code(self) -> int:
        return BROKEN_EXIT if self.broken else OK_EXIT

    def count(self, severity: Severity) -> int:
        return sum(1 for f in self.findings if f.severity is severity)


def doctor(env: Optional[Mapping[str, str]] = None, **probes: Any) -> DoctorReport:
    """Collect the facts and check every rule (the Python API behind `ascendgraph doctor`)."""
    facts = collect_facts(env, **probes)
    return DoctorReport(facts=facts, findings=check(facts))


def report_to_json(report: DoctorReport) -> dict[str, Any]:
    """The `doctor --json` document."""
    facts = report.facts
    return {
        "schema_version": SCHEMA_VERSION,
        "python": {
            "version": facts.python_version,
            "implementation": facts.python_implementation,
            "platform": facts.platform,
        },
        "packages": dict(facts.packages),
        "cann": {"version": facts.cann.version, "path": facts.cann.path} if facts.cann else None,
        "cann_searched": list(facts.cann_searched),
        "hdk": {"version": facts.hdk.version, "path": facts.hdk.path} if facts.hdk else None,
        "devices": {
            "npu": {"usable": facts.npu_usable, "reason": facts.npu_reason},
            "sim": {"usable": facts.sim_usable, "reason": facts.sim_reason},
        },
        "soc": facts.soc,
        "environment": {name: facts.env.get(name) for name in GRAPH_ENV_NAMES},
        "cache_dir": facts.cache_dir,
        "stream_budget": facts.stream.as_dict(),
        "findings": [f.as_dict() for f in report.findings],
        "broken": report.broken,
    }


_PACKAGE_LABELS = {
    "torch": "torch",
    "torch_npu": "torch_npu",
    "xlite": "xlite",
    "vllm": "vLLM",
    "vllm_ascend": "vLLM Ascend",
    "ascendgraph": "ascendgraph",
}


def _usable_text(usable: bool, reason: str) -> str:
    if usable:
        return f"usable ({reason})" if reason else "usable"
    return f"not usable: {reason}"


def format_report(report: DoctorReport) -> str:
    """One screen: stack, devices, graph-mode environment, stream budget, findings."""
    facts = report.facts
    width = 30
    lines = ["stack"]
    lines.append(f"  {'Python':<{width}}{facts.python_version} ({facts.python_implementation}, {facts.platform})")
    for key, label in _PACKAGE_LABELS.items():
        if key == "torch_npu":
            lines.append(f"  {label:<{width}}{facts.packages.get(key) or 'not installed'}")
            if facts.cann:
                lines.append(f"  {'CANN toolkit':<{width}}{facts.cann.version} ({facts.cann.path})")
            else:
                lines.append(f"  {'CANN toolkit':<{width}}not found (ASCEND_HOME_PATH unset or empty; "
                             f"looked in {len(facts.cann_searched)} places)")
            hdk = f"{facts.hdk.version} ({facts.hdk.path})" if facts.hdk else "not found"
            lines.append(f"  {'HDK driver':<{width}}{hdk}")
            continue
        lines.append(f"  {label:<{width}}{facts.packages.get(key) or 'not installed'}")
    lines += ["", "devices"]
    lines.append(f"  {'--device npu':<{width}}{_usable_text(facts.npu_usable, facts.npu_reason)}")
    lines.append(f"  {'SoC':<{width}}{facts.soc or ('unknown' if facts.npu_usable else 'none visible')}")
    lines.append(f"  {'--device sim':<{width}}{_usable_text(facts.sim_usable, facts.sim_reason)}")
    lines += ["", "environment (graph mode)"]
    for name, _ in GRAPH_ENV_VARS:
        value = facts.env.get(name)
        shown = "unset" if value is None else repr(value)
        lines.append(f"  {name:<{width}}{shown}")
    check_ = facts.stream
    lines += ["", f"stream budget (reference: {check_.reference.describe()})"]
    for mode, fit in (("FFTS+", check_.fit_ffts), ("AIV", check_.fit_aiv)):
        marker = "   <- this environment" if mode == check_.current_mode else ""
        lines.append(f"  {mode:<{width}}{fit} of {check_.num_sizes} sizes fit{marker}")
    lines += ["", "findings"]
    if not report.findings:
        lines.append("  none: nothing in this environment breaks or weakens graph mode")
    indent = " " * 10
    for finding in report.findings:
        value = "unset" if finding.value is None else repr(finding.value)
        lines.append(f"  {finding.severity.value.upper():<8}{finding.subject} ({value})")
        lines.append(textwrap.fill(finding.message, WRAP, initial_indent=indent, subsequent_indent=indent))
        lines.append(textwrap.fill(f"fix: {finding.fix}", WRAP, initial_indent=indent, subsequent_indent=indent + "     "))
    lines += [
        "",
        f"{report.count(Severity.BREAKS)} breaking, {report.count(Severity.WEAKENS)} weakening, "
        f"{report.count(Severity.NOTE)} notes"
        + (" — graph mode cannot work in this environment" if report.broken else ""),
    ]
    return "\n".join(lines)
