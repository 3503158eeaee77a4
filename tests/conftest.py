"""Suite-wide scheduling: the costliest tests start first.

pytest-xdist hands items to the workers in collection order. A long test collected last
(the README's `ascendgraph run`, alphabetically near the end) keeps one worker busy while
the other has nothing left to do. Here the items of the modules known to be costly (they
build, compile and capture engines, or start Python subprocesses) move to the front, in
the order of the table; everything else keeps its collection order behind them. Only the
order changes: the selection, the items and their fixtures do not (tests are independent,
so order never changes an outcome). The suite's figure: docs/bench.md, "Goals and the latest figures".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

TESTS = Path(__file__).resolve().parent

# Path under tests/ (a module or a folder) -> why its items are costly. Order = start order.
COSTLY_FIRST: dict[str, str] = {
    "unit/test_readme.py": "runs every README command in-process, the default `ascendgraph run` (210 graphs) among them",
    "engine": "every test builds, compiles, captures and serves an engine",
    "scenarios": "each scenario file runs an engine",
    "hostile/test_process_plumbing.py": "starts `python -m ascendgraph` subprocesses, one runs until interrupted",
    "unit/test_passes_tiny.py": "compiles tiny per pass configuration",
    "unit/test_static_kernel.py": "builds static kernels and captures twice",
    "unit/test_scenario_pytest.py": "an inner pytest session in a subprocess",
    "unit/test_ci_no_silent_green.py": "two inner pytest sessions in subprocesses",
    "hw/test_npu_marker.py": "six inner pytest sessions in subprocesses",
    "unit/test_cli_streams.py": "runs, profiles and plans through the CLI",
    "unit/test_cli_ux_output.py": "a subprocess run with static kernels",
    "fuzz": "hypothesis with hundreds of examples per test",
    "unit/test_compile.py": "compiles models",
    "unit/test_compile_cache.py": "compiles the same model cold and warm",
    "unit/test_scenario.py": "runs scenarios against engines",
    "unit/test_threads.py": "builds several engines",
    "ranks/test_cli.py": "multi-rank runs of the CLI, one with 105 graphs per rank",
    "unit/test_plugin_outside.py": "inner pytest sessions in subprocesses, two with the simulator",
    "unit/test_caller_warnings.py": "`python -m ascendgraph` subprocesses under warning filters",
    "unit/test_matcher_differential.py": "traces preset models and runs inductor's matcher beside ours",
    "unit/test_torch_autoload.py": "seven subprocesses that each import torch",
    "unit/test_traced_cache.py": "two engine runs per test with a compile cache of its own",
    "unit/test_dynamo_gate.py": "warm runs in subprocesses",
    "unit/test_cli_collector.py": "CLI runs in subprocesses",
    "hw/test_facade_recovery.py": "inner pytest sessions on the facade",
    "hw/test_hw_on_facade.py": "runs hw/ on the facade, capturing full graphs",
    "sim/test_npu_device.py": "builds the npu device extension in a subprocess",
    "sim/test_warmup.py": "runs engines with both warm-up kinds",
}


def _rank(path: str) -> int:
    try:
        relative = Path(path).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return len(COSTLY_FIRST)
    for rank, prefix in enumerate(COSTLY_FIRST):
        if relative == prefix or relative.startswith(prefix + "/"):
            return rank
    return len(COSTLY_FIRST)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ranks: dict[str, int] = {}  # per file: a few hundred files for thousands of items

    def rank(item: pytest.Item) -> int:
        path = str(item.path)
        if path not in ranks:
            ranks[path] = _rank(path)
        return ranks[path]

    items.sort(key=rank)  # stable: collection order within a rank


@pytest.fixture(scope="session")
def _worker_compile_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("worker-compile-cache")


@pytest.fixture
def worker_compile_cache(_isolated_ascendgraph_cache: None, _worker_compile_dir: Path) -> Path:
    """The compile cache's entries (``<cache>/compile``: traced graphs and pass results) shared by
    the tests of one xdist worker that use this fixture; everything else in the test's cache
    directory (static-kernel builds, ...) stays its own (the root conftest's per-test
    ASCENDGRAPH_CACHE_DIR). Returns the shared directory.

    For tests that run engines and never look at the compile cache themselves: with a cache of
    its own every such test paid a Dynamo trace (about 2 s of the 3.5 s of CPU of a small run;
    1.4 s with the trace cached). A cache hit only makes a run faster and never changes what it
    computes (ascendgraph/compile/cache.py); tests/unit/test_compile_cache.py and
    test_traced_cache.py check that contract with caches of their own. Tests that read, write,
    break or count cache entries must not use this fixture. One directory per worker: xdist
    workers never share it."""
    root = Path(os.environ["ASCENDGRAPH_CACHE_DIR"])
    root.mkdir(parents=True, exist_ok=True)
    (root / "compile").symlink_to(_worker_compile_dir, target_is_directory=True)
    return _worker_compile_dir


@pytest.fixture
def two_simulated_npus() -> Iterator[Any]:
    """The torch_npu facade installed with two simulated NPUs, ``npu:0`` and ``npu:1``
    (`sim.facade.configure_devices`); their FacadeRuntimes. One NPU and no facade afterwards."""
    from sim import facade

    facade.install(quiet=True)
    try:
        yield facade.configure_devices([{}, {}])
    finally:
        facade.configure()
        facade.uninstall()
