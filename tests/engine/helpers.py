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
