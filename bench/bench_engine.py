"""Engine benchmarks on the simulator: capture time, and graph-path / eager CPU time per mode.

1. **Capture time for all default sizes of ``tiny``**: the default configuration (4 layers,
   FULL_AND_PIECEWISE, max_num_seqs 256 -> 35 capture sizes, 35 x 5 piecewise + 35 FULL
   graphs): Dynamo compile time, capture time (warm-ups + captures), graphs, pool bytes.
2. **Replay / eager CPU-time ratio per mode**: one engine per mode serves the same
   decode-heavy workload; every step runs the graph path (dispatch, replay, FULL-graph
   parameter update, synchronise) and, side by side, the eager reference on the same
   batch. The ratio is the graph path's host CPU time over the eager reference's, summed
   over the steps (``time.process_time``, so other processes on the machine do not count);
   the simulated device-time ratio is printed next to it. The process is warmed up first
   (`warm_up_process`): the first custom-op call of a process imports ``torch._dynamo``
   (1-2.5 s), and without the warm-up that one-time cost lands in the first step of
   whichever path runs first — in NONE, where nothing is compiled or captured before
   serving, the graph path (it made NONE's CPU ratio 1.58 instead of about 1).

No assertions: this is a measurement. Run ``python bench/bench_engine.py`` (``--json FILE``
writes the figures; ``--threads N`` sets torch's intra-op threads, default 1).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, Optional

import torch

from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import Engine, EngineOptions, run
from ascendgraph.runtime.stages.records import StepRecord
from ascendgraph.runtime.workload import WorkloadSpec

MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")


class _Steps:
    def __init__(self) -> None:
        self.records: list[StepRecord] = []

    def on_step(self, engine: Engine, record: StepRecord) -> None:
        self.records.append(record)


def warm_up_process(seed: int = 0) -> float:
    """Pay the process's one-time costs before anything is timed: one request through a
    one-layer tiny in mode NONE (lazy imports such as ``torch._dynamo``, first calls of the
    custom ops and of the simulator's dispatch modes). Cheap once done; returns seconds."""
    start = time.perf_counter()
    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": "NONE"}, num_layers=1, max_num_seqs=2, max_num_batched_tokens=16
    )
    run(config, device="sim", requests=1, seed=seed, progress=False)
    return time.perf_counter() - start


def bench_capture(seed: int, config: Optional[GraphConfig] = None) -> dict[str, Any]:
    """Compile and capture cost of ``config`` (default: the default `ascendgraph run`
    configuration, every default size of tiny)."""
    config = config if config is not None else GraphConfig()
    engine = Engine(config, EngineOptions(device="sim", requests=1, seed=seed, progress=False))
    try:
        start, start_cpu = time.perf_counter(), time.process_time()
        engine.compile()
        compile_s, compile_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        start_cpu = time.process_time()
        engine.capture()
        capture_cpu = time.process_time() - start_cpu
        stats = engine.device.stats()
        return {
            "mode": engine.mode.name,
            "capture_sizes": len(engine.resolution.capture_sizes),
            "graphs": engine.capture_state.graphs_captured,
            "compile_seconds": compile_s,
            "capture_seconds": engine.capture_seconds,
            "compile_cpu_seconds": compile_cpu,  # host CPU time: what wall time is on an idle machine
            "capture_cpu_seconds": capture_cpu,
            "seconds_per_graph": engine.capture_seconds / max(engine.capture_state.graphs_captured, 1),
            "pool_bytes": stats.pool_bytes,
            "pool_host_bytes": stats.extra.get("pool_host_bytes"),  # the simulator's host memory behind the pools
            "streams_in_use": stats.streams_in_use,
            "compile_cache": getattr(engine.pass_manager, "cache_status", "none"),  # hit | miss | off (ascendgraph.compile.cache)
        }
    finally:
        engine.close()


def bench_mode(mode: str, requests: int, seed: int) -> dict[str, Any]:
    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": mode}, max_num_seqs=16, max_num_batched_tokens=256
    )
    workload = WorkloadSpec(num_requests=requests, seed=seed, prompt_words=(8, 24), output_tokens=(24, 40))
    warm_up_process(seed)  # one-time process costs must not land in the first timed step
    engine = Engine(config, EngineOptions(device="sim", workload_spec=workload, seed=seed, progress=False))
    steps = _Steps()
    engine.observers.append(steps)
    try:
        engine.capture()
        engine.serve()
        report = engine.report()
    finally:
        engine.close()
    graph_cpu = sum(r.graph_cpu_s for r in steps.records)
    eager_cpu = sum(r.eager_cpu_s for r in steps.records)
    graph_us = report.simulated_time_us["graph"] or 0.0
    eager_us = report.simulated_time_us["eager"] or 0.0
    return {
        "mode": mode,
        "effective_mode": report.effective_mode,
        "ok": report.ok,
        "steps": report.steps,
        "batches_by_mode": report.batches_by_mode,
        "graph_cpu_ms": graph_cpu * 1e3,
        "eager_cpu_ms": eager_cpu * 1e3,
        "cpu_ratio": graph_cpu / eager_cpu if eager_cpu else None,
        "sim_graph_us": graph_us,
        "sim_eager_us": eager_us,
        "sim_ratio": graph_us / eager_us if eager_us else None,
        "max_abs_diff_vs_eager": report.max_abs_diff_vs_eager,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    parser.add_argument("--skip-capture", action="store_true", help="skip the default-sizes capture benchmark")
    parser.add_argument("--quick-capture", action="store_true", help="capture tiny with 1 layer and max_num_seqs 8")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results: dict[str, Any] = {"threads": args.threads}

    if not args.skip_capture:
        quick = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=8) if args.quick_capture else None
        capture = bench_capture(args.seed, quick)
        results["capture_default_tiny"] = capture
        print(
            f"capture, default tiny ({capture['mode']}): {capture['capture_sizes']} sizes, {capture['graphs']} graphs "
            f"in {capture['capture_seconds']:.2f} s ({capture['seconds_per_graph'] * 1e3:.1f} ms/graph), "
            f"compile {capture['compile_seconds']:.2f} s, pool {capture['pool_bytes'] / 2**20:.1f} MiB"
        )

    print(f"\n{'mode':<20} {'steps':>5} {'graph CPU ms':>13} {'eager CPU ms':>13} {'CPU ratio':>10} {'sim ratio':>10}")
    rows = []
    for mode in args.modes:
        row = bench_mode(mode, args.requests, args.seed)
        rows.append(row)
        cpu = f"{row['cpu_ratio']:.2f}" if row["cpu_ratio"] is not None else "-"
        sim = f"{row['sim_ratio']:.2f}" if row["sim_ratio"] is not None else "-"
        print(f"{mode:<20} {row['steps']:>5} {row['graph_cpu_ms']:>13.1f} {row['eager_cpu_ms']:>13.1f} {cpu:>10} {sim:>10}"
              f"   {row['batches_by_mode']}{'' if row['ok'] else '  FAILED'}")
    results["modes"] = rows
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
