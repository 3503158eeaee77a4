"""Many ranks on one laptop: the wall time of 64 simulated ranks stepping 100 decode steps.

``python -m bench.bench_ranks [--dp 16] [--tp 4] [--steps 100]`` builds the dp x tp layout
(tiny-moe, FULL_DECODE_ONLY, capture sizes 1 2 4 8), gives every DP rank ``steps`` uniform
decode batches of 4 tokens, and runs `ascendgraph.runtime.ranks.run_ranks` once: per rank a
simulator device (meta tensors), an agreed capture of 4 graphs, then per step the
unfinished-requests all-reduce (every 32 steps), the DP sync, the post-sync check, a replay
and the step's TP all-reduce and MoE dispatch / combine on the EP group. Prints one JSON
document: the wall time (imports and a 2-rank warm-up excluded, so the figure is the
simulation's), collectives met, and per-rank replays.

No assertions: this is a measurement (docs/ranks.md quotes it with its command).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from typing import Any


def measure(dp: int, tp: int, steps: int, seed: int = 0) -> dict[str, Any]:
    from ascendgraph.config import GraphConfig
    from ascendgraph.runtime.ranks import RankOptions, Step, run_ranks

    logging.getLogger("ascendgraph").setLevel(logging.ERROR)

    def config(dp_size: int, tp_size: int) -> Any:
        return GraphConfig.from_vllm_args(
            model="tiny-moe", data_parallel_size=dp_size, tensor_parallel_size=tp_size,
            compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4, 8]})

    warm = run_ranks(config(2, 1), RankOptions(steps={0: [Step(4, True)], 1: [Step(4, True)]}))
    assert warm.error is None, warm.error
    workload = {d: [Step(4, True)] * steps for d in range(dp)}
    start = time.perf_counter()
    report = run_ranks(config(dp, tp), RankOptions(steps=workload, seed=seed))
    wall = time.perf_counter() - start
    return {
        "ranks": dp * tp,
        "dp": dp,
        "tp": tp,
        "decode_steps": steps,
        "wall_seconds": round(wall, 3),
        "error": None if report.error is None else type(report.error).__name__,
        "collectives_met": report.collectives_met,
        "replays_per_rank": sorted({r.replays for r in report.ranks}),
        "graphs_per_rank": sorted({r.graphs_captured for r in report.ranks}),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=16)
    parser.add_argument("--tp", type=int, default=4)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(measure(args.dp, args.tp, args.steps), indent=2))


if __name__ == "__main__":
    main()
