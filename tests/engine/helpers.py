"""Shared helpers of the engine tests: small configurations and a step recorder."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions
from ascendgraph.runtime.stages.records import StepRecord
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.report import Report
from ascendgraph.runtime.workload import WorkloadSpec

LAYERS = 2
SIZES = (1, 2, 4)
# Staggered arrivals and an 8-token budget give prefill, mixed and decode batches, some
# of them larger than the largest capture size (4): every dispatch path is exercised.
WORKLOAD = WorkloadSpec(num_requests=6, seed=0, prompt_words=(3, 9), output_tokens=(3, 6), burst_size=2, burst_gap=3)


def small_config(
    mode: Optional[str] = None,
    *,
    model: str = "tiny",
    backend: Optional[str] = None,
    sizes: Sequence[int] = SIZES,
    max_num_seqs: int = 4,
    max_num_batched_tokens: int = 8,
    num_speculative_tokens: int = 0,
    layers: int = LAYERS,
    **extra: Any,
) -> GraphConfig:
    compilation: dict[str, Any] = {"cudagraph_capture_sizes": list(sizes)}
    if mode is not None:
        compilation["cudagraph_mode"] = mode
    return GraphConfig.from_vllm_args(
        compilation_config=compilation,
        model=model,
        num_layers=layers,
        attention_backend=backend,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        num_speculative_tokens=num_speculative_tokens or None,
        **extra,
    )


@dataclass
class StepLog:
    records: list[StepRecord] = field(default_factory=list)

    def on_step(self, engine: Engine, record: StepRecord) -> None:
        self.records.append(record)


@dataclass
class EngineRun:
    engine: Engine
    report: Report
    steps: list[StepRecord]
    stats_before_capture: Any
    stats_after_capture: Any


def run_engine(config: GraphConfig, *, workload: WorkloadSpec = WORKLOAD, **options: Any) -> EngineRun:
    """Capture and serve on a fresh simulator; the engine's graphs are released afterwards."""
    options.setdefault("device", "sim")
    engine = Engine(config, EngineOptions(workload_spec=workload, progress=False, **options))
    log = StepLog()
    engine.observers.append(log)
    before = engine.device.stats()
    try:
        try:
            engine.capture()
        except RuntimeError as exc:
            engine.error = exc
            engine.scheduler.fail_all("capture failed")
            after = engine.device.stats()
            return EngineRun(engine, engine.report(), log.records, before, after)
        after = engine.device.stats()
        engine.serve()
        return EngineRun(engine, engine.report(), log.records, before, after)
    finally:
        engine.close()


def expected_runtime_mode(mode: GraphMode, *, uniform: bool, num_tokens: int, max_size: int) -> GraphMode:
    """docs/semantics.md §5, written out per mode (q = 1, every decode size captured)."""
    if mode is GraphMode.NONE or num_tokens > max_size:
        return GraphMode.NONE
    table = {
        GraphMode.PIECEWISE: (GraphMode.PIECEWISE, GraphMode.PIECEWISE),
        GraphMode.FULL: (GraphMode.FULL, GraphMode.FULL),
        GraphMode.FULL_DECODE_ONLY: (GraphMode.FULL, GraphMode.NONE),
        GraphMode.FULL_AND_PIECEWISE: (GraphMode.FULL, GraphMode.PIECEWISE),
    }
    decode, mixed = table[mode]
    return decode if uniform else mixed


# --------------------------------------------------------------------------- shared runs
#
# Many engine tests assert different facts about the same run. A shared run is built once
# per worker (pytest-xdist process) and handed to every test that asks for the same
# configuration and options through the `shared_run` fixture (tests/engine/conftest.py).
# The contract: a test given a shared run only READS it (the report, the step records, the
# closed engine's dispatcher and device statistics). It is checked, not trusted: the run's
# fingerprint is taken when it is built and compared after each test that used it, and a
# test that changed it fails by name. A test that needs to observe or change a run (a
# monkeypatched spy, a fault, an option) builds its own with `run_engine`.


def run_fingerprint(run: EngineRun) -> str:
    """A digest of everything a reading test can see of a run."""
    import hashlib
    import json

    engine = run.engine
    seen = {
        "report": json.dumps(run.report.to_json(), sort_keys=True, default=repr),
        "text": run.report.format_text(),
        "steps": [repr(record) for record in run.steps],
        "stats": [repr(run.stats_before_capture), repr(run.stats_after_capture), repr(engine.device.stats())],
        "capture_order": repr(engine.dispatcher.capture_order()),
        "error": repr(engine.error),
    }
    return hashlib.sha256(json.dumps(seen, sort_keys=True).encode()).hexdigest()


@dataclass
class SharedRuns:
    """The shared runs of one worker, keyed by configuration and options, with their fingerprints."""

    runs: dict[str, EngineRun] = field(default_factory=dict)
    fingerprints: dict[str, str] = field(default_factory=dict)
    built: int = 0

    @staticmethod
    def key(config: GraphConfig, options: dict[str, Any]) -> str:
        return repr((config, sorted(options.items()), WORKLOAD))

    def get(self, config: GraphConfig, **options: Any) -> tuple[str, EngineRun]:
        key = self.key(config, options)
        if key not in self.runs:
            self.runs[key] = run_engine(config, **options)
            self.fingerprints[key] = run_fingerprint(self.runs[key])
            self.built += 1
        return key, self.runs[key]

    def changed(self, keys: Sequence[str]) -> list[str]:
        """The keys among ``keys`` whose run no longer has the fingerprint it was built with."""
        return [key for key in keys if run_fingerprint(self.runs[key]) != self.fingerprints[key]]
