"""The run report: what `ascendgraph run` (and `ascendgraph.runtime.engine.run`) returns and prints.

`Report` holds the figures of one run; `to_json()` is the ``--json`` document (the field
names of the engine issue, plus ``schema_version`` and a few descriptive keys), and
`format_text()` the readable summary printed on stderr. Later features add their own
figures through ``extensions`` (merged into the JSON document and listed in the text),
e.g. ``batches_by_route`` (xlite), ``fused_ops`` / ``kernels_per_step`` (npugraph_ex).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from ascendgraph.errors import OOM_DURING_CAPTURE_GUIDANCE  # what `diagnose` says for it
from ascendgraph.explanation import count_noun

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.device import Device

__all__ = ["Report", "SCHEMA_VERSION", "RUNTIME_MODE_KEYS", "MISMATCH_CAUSES_GRAPH", "MISMATCH_CAUSES_EAGER",
           "failure_notes"]

SCHEMA_VERSION = 1
RUNTIME_MODE_KEYS = ("NONE", "PIECEWISE", "FULL")


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _sizes_text(sizes: list[int], limit: int = 8, *, counted: bool = True) -> str:
    if len(sizes) <= limit:
        return str(sizes)
    head = ", ".join(str(s) for s in sizes[: limit - 2])
    text = f"[{head}, ..., {sizes[-2]}, {sizes[-1]}]"
    return f"{text} ({len(sizes)} sizes)" if counted else text


@dataclass
class Report:
    """Figures of one engine run. ``error`` is None or {"type", "message"}."""

    requested_mode: str
    effective_mode: str
    decisions: list[dict[str, str]]
    capture_sizes: list[int]
    graphs_captured: int = 0
    streams_used: int = 0
    stream_limit: int = 0
    pool_bytes: int = 0
    capture_seconds: float = 0.0
    requests_completed: int = 0
    requests_failed: int = 0
    batches_by_mode: dict[str, int] = field(default_factory=lambda: {k: 0 for k in RUNTIME_MODE_KEYS})
    padding_waste: float = 0.0
    max_abs_diff_vs_eager: float = 0.0
    simulated_time_us: dict[str, Optional[float]] = field(default_factory=lambda: {"graph": None, "eager": None})
    error: Optional[dict[str, str]] = None
    # descriptive
    device: str = ""
    model: str = ""
    architecture: str = ""
    num_layers: int = 0
    attention_backend: str = ""
    dtype: str = "float32"
    atol: float = 0.0
    compile_seconds: float = 0.0
    steps: int = 0
    requests_total: int = 0
    warnings: list[str] = field(default_factory=list)
    capture_fallback: Optional[dict[str, str]] = None
    # Report honesty (docs/decisions.md "Report honesty"): what happened, and only that.
    graphs_captured_before_failure: Optional[int] = None  # a capture failed after this many graphs
    eager_checked_steps: Optional[int] = None  # steps compared with eager (0: nothing was checked)
    requested_mode_is_default: bool = False  # cudagraph_mode not set: the requested mode is the level's default
    notes: list[str] = field(default_factory=list)  # hints for the reader (text only)
    extensions: dict[str, Any] = field(default_factory=dict)
    # not serialised: the exception behind ``error`` (the CLI shows its traceback with --debug)
    exception: Optional[BaseException] = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when every request completed, nothing failed and every figure is finite (a run
        whose simulated time or difference is NaN/inf is not "OK", whatever the requests did)."""
        return self.error is None and self.requests_failed == 0 and not self.non_finite_figures()

    def non_finite_figures(self) -> list[str]:
        """The report's figures that are not finite numbers (names), for the result line."""
        figures = {f"simulated_time_us.{k}": v for k, v in self.simulated_time_us.items()}
        figures["capture_seconds"], figures["compile_seconds"] = self.capture_seconds, self.compile_seconds
        if self.eager_checked and self.max_abs_diff_vs_eager is not None:
            figures["max_abs_diff_vs_eager"] = self.max_abs_diff_vs_eager
        return [name for name, value in figures.items()
                if isinstance(value, float) and not math.isfinite(value)]

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    @property
    def eager_checked(self) -> bool:
        """Whether any step was compared with eager (False: "not checked", never "0")."""
        return self.eager_checked_steps is None or self.eager_checked_steps > 0

    @property
    def graph_batches(self) -> int:
        """Batches served by replaying a graph (ACL graph modes, or XliteGraph)."""
        acl = sum(int(self.batches_by_mode.get(k, 0)) for k in RUNTIME_MODE_KEYS if k != "NONE")
        routes = self.extensions.get("batches_by_route")
        xlite = int(routes.get("xlite", 0)) if isinstance(routes, dict) and "xlite" in self.extensions else 0
        return acl + xlite

    @property
    def served_label(self) -> str:
        """What served the batches: "graph path" only when a graph was replayed."""
        return "graph path" if self.graph_batches else "served eagerly"

    def settle_after_release(self, device: "Device") -> None:
        """Take the resource figures again once the engine released what a failed capture held,
        so the report says what ``device`` holds now, not what it held before the release (a
        lost device answers nothing: the figures stay as they were)."""
        if self.graphs_captured_before_failure is None:
            return
        try:
            held = device.stats()
        except Exception:  # noqa: BLE001 - a lost device refuses every call
            return
        self.graphs_captured = int(getattr(held, "graphs_alive", 0))
        self.streams_used = int(getattr(held, "streams_in_use", 0))
        self.pool_bytes = int(getattr(held, "pool_bytes", 0))

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "schema_version": SCHEMA_VERSION,
            "requested_mode": self.requested_mode,
            "effective_mode": self.effective_mode,
            "decisions": [dict(d) for d in self.decisions],
            "capture_sizes": list(self.capture_sizes),
            "graphs_captured": self.graphs_captured,
            "streams_used": self.streams_used,
            "stream_limit": self.stream_limit,
            "pool_bytes": self.pool_bytes,
            "capture_seconds": round(self.capture_seconds, 6),
            "requests_completed": self.requests_completed,
            "requests_failed": self.requests_failed,
            "batches_by_mode": {k: int(self.batches_by_mode.get(k, 0)) for k in RUNTIME_MODE_KEYS},
            "padding_waste": self.padding_waste,
            "max_abs_diff_vs_eager": _finite_or_none(self.max_abs_diff_vs_eager) if self.eager_checked else None,
            "simulated_time_us": dict(self.simulated_time_us),
            "error": dict(self.error) if self.error else None,
            "device": self.device,
            "model": self.model,
            "architecture": self.architecture,
            "num_layers": self.num_layers,
            "attention_backend": self.attention_backend,
            "dtype": self.dtype,
            "atol": self.atol,
            "compile_seconds": round(self.compile_seconds, 6),
            "steps": self.steps,
            "requests_total": self.requests_total,
            "capture_fallback": dict(self.capture_fallback) if self.capture_fallback else None,
            "graphs_captured_before_failure": self.graphs_captured_before_failure,
            "eager_checked_steps": self.eager_checked_steps,
            "warnings": list(self.warnings),
        }
        for key, value in self.extensions.items():
            document.setdefault(key, value)
        return document

    def format_text(self) -> str:
        lines = [
            f"ascendgraph run: {self.model} ({self.architecture}, {count_noun(self.num_layers, 'layer')}), attention "
            f"{self.attention_backend}, {self.dtype}, device {self.device}",
        ]
        lines.append(self._mode_line())
        if self.capture_fallback:
            lines.append(
                f"  fallback   capture failed ({self.capture_fallback['type']}); served eagerly with every graph released"
            )
        lines.extend(self._capture_lines())
        batches = sum(self.batches_by_mode.values())
        by_mode = ", ".join(f"{k} {self.batches_by_mode.get(k, 0)}" for k in RUNTIME_MODE_KEYS)
        lines.append(
            f"  serve      {self.requests_completed}/{self.requests_total} requests completed, "
            f"{self.requests_failed} failed; {batches} batches ({by_mode}); padding waste {self.padding_waste:.1%}"
        )
        lines.append(self._check_line())
        graph_us, eager_us = self.simulated_time_us.get("graph"), self.simulated_time_us.get("eager")
        if graph_us is not None and eager_us is not None and self.steps > 0 and self.eager_checked:
            ratio = f" ({graph_us / eager_us:.2f}x)" if eager_us else ""
            lines.append(
                f"  sim time   {self.served_label} {graph_us / 1000:.2f} ms vs eager reference "
                f"{eager_us / 1000:.2f} ms{ratio}"
            )
        elif graph_us is not None and self.steps > 0:
            lines.append(f"  sim time   {self.served_label} {graph_us / 1000:.2f} ms (no eager reference ran)")
        for key, value in self.extensions.items():
            lines.extend(_extension_lines(key, value, self.extensions, replayed=bool(self.graph_batches)))
        for warning in self.warnings:
            lines.append(f"  warning    {warning}")
        if self.error:
            message = self.error["message"].replace("\n", "\n" + " " * 13)
            lines.append(f"  error      {self.error['type']}: {message}")
        for note in self.notes:
            lines.append(f"  note       {note}")
        odd = self.non_finite_figures()
        if odd:
            lines.append(f"  error      figures that are not finite numbers: {', '.join(odd)}")
        lines.append(f"  result     {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


    def _mode_line(self) -> str:
        changed = [d for d in self.decisions if d.get("rule") in _MODE_RULES]
        eager_forced = [d for d in changed if d.get("rule") == "enforce_eager"]
        if eager_forced and self.requested_mode_is_default:
            # --enforce-eager without a cudagraph_mode: nothing asked for graphs.
            return (f"  mode       {self.effective_mode} (enforce_eager: {eager_forced[-1]['reason']}; the level's "
                    f"default {self.requested_mode} does not apply)")
        requested = "default" if self.requested_mode_is_default else "requested"
        line = f"  mode       {requested} {self.requested_mode} -> effective {self.effective_mode}"
        if changed:
            line += f" ({changed[-1]['reason']})"
        return line

    def _capture_lines(self) -> list[str]:
        before = self.graphs_captured_before_failure
        sizes = _sizes_text(self.capture_sizes, counted=False)
        # never "0 configured sizes []" (an eager fallback clears them): say there were none
        configured = f"{len(self.capture_sizes)} configured sizes {sizes}" if self.capture_sizes else "none"
        count = f"{len(self.capture_sizes)} configured sizes"
        if before is not None:
            return [
                f"  capture    failed after {before} graphs were captured (sizes configured: {configured})",
                f"  resources  held after the release: {self.graphs_captured} graphs, streams "
                f"{self.streams_used}/{self.stream_limit}, graph pool {_mib(self.pool_bytes)}",
            ]
        if self.capture_sizes or self.graphs_captured:
            scope = f"all {count} {sizes}" if self.capture_sizes else "no configured size"
            return [
                f"  capture    {self.graphs_captured} graphs for {scope} in "
                f"{self.capture_seconds:.2f} s (compile {self.compile_seconds:.2f} s)",
                f"  resources  streams {self.streams_used}/{self.stream_limit}, graph pool {_mib(self.pool_bytes)}",
            ]
        return [f"  capture    nothing captured (eager); compile {self.compile_seconds:.2f} s"]

    def _check_line(self) -> str:
        if not self.eager_checked:
            why = "nothing was served" if self.steps == 0 else "the check against eager was off"
            return f"  check      not checked ({why})"
        what = "graph" if self.graph_batches else "served (eager)"
        return f"  check      max |{what} - eager| = {self.max_abs_diff_vs_eager:.3g} (atol {self.atol:g})"


# The likely causes of a NumericalMismatch, by what served the step (docs/semantics.md §7 and
# "Checking against eager").
MISMATCH_CAUSES_GRAPH = (
    "likely causes: stale attention parameters (a FULL graph replayed with the sequence lengths or block "
    "tables of an earlier step: the per-step parameter update was skipped or did not reach the graph, "
    "see StaleGraphParams), or an input written outside the graph's static buffers"
)
MISMATCH_CAUSES_EAGER = (
    "likely causes: the served path and the eager reference ran different kernels (a fused or quantised "
    "op), or a tolerance (atol) too tight for the dtype"
)


def failure_notes(report: "Report") -> list[str]:
    """Notes a failure earns beyond its message: how far capture got, diagnose's guidance for
    an OOM during capture, the likely causes of a numerical mismatch."""
    notes: list[str] = []
    error_type = (report.error or {}).get("type") or (report.capture_fallback or {}).get("type")
    before = report.graphs_captured_before_failure
    if before is not None and not any("captured before the failure" in n for n in report.notes):
        notes.append(f"{before} graphs captured before the failure")
    if error_type == "OutOfMemoryError" and before is not None:
        notes.append(OOM_DURING_CAPTURE_GUIDANCE)
    if error_type == "NumericalMismatch":
        notes.append(MISMATCH_CAUSES_GRAPH if report.graph_batches else MISMATCH_CAUSES_EAGER)
    return notes


_MODE_RULES = {
    "enforce_eager",
    "unsupported_compilation_mode",
    "piecewise_needs_vllm_compile",
    "xlite",
    "pooling_model",
    "encoder_decoder",
    "attention_narrowing",
    "data_parallel_agreement",
    "capture_fallback",
}


def _extension_lines(key: str, value: Any, extensions: dict[str, Any], *, replayed: bool = True) -> list[str]:
    """Text lines of one extension; routing (xlite) has its own wording, others print as-is."""
    if key == "batches_by_route":
        if "xlite" not in extensions:  # xlite off: every batch is native, nothing to say
            return []
        by_route = ", ".join(f"{route} {count}" for route, count in value.items())
        return [f"  {'routes':<10} {by_route}"]
    if key == "xlite" and isinstance(value, dict):
        mode = "full" if value.get("full_mode") else "decode-only"
        line = f"  {'xlite':<10} {mode} mode, token budget {value.get('budget')}"
        if value.get("data_parallel_size", 1) > 1:
            line += f", routed on the max over {value['data_parallel_size']} DP ranks"
        lines = [line]
        profile = value.get("profile_run")
        if profile:
            lines.append(f"  {'':<10} profile run of {profile['num_tokens']} tokens -> {profile['route']} ({profile['reason']})")
        return lines
    if key in _NPUGRAPH_EX_KEYS:
        return _npugraph_ex_lines(key, value, replayed)
    if key == "kernel_fallbacks":  # one warning line each (ascendgraph.runtime.stages.report)
        return []
    return [f"  {key:<10} {value}"]


# npugraph_ex issue: passes, kernel stages and profiles (ascendgraph.runtime.stages.report._npugraph_ex_extensions).
_NPUGRAPH_EX_KEYS = ("fused_ops", "kernels_per_step", "static_kernel", "super_kernel", "profile")


def _npugraph_ex_lines(key: str, value: Any, replayed: bool) -> list[str]:
    if not isinstance(value, dict):
        return [f"  {key:<10} {value}"]
    if key == "fused_ops":
        if not value:
            return []
        fused = ", ".join(f"{name} {count}" for name, count in value.items())
        return [f"  {'fusion':<10} {fused} (matches replaced per pass)"]
    if key == "kernels_per_step":
        if value.get("graph") is None:
            return []
        eager = value.get("eager")
        tail = f" vs eager reference {eager:g}" if eager is not None else ""
        path = "on the graph path" if replayed else "as served (eager)"
        return [f"  {'kernels':<10} {value['graph']:g} per decode step {path}{tail}"]
    if key == "static_kernel":
        how = "reused" if value.get("reused") else "built"
        return [f"  {'static':<10} {value.get('kernels')} static kernels {how} for sizes "
                f"{_sizes_text(list(value.get('sizes') or []))} in {value.get('build_dir')}"]
    if key == "super_kernel":
        return [f"  {'super':<10} {value.get('super_kernels')} super kernels in {value.get('graphs')} FULL graphs"]
    if "torch_npu" in value:
        return [f"  {'profile':<10} {value['torch_npu']}"]
    return [f"  {'profile':<10} {value.get('kernels')} kernels of {value.get('steps')} steps in {value.get('dir')}"]


def _finite_or_none(value: float) -> Optional[float]:
    return value if value == value and value not in (float("inf"), float("-inf")) else None
