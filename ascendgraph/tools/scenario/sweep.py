"""Long multi-rank campaigns: every rank scenario file x side x seed, sharded over machines
and spread over a process pool (docs/ranks.md, "Many machines").

    python -m ascendgraph.tools.scenario.sweep tests/ranks/scenario_files --seeds 0:100 \\
        --shard 0/4 --workers 2 [--json]

A *job* is (file, side, seed): the scenario's side run with that seed (the seed orders the
ranks in the fabric's scheduler and draws the fault plan's percentages). `--shard i/n` keeps
the jobs whose index is i modulo n, so n machines given 0/n .. n-1/n cover every job exactly
once; `--workers` runs a shard's jobs in that many processes (at most the CPUs this process
may use). Each result is the job and the ways it missed its expectation; exit 1 when any job
missed, 2 for bad input (one line).

A shard is computed, not listed: its k-th job is job ``i + k*n`` of the full order (file, then
side, then seed), decoded arithmetically, so ``--seeds 0:100000000 --shard 0/100000000`` holds
two jobs per file and builds only those; jobs are handed to the pool a few at a time and only
the missed ones are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, NoReturn, Optional, Sequence, Union, overload

from ascendgraph.errors import ConfigError

__all__ = ["Job", "ShardJobs", "parse_shard", "parse_seeds", "parse_workers", "usable_cpus", "plan_jobs", "run_job",
           "sweep", "main", "MAX_SEED"]

MAX_SEED = 2**63 - 1  # the largest seed torch generators and random.Random take (`ascendgraph run --seed` too)
_COUNT = re.compile(r"[0-9]{1,20}")  # ASCII digits only: str.isdigit() also takes "²" and "١٢"


@dataclass(frozen=True)
class Job:
    path: str
    side: str
    seed: int


def parse_shard(text: str) -> tuple[int, int]:
    """``i/n`` with 0 <= i < n, in ASCII digits."""
    index, sep, count = text.partition("/")
    if not sep or not _COUNT.fullmatch(index) or not _COUNT.fullmatch(count) or not 0 <= int(index) < int(count):
        raise ConfigError(f"--shard must be i/n in ASCII digits with 0 <= i < n (e.g. 0/4), got {text!r}", key="shard")
    return int(index), int(count)


def parse_seeds(text: str) -> range:
    """``a:b`` (a <= seed < b) or one seed, in ASCII digits, every seed at most `MAX_SEED`."""
    low, sep, high = text.partition(":")
    if not _COUNT.fullmatch(low) or (sep and not _COUNT.fullmatch(high)):
        raise ConfigError(f"--seeds must be A:B or N in ASCII digits, got {text!r}", key="seeds")
    seeds = range(int(low), int(high)) if sep else range(int(low), int(low) + 1)
    if seeds.start >= seeds.stop:
        raise ConfigError(f"--seeds {text!r} is empty", key="seeds")
    if seeds.stop - 1 > MAX_SEED:
        raise ConfigError(f"--seeds {text!r} goes beyond the largest seed, {MAX_SEED}", key="seeds")
    return seeds


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def parse_workers(text: str) -> int:
    """``--workers``: 1 .. `usable_cpus()` (more processes than CPUs only queue for them)."""
    cpus = usable_cpus()
    if not _COUNT.fullmatch(text) or not 1 <= int(text) <= cpus:
        raise ConfigError(f"--workers must be from 1 to {cpus} (the CPUs this process may use), got {text!r}",
                          key="workers")
    return int(text)


class ShardJobs(Sequence[Job]):
    """The jobs of shard ``index``/``count`` over files x sides x seeds, computed on demand: the
    k-th is job ``index + k*count`` of the full order (file, then side, then seed)."""

    def __init__(self, paths: Sequence[Union[str, Path]], sides: Sequence[str], seeds: range,
                 shard: tuple[int, int] = (0, 1)) -> None:
        self.paths = [str(p) for p in paths]
        self.sides = tuple(sides)
        self.seeds = seeds
        self.shard_index, self.shard_count = shard  # not index/count: Sequence's methods
        self.total = len(self.paths) * len(self.sides) * max(0, seeds.stop - seeds.start)

    def size(self) -> int:
        """How many jobs the shard holds (an int of any size; ``len`` needs it below sys.maxsize)."""
        return max(0, -(-(self.total - self.shard_index) // self.shard_count))

    def __len__(self) -> int:
        return self.size()

    def _job(self, position: int) -> Job:
        number = self.shard_index + position * self.shard_count
        width = self.seeds.stop - self.seeds.start
        rest, seed = divmod(number, width)
        path, side = divmod(rest, len(self.sides))
        return Job(self.paths[path], self.sides[side], self.seeds.start + seed)

    @overload
    def __getitem__(self, position: int) -> Job: ...

    @overload
    def __getitem__(self, position: slice) -> list[Job]: ...

    def __getitem__(self, position: Union[int, slice]) -> Union[Job, list[Job]]:
        if isinstance(position, slice):
            return [self._job(k) for k in range(*position.indices(self.size()))]
        size = self.size()
        if position < 0:
            position += size
        if not 0 <= position < size:
            raise IndexError(position)
        return self._job(position)

    def __iter__(self) -> Iterator[Job]:
        position, size = 0, self.size()
        while position < size:
            yield self._job(position)
            position += 1


def plan_jobs(paths: Sequence[Path], seeds: range, shard: tuple[int, int] = (0, 1)) -> ShardJobs:
    from ascendgraph.tools.scenario.ranks import RANK_SIDES

    return ShardJobs(paths, RANK_SIDES, seeds, shard)


def run_job(job: Job) -> tuple[Job, list[str]]:
    from ascendgraph.tools.scenario.ranks import load_rank_scenario, run_rank_scenario

    scenario = load_rank_scenario(job.path)
    sides = dict(scenario.sides)
    sides[job.side] = {**sides[job.side], "seed": job.seed}
    scenario = type(scenario)(**{**scenario.__dict__, "sides": sides})
    _, misses = run_rank_scenario(scenario, job.side)
    return job, misses


# Jobs handed to the pool ahead of the one awaited, per worker: enough to keep every worker
# busy, few enough that a shard of any size holds a bounded number of futures.
_AHEAD_PER_WORKER = 2


def sweep(jobs: Iterable[Job], *, workers: int = 1,
          run: Callable[[Job], tuple[Job, list[str]]] = run_job) -> Iterator[tuple[Job, list[str]]]:
    """Each job's result (``run(job)``, by default `run_job`), in the jobs' order, as it is done;
    jobs are taken from ``jobs`` lazily, at most ``2 * workers`` ahead of the one awaited."""
    if workers <= 1:
        for job in jobs:
            yield run(job)
        return
    with ProcessPoolExecutor(max_workers=workers) as pool:
        pending: deque[Future[tuple[Job, list[str]]]] = deque()
        for job in jobs:
            pending.append(pool.submit(run, job))
            if len(pending) >= workers * _AHEAD_PER_WORKER:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


class _Parser(argparse.ArgumentParser):
    """Bad flags are one line (the ConfigError `main` prints), not argparse's usage dump."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see {self.prog} --help)", key="argv")


def _scenario_files(raw: str) -> list[Path]:
    path = Path(raw)
    if path.is_dir():
        files = sorted(path.glob("*.toml"))
        if not files:
            raise ConfigError(f"{raw!r} holds no rank scenario file (*.toml)", key="paths")
        return files
    if not path.is_file():
        raise ConfigError(f"{raw!r} is neither a rank scenario file nor a folder of them", key="paths")
    return [path]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = _Parser(prog="python -m ascendgraph.tools.scenario.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="rank scenario files or folders of them")
    parser.add_argument("--seeds", default="0", help="A:B (A <= seed < B) or one seed (default 0)")
    parser.add_argument("--shard", default="0/1", help="i/n: this machine's share of the jobs (default 0/1)")
    parser.add_argument("--workers", default="1",
                        help="processes for this shard, at most the CPUs this process may use (default 1)")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    done, missed = 0, []
    try:
        args = parser.parse_args(argv)
        seeds, shard, workers = parse_seeds(args.seeds), parse_shard(args.shard), parse_workers(args.workers)
        files = [file for raw in args.paths for file in _scenario_files(raw)]
        for job, misses in sweep(plan_jobs(files, seeds, shard), workers=workers):
            done += 1
            if misses:
                missed.append((job, misses))
    except ConfigError as exc:
        from ascendgraph.readers import shown

        print(f"error: {shown(str(exc))}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"jobs": done, "missed": [
            {"path": j.path, "side": j.side, "seed": j.seed, "misses": m} for j, m in missed]}))
    else:
        for job, misses in missed:
            print(f"MISSED {Path(job.path).stem} {job.side} seed {job.seed}: {'; '.join(misses)}")
        print(f"{done} jobs, {len(missed)} missed")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
