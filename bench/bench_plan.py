"""Padding waste of workload-aware capture sizes vs even sampling, at equal budget.

Three generated workloads (`ascendgraph.runtime.workload.WorkloadSpec`), batched by the engine's
scheduler for a chunked-prefill serving configuration (max_num_seqs 128,
max_num_batched_tokens 512, capture sizes up to 512: 51 candidates):

* **decode-heavy** — short prompts, long outputs: mostly uniform decode batches;
* **mixed** — long prompts, short outputs: chunked prefill mixed with decodes;
* **bursty** — requests arrive in bursts (``burst_size`` / ``burst_gap``), so batch sizes
  swing between a few requests and a burst's worth.

For each, both selections keep ``budget`` sizes of the same candidates:
`ascendgraph.sizes.sample_sizes` (even sampling, vLLM Ascend's old pruning) and
`ascendgraph.sizes.select_sizes` (workload-aware). The ratio is workload-aware padding
waste / even-sampling padding waste (goal <= 0.7). ``in_sample`` selects and evaluates on
the same batches; ``held_out`` selects on the workload generated with ``seed`` and
evaluates on the one generated with ``seed + 1`` (the honest figure: a deployment plans on
yesterday's traffic).

No assertions: this is a measurement. Run ``python bench/bench_plan.py [--budget N]``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, Optional

from ascendgraph.config import GraphConfig
from ascendgraph.resolve import resolve
from ascendgraph.sizes import padding_waste, sample_sizes, select_sizes
from ascendgraph.runtime.workload import WorkloadSpec, generate_workload, simulate_batches

DEFAULT_BUDGET = 8
DEFAULT_REQUESTS = 96


def serving_config() -> GraphConfig:
    return GraphConfig.from_vllm_args(
        max_num_seqs=128, max_num_batched_tokens=512, compilation_config={"max_cudagraph_capture_size": 512}
    )


def workload_specs(requests: int, seed: int) -> dict[str, WorkloadSpec]:
    burst = max(1, requests // 4)
    return {
        "decode-heavy": WorkloadSpec(num_requests=requests, seed=seed, prompt_words=(4, 24), output_tokens=(64, 160)),
        "mixed": WorkloadSpec(num_requests=requests, seed=seed, prompt_words=(16, 200), output_tokens=(8, 64)),
        "bursty": WorkloadSpec(num_requests=requests, seed=seed, prompt_words=(8, 64), output_tokens=(16, 64),
                               burst_size=burst, burst_gap=40),
    }


def batch_sizes(config: GraphConfig, spec: WorkloadSpec) -> list[int]:
    requests = generate_workload(spec, vocab_size=config.model.vocab_size)
    batches = simulate_batches(
        requests,
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_speculative_tokens=config.num_speculative_tokens,
        block_size=config.block_size,
        vocab_size=config.model.vocab_size,
        seed=spec.seed,
    )
    return [b.num_tokens for b in batches]


def _ratio(ours: float, theirs: float) -> Optional[float]:
    return ours / theirs if theirs > 0 else None


def bench_padding(budget: int = DEFAULT_BUDGET, requests: int = DEFAULT_REQUESTS, seed: int = 0) -> dict[str, Any]:
    config = serving_config()
    candidates = list(resolve(config).capture_sizes)
    even = sample_sizes(candidates, budget)
    held_out_specs = workload_specs(requests, seed + 1)
    rows: dict[str, Any] = {}
    for name, spec in workload_specs(requests, seed).items():
        sizes = batch_sizes(config, spec)
        other = batch_sizes(config, held_out_specs[name])
        aware = select_sizes(candidates, budget, sizes)
        waste_even, waste_aware = padding_waste(even, sizes), padding_waste(aware, sizes)
        held_even, held_aware = padding_waste(even, other), padding_waste(aware, other)
        rows[name] = {
            "spec": {"num_requests": spec.num_requests, "seed": spec.seed, "prompt_words": list(spec.prompt_words),
                     "output_tokens": list(spec.output_tokens), "burst_size": spec.burst_size,
                     "burst_gap": spec.burst_gap},
            "batches": len(sizes),
            "graphable_batches": sum(1 for t in sizes if t <= candidates[-1]),
            "even": {"sizes": even, "padding_waste": waste_even},
            "workload_aware": {"sizes": aware, "padding_waste": waste_aware},
            "ratio": _ratio(waste_aware, waste_even),
            "held_out": {"seed": seed + 1, "batches": len(other), "even_padding_waste": held_even,
                         "workload_aware_padding_waste": held_aware, "ratio": _ratio(held_aware, held_even)},
        }
    return {
        "budget": budget,
        "config": {"max_num_seqs": config.max_num_seqs, "max_num_batched_tokens": config.max_num_batched_tokens,
                   "candidates": len(candidates), "max_capture_size": candidates[-1]},
        "workloads": rows,
    }


def format_padding(result: dict[str, Any]) -> str:
    def fmt(value: Optional[float]) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = [
        f"padding waste at a budget of {result['budget']} sizes (of {result['config']['candidates']} candidates, "
        f"max {result['config']['max_capture_size']}):",
        f"  {'workload':<13} {'batches':>7} {'even':>8} {'aware':>8} {'ratio':>6} {'held-out ratio':>15}",
    ]
    for name, row in result["workloads"].items():
        lines.append(
            f"  {name:<13} {row['batches']:>7} {row['even']['padding_waste'] * 100:>7.1f}% "
            f"{row['workload_aware']['padding_waste'] * 100:>7.1f}% {fmt(row['ratio']):>6} "
            f"{fmt(row['held_out']['ratio']):>15}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=DEFAULT_BUDGET)
    parser.add_argument("--requests", type=int, default=DEFAULT_REQUESTS)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args()
    result = bench_padding(args.budget, args.requests, args.seed)
    print(format_padding(result))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(result, handle, indent=2)


if __name__ == "__main__":
    main()
