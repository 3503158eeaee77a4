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
"""

from __future__ import annotations

import enum
import glob
import os
import platform
import re
import textwrap
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Mapping, Optional, Sequence

from ascendgraph.errors import LAUNCH_BLOCKING_MESSAGE, TASK_QUEUE_2_DURING_CAPTURE
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import (
    DEFAULT_MAX_STREAMS,
    HCCL_EXPANSION_MODES,
    ascend_default_max_capture_size,
    compute_capture_sizes,
    plan_stream_budget,
)

__all__ = [
    "Severity",
    "Rule",
    "Finding",
    "StreamCheck",
    "ReferenceConfig",
    "DoctorFacts",
    "DoctorReport",
    "GRAPH_ENV_VARS",
    "RULES",
    "collect_facts",
    "check",
    "doctor",
    "report_to_json",
    "format_report",
]

SCHEMA_VERSION = 1
OK_EXIT = 0
BROKEN_EXIT = 1

# HDK 25.5.1 is the first stack without the `Alloc sq cq fail` capture failure (SEMANTICS §8).
MIN_HDK = (25, 5, 1)
DEFAULT_CACHE_DIR = "~/.cache/ascendgraph"
DEFAULT_ASCEND_ROOTS = ("/usr/local/Ascend", "~/Ascend")
WRAP = 110


class Severity(str, enum.Enum):
    BREAKS = "breaks"
    WEAKENS = "weakens"
    NOTE = "note"

    def __str__(self) -> str:
        return self.value


# Every environment variable that changes graph mode, and what it does (the doctor lists
# all of them, set or not).
GRAPH_ENV_VARS: tuple[tuple[str, str], ...] = (
    ("HCCL_OP_EXPANSION_MODE", "where HCCL expands collectives (AIV, AI_CPU, HOST, HOST_TS); sets the streams each graph costs"),
    ("ASCEND_LAUNCH_BLOCKING", "synchronous kernel launches for debugging; 1 is incompatible with graph mode"),
    ("TASK_QUEUE_ENABLE", "torch_npu's asynchronous launch queue (0 off, 1 on, 2 on + extra optimisation)"),
    ("PYTORCH_NPU_ALLOC_CONF", "torch_npu caching-allocator options; the graph memory pool comes from this allocator"),
    ("TORCH_DEVICE_BACKEND_AUTOLOAD", "whether `import torch` also imports torch_npu (torch: only \"1\" or unset loads it)"),
    ("ASCENDGRAPH_CACHE_DIR", f"ascendgraph's cache: static-kernel builds, the parity environment (default {DEFAULT_CACHE_DIR})"),
)
GRAPH_ENV_NAMES = tuple(name for name, _ in GRAPH_ENV_VARS)
HDK_SUBJECT = "HDK driver"
STREAM_SUBJECT = "stream budget"


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class ReferenceConfig:
    """The configuration the stream-budget check plans for (vLLM Ascend defaults on a 0.6B model)."""

    num_hidden_layers: int = 28
    tensor_parallel_size: int = 2
    data_parallel_size: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    mode: GraphMode = GraphMode.FULL_AND_PIECEWISE
    stream_limit: int = DEFAULT_MAX_STREAMS

    def describe(self) -> str:
        return (
            f"{self.num_hidden_layers} layers, {self.mode.name}, tp={self.tensor_parallel_size}, "
            f"dp={self.data_parallel_size}, default capture sizes for max_num_seqs={self.max_num_seqs}, "
            f"{self.stream_limit} streams"
        )


@dataclass(frozen=True)
class StreamCheck:
    """How many of the reference config's capture sizes fit the stream budget, per expansion mode."""

    reference: ReferenceConfig
    num_sizes: int
    current_mode: str  # the expansion mode the environment selects ("AIV" or "FFTS+")
    fit_ffts: int
    fit_aiv: int
    sizes_ffts: list[int]
    sizes_aiv: list[int]

    @property
    def fit_current(self) -> int:
        return self.fit_aiv if self.current_mode == "AIV" else self.fit_ffts

    def as_dict(self) -> dict[str, Any]:
        ref = self.reference
        return {
            "reference": {
                "num_hidden_layers": ref.num_hidden_layers,
                "tensor_parallel_size": ref.tensor_parallel_size,
                "data_parallel_size": ref.data_parallel_size,
                "max_num_seqs": ref.max_num_seqs,
                "max_num_batched_tokens": ref.max_num_batched_tokens,
                "cudagraph_mode": ref.mode.name,
                "stream_limit": ref.stream_limit,
            },
            "num_sizes": self.num_sizes,
            "expansion_mode": self.current_mode,
            "fit_current": self.fit_current,
            "fit_ffts": self.fit_ffts,
            "fit_aiv": self.fit_aiv,
        }


def stream_check(reference: ReferenceConfig, hccl_op_expansion_mode: Optional[str]) -> StreamCheck:
    """Plan the reference config's default sizes with FFTS+ and with AIV (SEMANTICS §9)."""
    sizes = compute_capture_sizes(
        max_num_seqs=reference.max_num_seqs,
        max_num_batched_tokens=reference.max_num_batched_tokens,
        max_capture_size=ascend_default_max_capture_size(reference.max_num_seqs),
    ).sizes

    def plan(expansion: Optional[str]):  # type: ignore[no-untyped-def]
        return plan_stream_budget(
            num_hidden_layers=reference.num_hidden_layers,
            capture_sizes=sizes,
            mode=reference.mode,
            tensor_parallel_size=reference.tensor_parallel_size,
            data_parallel_size=reference.data_parallel_size,
            hccl_op_expansion_mode=expansion,
            max_streams=reference.stream_limit,
        )

    ffts, aiv = plan(None), plan("AIV")
    current = "AIV" if (hccl_op_expansion_mode or "").strip().upper() == "AIV" else "FFTS+"
    return StreamCheck(
        reference=reference,
        num_sizes=len(sizes),
        current_mode=current,
        fit_ffts=min(ffts.max_num_sizes, len(sizes)),
        fit_aiv=min(aiv.max_num_sizes, len(sizes)),
        sizes_ffts=list(ffts.sizes),
        sizes_aiv=list(aiv.sizes),
    )


@dataclass(frozen=True)
class InstalledVersion:
    version: str
    path: str


@dataclass(frozen=True)
class DoctorFacts:
    """Everything the rules may look at. Built by `collect_facts`; tests build it directly."""

    env: Mapping[str, str]
    python_version: str
    python_implementation: str
    platform: str
    packages: Mapping[str, Optional[str]]
    cann: Optional[InstalledVersion]
    cann_searched: tuple[str, ...]
    hdk: Optional[InstalledVersion]
    npu_usable: bool
    npu_reason: str
    sim_usable: bool
    sim_reason: str
    soc: Optional[str]
    stream: StreamCheck
    cache_dir: str
    cache_dir_problem: Optional[str]

    def value(self, subject: str) -> Optional[str]:
        """The value a rule's subject has: an environment variable, or the HDK version."""
        if subject == HDK_SUBJECT:
            return self.hdk.version if self.hdk else None
        if subject == STREAM_SUBJECT:
            return str(self.stream.reference.stream_limit)
        return self.env.get(subject)

    @property
    def torch_npu_installed(self) -> bool:
        return self.packages.get("torch_npu") is not None

    @property
    def cann_found(self) -> bool:
        return self.cann is not None


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
    return bool(text) and text.upper() not in HCCL_EXPANSION_MODES  # type: ignore[union-attr]


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


# --------------------------------------------------------------------------- probes

# Distribution names to report, and the names they may be published under.
PACKAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("torch_npu", ("torch-npu", "torch_npu")),
    ("xlite", ("xlite",)),
    ("vllm", ("vllm",)),
    ("vllm_ascend", ("vllm-ascend", "vllm_ascend")),
    ("ascendgraph", ("ascendgraph",)),
)


def package_version(distribution: str) -> Optional[str]:
    """Installed version from distribution metadata (never imports the package)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken metadata directory is "not installed" for our purposes
        return None


def parse_version_numbers(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """Leading numeric components: "25.5.1" -> (25, 5, 1), "24.1.rc2" -> (24, 1); None if none."""
    if not text:
        return None
    numbers = []
    for part in re.split(r"[.\-_]", text.strip()):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers) or None


def _read_key(path: str, keys: Sequence[str]) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                key, sep, value = line.partition("=")
                if sep and key.strip().lower() in keys:
                    return value.strip().strip("\"'") or None
    except OSError:
        return None
    return None


def cann_candidates(env: Mapping[str, str], ascend_roots: Sequence[str]) -> list[str]:
    """Where a CANN toolkit may live: the set_env.sh variables first, then the default installs."""
    candidates = [env[name] for name in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if env.get(name)]
    for root in ascend_roots:
        root = os.path.expanduser(root)
        candidates += [
            os.path.join(root, "ascend-toolkit", "latest"),
            os.path.join(root, "cann"),
            os.path.join(root, "nnae", "latest"),
        ]
    unique: list[str] = []
    for path in candidates:
        if path not in unique:
            unique.append(path)
    return unique


def find_cann(env: Mapping[str, str], ascend_roots: Sequence[str]) -> tuple[Optional[InstalledVersion], list[str]]:
    """The first CANN install found (its ``ascend_*_install.info`` version) and the places searched."""
    searched = cann_candidates(env, ascend_roots)
    for home in searched:
        if not os.path.isdir(home):
            continue
        infos = sorted(glob.glob(os.path.join(home, "ascend_*_install.info")))
        infos += sorted(glob.glob(os.path.join(home, "*-linux", "ascend_*_install.info")))
        for info in infos:
            version = _read_key(info, ("version",))
            if version:
                return InstalledVersion(version=version, path=os.path.realpath(home)), searched
        return InstalledVersion(version="unknown (no install.info)", path=os.path.realpath(home)), searched
    return None, searched


def find_hdk(ascend_roots: Sequence[str]) -> Optional[InstalledVersion]:
    """The HDK (driver) version from ``<root>/driver/version.info``."""
    for root in ascend_roots:
        info = os.path.join(os.path.expanduser(root), "driver", "version.info")
        if os.path.isfile(info):
            version = _read_key(info, ("version",))
            return InstalledVersion(version=version or "unknown", path=info)
    return None


def cache_dir_status(env: Mapping[str, str]) -> tuple[str, Optional[str]]:
    """(cache directory, problem or None). A directory that does not exist yet is fine if creatable."""
    path = os.path.expanduser(env.get("ASCENDGRAPH_CACHE_DIR") or DEFAULT_CACHE_DIR)
    if os.path.exists(path):
        if not os.path.isdir(path):
            return path, "it exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return path, "not writable"
        return path, None
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        next_parent = os.path.dirname(parent)
        if next_parent == parent:
            break
        parent = next_parent
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        return path, f"it does not exist and {parent} is not writable"
    return path, None


def _availability(name: str) -> tuple[bool, str]:
    from ascendgraph.device import backend_availability

    try:
        return backend_availability(name)
    except Exception as exc:  # an unknown name (no entry point) is "unusable", with the reason
        return False, f"{type(exc).__name__}: {exc}"


def _probe_soc() -> Optional[str]:
    """The SoC of the visible NPU, through the device layer only (called when npu is usable)."""
    from ascendgraph.device import get_device

    try:
        device = get_device("npu")
    except Exception:
        return None
    profile = getattr(device, "profile", None)
    soc = getattr(profile, "soc", None)
    name = getattr(profile, "name", None)
    if soc and name and name != soc:
        return f"{soc} ({name})"
    return soc or name


def collect_facts(
    env: Optional[Mapping[str, str]] = None,
    *,
    reference: ReferenceConfig = ReferenceConfig(),
    ascend_roots: Sequence[str] = DEFAULT_ASCEND_ROOTS,
    package_version: Callable[[str], Optional[str]] = package_version,
    availability: Callable[[str], tuple[bool, str]] = _availability,
    soc_probe: Callable[[], Optional[str]] = _probe_soc,
) -> DoctorFacts:
    """Gather the facts (every probe is injectable; ``env`` defaults to the process environment)."""
    if env is None:
        # Report the user's own autoload setting, not the default ascendgraph set on import.
        import ascendgraph

        environment: dict[str, str] = dict(os.environ)
        original = ascendgraph.ORIGINAL_TORCH_DEVICE_BACKEND_AUTOLOAD
        if original is None:
            environment.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        else:
            environment["TORCH_DEVICE_BACKEND_AUTOLOAD"] = original
    else:
        environment = dict(env)
    packages: dict[str, Optional[str]] = {}
    for label, names in PACKAGES:
        packages[label] = next((v for v in map(package_version, names) if v is not None), None)
    cann, searched = find_cann(environment, ascend_roots)
    npu_usable, npu_reason = availability("npu")
    sim_usable, sim_reason = availability("sim")
    cache_dir, cache_problem = cache_dir_status(environment)
    return DoctorFacts(
        env=environment,
        python_version=platform.python_version(),
        python_implementation=platform.python_implementation(),
        platform=f"{platform.system()} {platform.machine()}",
        packages=packages,
        cann=cann,
        cann_searched=tuple(searched),
        hdk=find_hdk(ascend_roots),
        npu_usable=npu_usable,
        npu_reason=npu_reason,
        sim_usable=sim_usable,
        sim_reason=sim_reason,
        soc=soc_probe() if npu_usable else None,
        stream=stream_check(reference, environment.get("HCCL_OP_EXPANSION_MODE")),
        cache_dir=cache_dir,
        cache_dir_problem=cache_problem,
    )


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
