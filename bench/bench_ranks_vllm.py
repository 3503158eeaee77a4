"""64 simulated ranks running vLLM's own ``coordinate_batch_across_dp`` for 100 steps.

``python -m bench.bench_ranks_vllm [--dp 64] [--steps 100]``, in an environment with vLLM (the
vLLM Ascend environment of ``make vllm-ascend``: ``.venv-vllm-ascend/bin/python -m sim.facade
-- .venv-vllm-ascend/bin/python -m bench.bench_ranks_vllm``). Every DP rank is a
thread with its own vLLM ``parallel_state`` groups on the fabric's torch.distributed backend
(`sim.vllm_ranks`) and its own ``ParallelConfig``; each step it calls vLLM 0.27.1's unmodified
``vllm.v1.worker.dp_utils.coordinate_batch_across_dp`` (a ``[4, dp]`` all-reduce on the DP
device group), and every 32 steps ``ParallelConfig.sync_dp_state`` on the engine core's DP group.
Prints one JSON document: the wall time of the run (imports and group set-up included; the
interpreter's start excluded), collectives met. No assertions: a measurement (docs/ranks.md).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any


def measure(dp: int, steps: int) -> dict[str, Any]:
    from vllm.config import ParallelConfig
    from vllm.v1.worker.dp_utils import coordinate_batch_across_dp

    from ascendgraph.parallel.layout import ParallelLayout
    from sim.vllm_ranks import VllmRanks

    ranks = VllmRanks(ParallelLayout(dp=dp))
    agreed: dict[int, int] = {}

    def body(rank: int) -> None:
        config = ParallelConfig(data_parallel_size=dp, data_parallel_rank=rank, disable_nccl_for_dp_synchronization=False)
        for step in range(1, steps + 1):
            _, across, mode = coordinate_batch_across_dp(num_tokens_unpadded=1 + (rank + step) % 8,
                                                         allow_microbatching=False, parallel_config=config,
                                                         cudagraph_mode=2)
            agreed[rank] = int(across[rank])
            if step % 32 == 0:
                ParallelConfig.sync_dp_state(ranks.engine_dp_group(), True, False)

    start = time.perf_counter()
    stats = ranks.run(body)
    wall = time.perf_counter() - start
    return {"dp": dp, "steps": steps, "wall_s": round(wall, 2), "collectives_met": dict(stats.met),
            "agreed_tokens_last_step": sorted(set(agreed.values()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    print(json.dumps(measure(args.dp, args.steps)))


if __name__ == "__main__":
    main()
