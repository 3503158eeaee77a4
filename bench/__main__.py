"""`python -m bench` (`make bench`): every benchmark of the project, side by side in one run.

Prints, and writes to ``bench/results.json`` (atomically; ``--out`` elsewhere):

1. **replay vs eager per mode on tiny** (`bench_engine.bench_mode`): host CPU time of the
   graph path (dispatch, replay, FULL-graph parameter update, synchronise) over the eager
   reference's on the same batches, and the simulated device-time ratio graph / eager
   (after `bench_engine.warm_up_process`, so one-time process costs are not timed);
2. **simulator op-level replay vs eager** (`bench_sim.build` / `interleaved_us`): one
   decoder-block op sequence, replayed vs issued eagerly, per batch size;
3. **capture time for all default sizes of tiny** (`bench_engine.bench_capture`; ``--quick``
   passes it a one-layer configuration);
4. **padding waste** workload-aware / even sampling at equal budget on three workloads
   (`bench_plan.bench_padding`: decode-heavy, mixed, bursty; in-sample and held-out);
5. **test-suite wall time**: the default suite (`pytest -n auto`) in a subprocess
   (``--skip-suite`` skips it; ``--quick`` implies it).

``--quick`` is a smoke run (few requests, two modes, one layer for the capture) that
produces the same keys. No figure here is asserted anywhere: these are measurements.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from typing import Any, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "bench", "results.json")
SCHEMA_VERSION = 1
NESTED_ENV = "ASCENDGRAPH_BENCH_NESTED"  # set in the suite's subprocess: never benchmark recursively
QUICK_MODES = ("NONE", "FULL_DECODE_ONLY")
RESULT_KEYS = ("schema_version", "quick", "started", "environment", "replay_vs_eager", "sim_replay_vs_eager",
               "capture", "padding_waste", "suite", "seconds")


def write_json_atomic(path: str, document: dict[str, Any]) -> None:
    """Write ``document`` to ``path`` so that a reader sees the old file or the new one, never half."""
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=directory, prefix=".results.", suffix=".tmp",
                                         delete=False)
    try:
        with handle:
            json.dump(document, handle, indent=2)
            handle.write("\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        if os.path.exists(handle.name):
            os.unlink(handle.name)
        raise


def _fmt(value: Optional[float], digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


# --------------------------------------------------------------------------- sections


def section_modes(modes: Sequence[str], requests: int, seed: int) -> dict[str, Any]:
    from bench.bench_engine import bench_mode

    rows = {mode: bench_mode(mode, requests, seed) for mode in modes}
    print(f"\n1. replay vs eager per mode, tiny ({requests} requests; host CPU time and simulated device time)")
    print(f"   {'mode':<20} {'steps':>5} {'graph CPU ms':>13} {'eager CPU ms':>13} {'CPU ratio':>10} {'sim ratio':>10}")
    for mode, row in rows.items():
        print(f"   {mode:<20} {row['steps']:>5} {row['graph_cpu_ms']:>13.1f} {row['eager_cpu_ms']:>13.1f} "
              f"{_fmt(row['cpu_ratio']):>10} {_fmt(row['sim_ratio']):>10}{'' if row['ok'] else '   FAILED'}")
    return {"model": "tiny", "requests": requests, "modes": rows}


def section_sim(batches: Sequence[int], repeats: int) -> dict[str, Any]:
    import torch

    from ascendgraph.device import get_device
    from bench.bench_sim import build, interleaved_us

    rows = []
    for batch in batches:
        device = get_device("sim")
        step, _ = build(batch)
        with torch.no_grad():
            step()
            graph = device.new_graph()
            start = time.perf_counter()
            with device.graph(graph):
                step()
            capture_ms = (time.perf_counter() - start) * 1e3
            graph.replay()
            eager, replay, ratio = interleaved_us(step, graph.replay, repeats)
        rows.append({"batch": batch, "tasks": graph.num_tasks, "eager_us": eager, "replay_us": replay,
                     "ratio": ratio, "capture_ms": capture_ms})
    print(f"\n2. simulator replay vs eager, one decoder-block op sequence (median of {repeats} interleaved rounds)")
    print(f"   {'batch':>5} {'tasks':>5} {'eager us':>9} {'replay us':>10} {'ratio':>6}")
    for row in rows:
        print(f"   {row['batch']:>5} {row['tasks']:>5} {row['eager_us']:>9.1f} {row['replay_us']:>10.1f} "
              f"{row['ratio']:>6.2f}")
    return {"repeats": repeats, "batches": rows}


def section_capture(seed: int, quick: bool) -> dict[str, Any]:
    from ascendgraph.config import GraphConfig
    from bench.bench_engine import bench_capture

    if quick:  # the smoke version: tiny with one layer, few sizes
        result = bench_capture(seed, GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=8))
        result["model"] = "tiny (1 layer, max_num_seqs 8; quick)"
    else:
        result = bench_capture(seed)
        result["model"] = "tiny (4 layers)"
    print(f"\n3. capture, all default sizes of {result['model']} ({result['mode']}): {result['capture_sizes']} sizes, "
          f"{result['graphs']} graphs in {result['capture_seconds']:.2f} s "
          f"({result['seconds_per_graph'] * 1e3:.1f} ms/graph); compile {result['compile_seconds']:.2f} s; "
          f"pool {result['pool_bytes'] / 2**20:.1f} MiB")
    return result


def section_padding(budget: int, requests: int, seed: int) -> dict[str, Any]:
    from bench.bench_plan import bench_padding, format_padding

    result = bench_padding(budget, requests, seed)
    print("\n4. " + format_padding(result).replace("\n", "\n   "))
    return result


def section_suite(skip_reason: Optional[str]) -> dict[str, Any]:
    if skip_reason is None and os.environ.get(NESTED_ENV):
        skip_reason = "running inside the test suite"
    if skip_reason is not None:
        print(f"\n5. test suite: skipped ({skip_reason})")
        return {"skipped": True, "reason": skip_reason, "seconds": None}
    command = [sys.executable, "-m", "pytest", "-n", "auto", "-q", "-p", "no:cacheprovider"]
    env = {**os.environ, NESTED_ENV: "1"}
    start = time.perf_counter()
    completed = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    tail = [line for line in completed.stdout.strip().splitlines() if line.strip()]
    summary = tail[-1] if tail else ""
    print(f"\n5. test suite (pytest -n auto, default selection): {seconds:.1f} s wall, exit {completed.returncode}: "
          f"{summary}")
    return {"skipped": False, "seconds": seconds, "exit_code": completed.returncode, "summary": summary,
            "command": " ".join(command[1:]), "cpus": os.cpu_count()}


# --------------------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 1 request, modes NONE and FULL_DECODE_ONLY, a 1-layer capture, no suite")
    parser.add_argument("--skip-suite", action="store_true", help="do not time the test suite")
    parser.add_argument("--modes", nargs="*", default=None, metavar="MODE",
                        help="graph modes of section 1 (default: all five; --quick: NONE FULL_DECODE_ONLY)")
    parser.add_argument("--requests", type=int, default=None, help="requests per mode in section 1 (default 16)")
    parser.add_argument("--budget", type=int, default=8, help="capture sizes per selection in section 4 (default 8)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1)")
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="FILE", help="results file (default bench/results.json)")
    args = parser.parse_args(argv)

    import torch

    from bench.bench_engine import MODES

    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    quick = args.quick
    modes = args.modes if args.modes else list(QUICK_MODES if quick else MODES)
    unknown = sorted(set(modes) - set(MODES))
    if unknown:
        parser.error(f"unknown mode(s) {', '.join(unknown)}; choose from {', '.join(MODES)}")
    requests = args.requests or (1 if quick else 16)
    print(f"ascendgraph bench: torch {torch.__version__}, {args.threads} thread(s), {os.cpu_count()} CPUs"
          + (" (quick)" if quick else ""))

    results: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "quick": quick,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "threads": args.threads,
                        "cpus": os.cpu_count(), "machine": platform.machine()},
    }
    results["replay_vs_eager"] = section_modes(modes, requests, args.seed)
    results["sim_replay_vs_eager"] = section_sim([1, 8] if quick else [1, 8, 64], 5 if quick else 200)
    results["capture"] = section_capture(args.seed, quick)
    results["padding_waste"] = section_padding(args.budget, 24 if quick else 96, args.seed)
    skip = "--quick" if quick else "--skip-suite" if args.skip_suite else None
    results["suite"] = section_suite(skip)
    results["seconds"] = time.perf_counter() - started
    write_json_atomic(args.out, results)
    print(f"\nresults: {os.path.relpath(args.out)} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
