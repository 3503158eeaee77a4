"""The rank-scenario sweep's inputs and its shards (ascendgraph/tools/scenario/sweep.py;
docs/ranks.md "Many machines"): a shard is computed without listing the other shards' jobs,
jobs reach the pool a few at a time, and every malformed flag is one line with exit 2."""

from __future__ import annotations

import itertools
import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest

from ascendgraph.tools.scenario import sweep as sweep_module
from ascendgraph.tools.scenario.sweep import Job, main, parse_seeds, parse_shard, plan_jobs, sweep, usable_cpus

FILES = [Path("a.toml"), Path("b.toml"), Path("c.toml")]
SIDES = ("buggy", "fixed")


def test_a_shard_is_the_same_jobs_the_full_list_would_give_it() -> None:
    seeds = range(3, 10)
    every = [Job(str(p), side, seed) for p in FILES for side in SIDES for seed in seeds]
    for count in (1, 2, 3, 5, 41, 42, 43, 100):
        for index in range(min(count, 44)):
            shard = plan_jobs(FILES, seeds, (index, count))
            expected = [job for n, job in enumerate(every) if n % count == index]
            assert list(shard) == expected and len(shard) == len(expected)
            assert [shard[k] for k in range(-len(expected), len(expected))] == expected * 2
            assert shard[1:3] == expected[1:3]


def test_a_thin_shard_of_many_seeds_builds_only_its_own_jobs() -> None:
    # One job in 200,000: listing every job first (the old way) held 1.2 million of them.
    tracemalloc.start()
    try:
        shard = plan_jobs(FILES, parse_seeds("0:200000"), parse_shard("7/200000"))
        jobs = list(shard)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert jobs == [Job(str(p), side, 7) for p in FILES for side in SIDES]
    assert peak < 1_000_000, peak


def test_the_largest_sweep_is_planned_without_building_it() -> None:
    shard = plan_jobs(FILES, parse_seeds("0:100000000"), parse_shard("0/100000000"))
    assert list(shard) == [Job(str(p), side, 0) for p in FILES for side in SIDES]
    whole = plan_jobs(FILES, parse_seeds(f"0:{sweep_module.MAX_SEED + 1}"))
    assert whole.size() == len(FILES) * 2 * (sweep_module.MAX_SEED + 1)
    assert whole[-1] == Job("c.toml", "fixed", sweep_module.MAX_SEED)


def _quick(job: Job) -> tuple[Job, list[str]]:
    return job, ["odd seed"] if job.seed % 2 else []


def _jobs_refusing_to_be_listed(pulled: list[int], limit: int) -> Iterator[Job]:
    for seed in itertools.count():
        if seed >= limit:
            raise AssertionError(f"the sweep took {seed} jobs before the first results were asked for")
        pulled.append(seed)
        yield Job("a.toml", "buggy", seed)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_pool_takes_jobs_a_few_at_a_time(workers: int) -> None:
    pulled: list[int] = []
    results = sweep(_jobs_refusing_to_be_listed(pulled, limit=50), workers=workers, run=_quick)
    first = list(itertools.islice(results, 3))
    results.close()  # type: ignore[attr-defined]
    assert [(job.seed, misses) for job, misses in first] == [(0, []), (1, ["odd seed"]), (2, [])]
    assert len(pulled) <= 3 + 2 * workers


BAD = [
    (["--shard", "²/4"], "--shard must be i/n in ASCII digits"),
    (["--shard", "0/²"], "--shard must be i/n in ASCII digits"),
    (["--shard", "١/4"], "--shard must be i/n in ASCII digits"),
    (["--shard", "4/4"], "--shard must be i/n"),
    (["--shard", "0/0"], "--shard must be i/n"),
    (["--shard", " 0/4"], "--shard must be i/n"),
    (["--seeds", "0:²"], "--seeds must be A:B or N in ASCII digits"),
    (["--seeds", "²"], "--seeds must be A:B or N in ASCII digits"),
    (["--seeds=-1:3"], "--seeds must be A:B or N in ASCII digits"),
    (["--seeds", "5:5"], "is empty"),
    (["--seeds", "0:" + "9" * 25], "--seeds must be A:B or N in ASCII digits"),
    (["--seeds", f"0:{2**63 + 1}"], "goes beyond the largest seed"),
    (["--workers", "0"], "--workers must be from 1 to"),
    (["--workers=-2"], "--workers must be from 1 to"),
    (["--workers", "²"], "--workers must be from 1 to"),
    (["--workers", "two"], "--workers must be from 1 to"),
    (["--workers", str(usable_cpus() + 1)], "(the CPUs this process may use)"),
    (["--bogus"], "unrecognized arguments: --bogus"),
]


@pytest.mark.parametrize("flags,message", BAD, ids=[" ".join(flags) for flags, _ in BAD])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str],
                                          message: str) -> None:
    scenario = tmp_path / "x.toml"
    scenario.write_text("")
    assert main([str(scenario), *flags]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err, err


@pytest.mark.parametrize("kind", ["missing", "empty folder"])
def test_a_path_without_scenario_files_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   kind: str) -> None:
    path = tmp_path / "nothing"
    if kind == "empty folder":
        path.mkdir()
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err
