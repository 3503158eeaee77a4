"""The doctor's rules: a data table (`RULES`) of subject, predicate, severity, message and fix,
checked against the facts (`check`). Rules never look at the process: facts are arguments."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from ascendgraph.errors import LAUNCH_BLOCKING_MESSAGE, TASK_QUEUE_2_DURING_CAPTURE
from ascendgraph.sizes import HCCL_EXPANSION_MODES
from ascendgraph.tools.doctor.facts import (
    DEFAULT_CACHE_DIR,
    DoctorFacts,
    HDK_SUBJECT,
    MIN_HDK,
    STREAM_SUBJECT,
    Severity,
)
from ascendgraph.tools.doctor.probes import parse_version_numbers

__all__ = ["Finding", "RULES", "Rule", "check", "malformed_alloc_entries"]

# --------------------------------------------------------------------------- rules


@dataclass(frozen=True)
class Rule:
    """One check: when ``applies(value, facts)`` holds, report ``message`` with ``fix``.

    ``message`` and ``fix`` are format strings; they may use {value} and the stream
    numbers {fit_ffts}, {fit_aiv}, {num_sizes}, {reference}, {current_mode}, and
    {cache_dir}, {cache_dir_problem}.
    """

    name: str
    subject: str
    severity: Severity
    applies: Callable[[Optional[str], DoctorFacts], bool]
    message: str
    fix: str


@dataclass(frozen=True)
class Finding:
    rule: str
    subject: str
    value: Optional[str]
    severity: Severity
    message: str
    fix: str

    def as_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "subject": self.subject,
            "value": self.value,
            "severity": self.severity.value,
            "message": self.message,
            "fix": self.fix,
        }


def _stripped(value: Optional[str]) -> Optional[str]:
    return None if value is None else value.strip()


def _launch_blocking_on(value: Optional[str], facts: DoctorFacts) -> bool:
    return _stripped(value) == "1"


def _launch_blocking_unusual(value: Optional[str], facts: DoctorFacts) -> bool:
    return value is not None and _stripped(value) not in ("", "0", "1")


def _task_queue_2(value: Optional[str], facts: DoctorFacts) -> bool:
    return _stripped(value) == "2"


def _task_queue_off(value: Optional[str], facts: DoctorFacts) -> bool:
    return _stripped(value) == "0"


def _task_queue_invalid(value: Optional[str], facts: DoctorFacts) -> bool:
    return value is not None and _stripped(value) not in ("0", "1", "2")


def _hccl_not_aiv_costs_sizes(value: Optional[str], facts: DoctorFacts) -> bool:
    # Only worth a warning when the sizes do not all fit and AIV would fit more of them.
    check = facts.stream
    if _hccl_unknown(value, facts):
        return False  # hccl_unknown_mode already names this variable and its fix
    return check.current_mode != "AIV" and check.fit_ffts < check.num_sizes and check.fit_aiv > check.fit_ffts


def _no_size_fits(value: Optional[str], facts: DoctorFacts) -> bool:
    return facts.stream.num_sizes > 0 and facts.stream.fit_current == 0


def _hccl_unknown(value: Optional[str], facts: DoctorFacts) -> bool:
    text = _stripped(value)
    return bool(text) and text.upper() not in HCCL_EXPANSION_MODES  # type: ignore[union-attr]  # bool(text) guards None


def _alloc_conf_malformed(value: Optional[str], facts: DoctorFacts) -> bool:
    return bool(malformed_alloc_entries(value))


def malformed_alloc_entries(value: Optional[str]) -> list[str]:
    """Entries of PYTORCH_NPU_ALLOC_CONF that are not ``key:value``."""
    if not value or not value.strip():
        return []
    bad = []
    for entry in value.split(","):
        key, sep, setting = entry.partition(":")
        if not sep or not key.strip() or not setting.strip():
            bad.append(entry.strip())
    return bad


def _autoload_breaks_import(value: Optional[str], facts: DoctorFacts) -> bool:
    # torch auto-loads device backends when the variable is unset or exactly "1".
    autoload = value is None or value == "1"
    return autoload and facts.torch_npu_installed and not facts.cann_found


def _autoload_off_with_torch_npu(value: Optional[str], facts: DoctorFacts) -> bool:
    return value is not None and value != "1" and facts.torch_npu_installed


def _compile_disabled(value: Optional[str], facts: DoctorFacts) -> bool:
    return value == "1"  # torch/_dynamo/config.py: disable = os.environ.get("TORCH_COMPILE_DISABLE", "0") == "1"


def _cache_dir_problem(value: Optional[str], facts: DoctorFacts) -> bool:
    return facts.cache_dir_problem is not None


def _hdk_too_old(value: Optional[str], facts: DoctorFacts) -> bool:
    parsed = parse_version_numbers(value)
    return parsed is not None and parsed < MIN_HDK


RULES: tuple[Rule, ...] = (
    Rule(
        "launch_blocking_on", "ASCEND_LAUNCH_BLOCKING", Severity.BREAKS, _launch_blocking_on,
        "graph mode refuses to start with this value: " + LAUNCH_BLOCKING_MESSAGE,
        "unset ASCEND_LAUNCH_BLOCKING (or export ASCEND_LAUNCH_BLOCKING=0)",
    ),
    Rule(
        "launch_blocking_unusual", "ASCEND_LAUNCH_BLOCKING", Severity.NOTE, _launch_blocking_unusual,
        "only the value 1 turns blocking launches on; {value!r} leaves them off",
        "unset ASCEND_LAUNCH_BLOCKING, or set it to 0 or 1",
    ),
    Rule(
        "task_queue_2", "TASK_QUEUE_ENABLE", Severity.BREAKS, _task_queue_2,
        "torch_npu refuses to capture graphs with this value: " + TASK_QUEUE_2_DURING_CAPTURE,
        "export TASK_QUEUE_ENABLE=1",
    ),
    Rule(
        "task_queue_off", "TASK_QUEUE_ENABLE", Severity.WEAKENS, _task_queue_off,
        "the launch queue is off: everything outside a graph (the eager attention between piecewise "
        "graphs, eager fallbacks, the update stream of FULL graphs) launches synchronously from the host",
        "export TASK_QUEUE_ENABLE=1 unless you are debugging",
    ),
    Rule(
        "task_queue_invalid", "TASK_QUEUE_ENABLE", Severity.BREAKS, _task_queue_invalid,
        "torch_npu accepts only 0, 1 or 2 here and checks it at start-up; {value!r} is none of them",
        "export TASK_QUEUE_ENABLE=1",
    ),
    Rule(
        "hccl_unknown_mode", "HCCL_OP_EXPANSION_MODE", Severity.WEAKENS, _hccl_unknown,
        "HCCL knows AI_CPU, AIV, HOST and HOST_TS; with {value!r} it falls back to its default expansion "
        "(not AIV)",
        "export HCCL_OP_EXPANSION_MODE=AIV",
    ),
    Rule(
        "no_size_fits", STREAM_SUBJECT, Severity.BREAKS, _no_size_fits,
        "with {value} streams not even one of the reference config's {num_sizes} capture sizes fits "
        "({current_mode} expansion): every capture fails with 207008",
        "raise the stream budget (--stream-limit is the stack's limit, normally 1800), export "
        "HCCL_OP_EXPANSION_MODE=AIV, or plan fewer layers / a FULL mode with `ascendgraph plan`",
    ),
    Rule(
        "hccl_not_aiv", "HCCL_OP_EXPANSION_MODE", Severity.WEAKENS, _hccl_not_aiv_costs_sizes,
        "collectives expand with {current_mode}, which costs extra streams per communication group: for the "
        "reference config only {fit_ffts} of {num_sizes} capture sizes fit the stream budget, "
        "{fit_aiv} with AIV",
        "export HCCL_OP_EXPANSION_MODE=AIV (A2/A3 inference), or capture fewer sizes "
        "(`ascendgraph plan` shows which)",
    ),
    Rule(
        "alloc_conf_malformed", "PYTORCH_NPU_ALLOC_CONF", Severity.WEAKENS, _alloc_conf_malformed,
        "entries must be key:value separated by commas; torch_npu's allocator rejects or ignores {bad_entries}",
        "write it as key:value pairs, e.g. PYTORCH_NPU_ALLOC_CONF=expandable_segments:True",
    ),
    Rule(
        "autoload_without_cann", "TORCH_DEVICE_BACKEND_AUTOLOAD", Severity.BREAKS, _autoload_breaks_import,
        "torch_npu is installed but no CANN toolkit was found, and torch auto-loads torch_npu: `import torch` "
        "itself fails here (\"Failed to load the backend extension: torch_npu\")",
        "source the CANN set_env.sh (e.g. /usr/local/Ascend/ascend-toolkit/set_env.sh), or export "
        "TORCH_DEVICE_BACKEND_AUTOLOAD=0 to use torch (and the simulator) without the NPU",
    ),
    Rule(
        "autoload_off", "TORCH_DEVICE_BACKEND_AUTOLOAD", Severity.NOTE, _autoload_off_with_torch_npu,
        "torch does not import torch_npu by itself ({value!r}); `torch.npu` exists only after an explicit "
        "`import torch_npu` (ascendgraph's npu backend does that)",
        "nothing to do for ascendgraph; unset it if other tools expect `torch.npu` after `import torch`",
    ),
    Rule(
        "compile_disabled", "TORCH_COMPILE_DISABLE", Severity.BREAKS, _compile_disabled,
        "torch.compile is switched off for the whole process: no graph is compiled, so every graph-mode run "
        "(ascendgraph run, vLLM with cudagraph_mode other than NONE) fails or serves nothing from graphs",
        "unset TORCH_COMPILE_DISABLE (or use --enforce-eager to run eagerly on purpose)",
    ),
    Rule(
        "cache_dir_unusable", "ASCENDGRAPH_CACHE_DIR", Severity.WEAKENS, _cache_dir_problem,
        "the cache {cache_dir} is unusable ({cache_dir_problem}): static-kernel builds and the parity "
        "environment are rebuilt on every run",
        "point ASCENDGRAPH_CACHE_DIR at a writable directory, or unset it (default " + DEFAULT_CACHE_DIR + ")",
    ),
    Rule(
        "hdk_too_old", HDK_SUBJECT, Severity.WEAKENS, _hdk_too_old,
        "HDK {value} is older than 25.5.1: capture on this stack fails with `Alloc sq cq fail` long before "
        "the stream budget is used up",
        "upgrade the Ascend HDK (driver and firmware) to 25.5.1 or later and use the matching CANN",
    ),
)


def _template_fields(facts: DoctorFacts, value: Optional[str]) -> dict[str, Any]:
    check = facts.stream
    return {
        "value": value,
        "fit_ffts": check.fit_ffts,
        "fit_aiv": check.fit_aiv,
        "num_sizes": check.num_sizes,
        "reference": check.reference.describe(),
        "current_mode": check.current_mode,
        "cache_dir": facts.cache_dir,
        "cache_dir_problem": facts.cache_dir_problem,
        "bad_entries": ", ".join(repr(e) for e in malformed_alloc_entries(facts.env.get("PYTORCH_NPU_ALLOC_CONF"))),
    }


def check(facts: DoctorFacts, rules: Sequence[Rule] = RULES) -> list[Finding]:
    """Every rule that applies to the facts, in table order."""
    findings = []
    for rule in rules:
        value = facts.value(rule.subject)
        if rule.applies(value, facts):
            fields = _template_fields(facts, value)
            findings.append(
                Finding(
                    rule=rule.name,
                    subject=rule.subject,
                    value=value,
                    severity=rule.severity,
                    message=rule.message.format(**fields),
                    fix=rule.fix.format(**fields),
                )
            )
    return findings
