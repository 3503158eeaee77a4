"""The run report: what `ascendgraph run` (and `ascendgraph.runtime.engine.run`) returns and prints.

`Report` holds the figures of one run; `to_json()` is the ``--json`` document (the field
names of the engine issue, plus ``schema_version`` and a few descriptive keys), and
`format_text()` the readable summary printed on stderr. Later features add their own
figures through ``extensions`` (merged into the JSON document and listed in the text),
e.g. ``batches_by_route`` (xlite), ``fused_ops`` / ``kernels_per_step`` (npugraph_ex).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["Report", "SCHEMA_VERSION", "RUNTIME_MODE_KEYS"]

SCHEMA_VERSION = 1
RUNTIME_MODE_KEYS = ("NONE", "PIECEWISE", "FULL")


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _sizes_text(sizes: list[int], limit: int = 8) -> str:
    if len(sizes) <= limit:
        return str(sizes)
    head = ", ".join(str(s) for s in sizes[: limit - 2])
    return f"[{head}, ..., {sizes[-2]}, {sizes[-1]}] ({len(sizes)} sizes)"


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
    notes: list[str] = field(default_factory=list)  # hints for the reader (text only)
    extensions: dict[str, Any] = field(default_factory=dict)
    # not serialised: the exception behind ``error`` (the CLI shows its traceback with --debug)
    exception: Optional[BaseException] = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when every request completed and nothing failed."""
        return self.error is None and self.requests_failed == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

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
            "max_abs_diff_vs_eager": _finite_or_none(self.max_abs_diff_vs_eager),
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
            "warnings": list(self.warnings),
        }
        for key, value in self.extensions.items():
            document.setdefault(key, value)
        return document

    def format_text(self) -> str:
        lines = [
            f"ascendgraph run: {self.model} ({self.architecture}, {self.num_layers} layer{'s' if self.num_layers != 1 else ''}), attention "
            f"{self.attention_backend}, {self.dtype}, device {self.device}",
        ]
        mode_line = f"  mode       requested {self.requested_mode} -> effective {self.effective_mode}"
        changed = [d for d in self.decisions if d.get("rule") in _MODE_RULES]
        if changed:
            mode_line += f" ({changed[-1]['reason']})"
        lines.append(mode_line)
        if self.capture_fallback:
            lines.append(
                f"  fallback   capture failed ({self.capture_fallback['type']}); served eagerly with every graph released"
            )
        if self.capture_sizes or self.graphs_captured:
            lines.append(
                f"  capture    {self.graphs_captured} graphs for sizes {_sizes_text(self.capture_sizes)} in "
                f"{self.capture_seconds:.2f} s (compile {self.compile_seconds:.2f} s)"
            )
            lines.append(
                f"  resources  streams {self.streams_used}/{self.stream_limit}, graph pool {_mib(self.pool_bytes)}"
            )
        else:
            lines.append(f"  capture    nothing captured (eager); compile {self.compile_seconds:.2f} s")
        batches = sum(self.batches_by_mode.values())
        by_mode = ", ".join(f"{k} {self.batches_by_mode.get(k, 0)}" for k in RUNTIME_MODE_KEYS)
        lines.append(
            f"  serve      {self.requests_completed}/{self.requests_total} requests completed, "
            f"{self.requests_failed} failed; {batches} batches ({by_mode}); padding waste {self.padding_waste:.1%}"
        )
        lines.append(f"  check      max |graph - eager| = {self.max_abs_diff_vs_eager:.3g} (atol {self.atol:g})")
        graph_us, eager_us = self.simulated_time_us.get("graph"), self.simulated_time_us.get("eager")
        if graph_us is not None and eager_us is not None:
            ratio = f" ({graph_us / eager_us:.2f}x)" if eager_us else ""
            lines.append(
                f"  sim time   graph path {graph_us / 1000:.2f} ms vs eager reference {eager_us / 1000:.2f} ms{ratio}"
            )
        for key, value in self.extensions.items():
            lines.extend(_extension_lines(key, value, self.extensions))
        for warning in self.warnings:
            lines.append(f"  warning    {warning}")
        if self.error:
            message = self.error["message"].replace("\n", "\n" + " " * 13)
            lines.append(f"  error      {self.error['type']}: {message}")
        for note in self.notes:
            lines.append(f"  note       {note}")
        lines.append(f"  result     {'OK' if self.ok else 'FAILED'}")
        return "\n".join(lines)


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


def _extension_lines(key: str, value: Any, extensions: dict[str, Any]) -> list[str]:
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
        return _npugraph_ex_lines(key, value)
    return [f"  {key:<10} {value}"]


# npugraph_ex issue: passes, kernel stages and profiles (ascendgraph.runtime.stages.report._npugraph_ex_extensions).
_NPUGRAPH_EX_KEYS = ("fused_ops", "kernels_per_step", "static_kernel", "super_kernel", "profile")


def _npugraph_ex_lines(key: str, value: Any) -> list[str]:
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
        return [f"  {'kernels':<10} {value['graph']:g} per decode step on the graph path{tail}"]
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
