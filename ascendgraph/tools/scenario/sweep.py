"""Long multi-rank campaigns: every rank scenario file x side x seed, sharded over machines
and spread over a process pool (docs/ranks.md, "Many machines").

    python -m ascendgraph.tools.scenario.sweep tests/ranks/scenario_files --seeds 0:100 \\
        --shard 0/4 --workers 2 [--json]

A *job* is (file, side, seed): the scenario's side run with that seed (the seed orders the
ranks in the fabric's scheduler and draws the fault plan's percentages). `--shard i/n` keeps
the jobs whose index is i modulo n, so n machines given 0/n .. n-1/n cover every job exactly
once; `--workers` runs a shard's jobs in that many processes. Each result is the job and the
ways it missed its expectation; exit 1 when any job missed, 2 for bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from ascendgraph.errors import ConfigError

__all__ = ["Job", "parse_shard", "parse_seeds", "plan_jobs", "run_job", "sweep", "main"]


@dataclass(frozen=True)
class Job:
    path: str
    side: str
    seed: int


def parse_shard(text: str) -> tuple[int, int]:
    """``i/n`` with 0 <= i < n."""
    index, sep, count = text.partition("/")
    if not sep or not index.isdigit() or not count.isdigit() or not 0 <= int(index) < int(count):
        raise ConfigError(f"--shard must be i/n with 0 <= i < n (e.g. 0/4), got {text!r}", key="shard")
    return int(index), int(count)


def parse_seeds(text: str) -> range:
    """``a:b`` (a <= seed < b) or one seed."""
    low, sep, high = text.partition(":")
    if not low.isdigit() or (sep and not high.isdigit()):
        raise ConfigError(f"--seeds must be A:B or N in ASCII digits, got {text!r}", key="seeds")
    seeds = range(int(low), int(high)) if sep else range(int(low), int(low) + 1)
    if not seeds:
        raise ConfigError(f"--seeds {text!r} is empty", key="seeds")
    return seeds


def plan_jobs(paths: Sequence[Path], seeds: range, shard: tuple[int, int] = (0, 1)) -> list[Job]:
    from ascendgraph.tools.scenario.ranks import RANK_SIDES

    every = [Job(str(p), side, seed) for p in paths for side in RANK_SIDES for seed in seeds]
    index, count = shard
    return [job for n, job in enumerate(every) if n % count == index]


def run_job(job: Job) -> tuple[Job, list[str]]:
    from ascendgraph.tools.scenario.ranks import load_rank_scenario, run_rank_scenario

    scenario = load_rank_scenario(job.path)
    sides = dict(scenario.sides)
    sides[job.side] = {**sides[job.side], "seed": job.seed}
    scenario = type(scenario)(**{**scenario.__dict__, "sides": sides})
    _, misses = run_rank_scenario(scenario, job.side)
    return job, misses


def sweep(jobs: Sequence[Job], *, workers: int = 1) -> list[tuple[Job, list[str]]]:
    if workers <= 1:
        return [run_job(job) for job in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(run_job, jobs))


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ascendgraph.tools.scenario.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="rank scenario files or folders of them")
    parser.add_argument("--seeds", default="0", help="A:B (A <= seed < B) or one seed (default 0)")
    parser.add_argument("--shard", default="0/1", help="i/n: this machine's share of the jobs (default 0/1)")
    parser.add_argument("--workers", type=int, default=1, help="processes for this shard (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    try:
        files = []
        for raw in args.paths:
            path = Path(raw)
            files.extend(sorted(path.glob("*.toml")) if path.is_dir() else [path])
        jobs = plan_jobs(files, parse_seeds(args.seeds), parse_shard(args.shard))
        results = sweep(jobs, workers=args.workers)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    missed = [(job, misses) for job, misses in results if misses]
    if args.json:
        print(json.dumps({"jobs": len(results), "missed": [
            {"path": j.path, "side": j.side, "seed": j.seed, "misses": m} for j, m in missed]}))
    else:
        for job, misses in missed:
            print(f"MISSED {Path(job.path).stem} {job.side} seed {job.seed}: {'; '.join(misses)}")
        print(f"{len(results)} jobs, {len(missed)} missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
