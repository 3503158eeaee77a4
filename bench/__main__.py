"""`python -m bench` (`make bench`): every figure of the performance issue beside its goal, in one run.

Sections (``--only NAME ...`` runs a subset; names in brackets):

1. [run] ``ascendgraph run`` (default: tiny, 4 layers, 35 sizes, 210 graphs, 16 requests) twice in
   fresh processes sharing a fresh cache directory: the first run (empty compile cache) and the
   second (warm caches): wall time, CPU time and peak RSS (``bench_proc.run_measured``); the
   tree's bytecode compiled first, as ``make run`` does;
2. [sim] simulator replay vs eager vs the floor, one decoder-block op sequence at batch
   1 / 8 / 64 (`bench_sim`): replay / eager, floor / eager, and replay's fraction of the way
   from eager to the floor (no goal: retired, replay is at the floor);
3. [capture] capture of the 210 graphs in a fresh process with an empty compile cache
   (cold) and again with the cache the first one filled (warm; the goal is for warm, docs/decisions.md "Performance figures");
4. [plan] the README's ``ascendgraph plan`` example in a fresh process, twice over one empty cache
   directory (the second finds its measurement in the plan cache; both are printed);
5. [api] ``ascendgraph.run(...)`` vs the same CLI run, idle and under a load the bench makes
   itself (one busy process per core);
6. [facade] a user's first test on the facade: one capture and replay of a test marked
   ``npu`` under ``pytest -m npu --npu-facade``, in a fresh process (`FACADE_TEST`);
7. [scale] the scaling grid: capture time, pool bytes and peak RSS for layers 4 / 16 / 28 x
   sizes 35 / 67 of the qwen3-0.6b-shaped preset (meta tensors, raised stream limit), with
   a line on how they grow (`bench_scale`);
8. [modes] replay vs eager per graph mode on tiny (host CPU time and simulated device time);
9. [padding] workload-aware / even-sampling padding waste (`bench_plan`);
10. [ranks] 64 simulated ranks running vLLM 0.27.1's own ``coordinate_batch_across_dp`` for 100
    steps (`bench_ranks_vllm`), in the vLLM Ascend environment (``.venv-vllm-ascend``, `make
    vllm-ascend-env`; ``ASCENDGRAPH_VLLM_ASCEND_PYTHON`` names another) under the facade
    launcher; "not measured" where that environment is missing;
11. [suite] the default test suite (``make test``'s steps after the set-up: the bytecode, then
    pytest) in a fresh clone of the working tree (no bytecode caches) — only with ``--suite``;
12. [ci] ``.ci/run``, all its steps — only with ``--ci``.

The suite and ``.ci/run`` (minutes each) are opt-in: ``--suite`` / ``--ci`` measure them fresh
("this run"); else their goal rows read what ``--record suite|ci`` (fresh too) last wrote to
``bench/recorded.json`` ("recorded <date>").

``--before TREE`` measures the process sections (run, capture, plan, api, facade) in a source
tree of the code before a change as well, each right before the same measurement here, and
prints the two side by side (the goals table is for this tree).

Results go to the file ``--out`` names, else to a new temporary file (printed at the end);
the tracked ``bench/results.json`` is written only with ``--update-baseline``. ``--quick`` is a
smoke run with the same keys (tiny inputs, one grid cell). No figure is asserted anywhere.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Optional, Sequence

from bench.bench_proc import ROOT, busy_load, python_command, run_measured
from bench.goals import GOALS, MIB, NOT_MEASURED, _fmt, goals, print_goals, print_side_by_side

BASELINE = os.path.join(ROOT, "bench", "results.json")
SCHEMA_VERSION = 2
NESTED_ENV = "ASCENDGRAPH_BENCH_NESTED"  # set in the suite's subprocess: never benchmark recursively
QUICK_MODES = ("FULL_DECODE_ONLY",)
SECTIONS = ("run", "sim", "capture", "plan", "api", "facade", "scale", "modes", "padding", "ranks", "suite", "ci")
OPT_IN_SECTIONS = ("suite", "ci")  # minutes each: measured only when asked (--suite / --ci / --only)
PROCESS_SECTIONS = ("run", "capture", "plan", "api", "facade")  # measured in a --before tree too
RECORDED = os.path.join(ROOT, "bench", "recorded.json")
# `make test`'s two steps after the set-up: the project's bytecode (scripts/compile_bytecode.py),
# then its pytest command.
RECORD_COMMANDS: dict[str, tuple[str, ...]] = {
    "suite": ("bash", "-c", f"{shlex.quote(sys.executable)} scripts/compile_bytecode.py && {shlex.quote(sys.executable)} "
              "-m pytest -n auto --dist worksteal -q -p no:cacheprovider"),
    "ci": ("bash", ".ci/run"),
}
RESULT_KEYS = ("schema_version", "quick", "started", "environment", "sections", "goals", "seconds")

RUN_ARGS: tuple[str, ...] = ()  # the default `ascendgraph run`
QUICK_RUN_ARGS = ("--num-layers", "1", "--requests", "2", "--max-num-seqs", "4")
PLAN_ARGS = ("--num-layers", "2", "-O1", "--stream-limit", "40", "--requests", "64", "--budget", "8")
QUICK_PLAN_ARGS = ("--num-layers", "1", "-O1", "--stream-limit", "40", "--requests", "8", "--budget", "2")


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


def _env(root: str = ROOT, **extra: str) -> dict[str, str]:
    env = {**os.environ, **extra}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
    return env


def _load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def _proc_row(figures: Any) -> dict[str, Any]:
    return {"command": figures.command, "exit_code": figures.exit_code, "wall_s": figures.wall_s,
            "cpu_s": figures.cpu_s, "peak_rss_bytes": figures.peak_rss_bytes, "load_average": _load()}


# --------------------------------------------------------------------------- sections


def compile_bytecode(root: str) -> None:
    """The tree's bytecode, as `make run` leaves it before the run (scripts/compile_bytecode.py)."""
    subprocess.run([sys.executable, os.path.join(root, "scripts", "compile_bytecode.py")], cwd=root, check=True,
                   stdout=subprocess.DEVNULL)


def section_run(quick: bool, root: str = ROOT) -> dict[str, Any]:
    args = QUICK_RUN_ARGS if quick else RUN_ARGS
    if os.path.exists(os.path.join(root, "scripts", "compile_bytecode.py")):  # a --before tree may predate it
        compile_bytecode(root)
    rows: dict[str, Any] = {"args": list(args)}
    with tempfile.TemporaryDirectory(prefix="ascendgraph-bench-cache-") as cache_dir:
        for name in ("first", "second"):  # a fresh compile cache, then the cache the first run filled
            figures = run_measured(python_command("-m", "ascendgraph", "run", *args),
                                   env=_env(root, ASCENDGRAPH_CACHE_DIR=cache_dir), cwd=root)
            rows[name] = _proc_row(figures)
            print(f"\n1. ascendgraph run {' '.join(args) or '(default)'}, {name} run: {figures.wall_s:.1f} s wall, "
                  f"{figures.cpu_s:.1f} s CPU, peak RSS {figures.peak_rss_bytes / MIB:.0f} MiB, exit "
                  f"{figures.exit_code} (load {_load()})")
    return rows


def section_sim(quick: bool, repeats: Optional[int] = None) -> dict[str, Any]:
    import torch

    from ascendgraph.device import get_device
    from bench.bench_sim import build, floor_calls, interleaved_many, make_floor

    batches, default_repeats = ([1, 8], 5) if quick else ([1, 8, 64], 200)
    repeats = repeats or default_repeats
    rows = []
    for batch in batches:
        device = get_device("sim", allow_float32_attention=True)  # a float32 model: the declared leniency
        step, _ = build(batch)
        with torch.no_grad():
            step()
            graph = device.new_graph()
            start = time.perf_counter()
            with device.graph(graph):
                step()
            capture_ms = (time.perf_counter() - start) * 1e3
            graph.replay()
            floor = make_floor(floor_calls(graph))
            (eager, replay, floor_us), (_, ratio, floor_ratio) = interleaved_many([step, graph.replay, floor], repeats)
        gap = eager - floor_us
        rows.append({"batch": batch, "tasks": graph.num_tasks, "eager_us": eager, "replay_us": replay,
                     "floor_us": floor_us, "ratio": ratio, "floor_ratio": floor_ratio,
                     "fraction_to_floor": (eager - replay) / gap if gap > 0 else None, "capture_ms": capture_ms})
    print(f"\n2. simulator replay vs eager vs floor, one decoder-block op sequence (median of {repeats} interleaved "
          "rounds, CPU time)")
    print(f"   {'batch':>5} {'tasks':>5} {'eager us':>9} {'replay us':>10} {'floor us':>9} {'replay/eager':>12} "
          f"{'floor/eager':>11} {'way to floor':>12}")
    for row in rows:
        print(f"   {row['batch']:>5} {row['tasks']:>5} {row['eager_us']:>9.1f} {row['replay_us']:>10.1f} "
              f"{row['floor_us']:>9.1f} {row['ratio']:>12.2f} {row['floor_ratio']:>11.2f} "
              f"{_fmt(None if row['fraction_to_floor'] is None else row['fraction_to_floor'] * 100, 0):>11}%")
    return {"repeats": repeats, "batches": rows}


def _capture_once(cache_dir: str, quick: bool, out: str, root: str = ROOT) -> dict[str, Any]:
    argv = python_command("-m", "bench.bench_engine", "--modes", "--json", out) + (["--quick-capture"] if quick else [])
    figures = run_measured(argv, env=_env(root, ASCENDGRAPH_CACHE_DIR=cache_dir), cwd=root)
    row: dict[str, Any] = {"process": _proc_row(figures)}
    if figures.exit_code == 0:
        with open(out, encoding="utf-8") as handle:
            row.update(json.load(handle)["capture_default_tiny"])
    else:
        row["error"] = figures.stderr_tail
    return row


def section_capture(quick: bool, root: str = ROOT) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ascendgraph-bench-cache-") as cache_dir:
        out = os.path.join(cache_dir, "capture.json")
        cold = _capture_once(cache_dir, quick, out, root)
        warm = _capture_once(cache_dir, quick, out, root)
    print("\n3. capture of every default size of tiny" + (" (quick: 1 layer, max_num_seqs 8)" if quick else ""))
    for name, row in (("cold", cold), ("warm", warm)):
        if "capture_seconds" not in row:
            print(f"   {name}: FAILED: {row.get('error', '')}")
            continue
        total = row["capture_seconds"] + row["compile_seconds"]
        cpu = row.get("capture_cpu_seconds", 0.0) + row.get("compile_cpu_seconds", 0.0)
        print(f"   {name} compile cache: {row['graphs']} graphs, capture {row['capture_seconds']:.2f} s + compile "
              f"{row['compile_seconds']:.2f} s = {total:.2f} s wall ({total / max(row['graphs'], 1) * 1e3:.1f} ms per "
              f"graph), {cpu:.2f} s CPU; pool {row['pool_bytes'] / MIB:.1f} MiB"
              + (f" (host {row['pool_host_bytes'] / MIB:.1f} MiB)" if row.get("pool_host_bytes") is not None else "")
              + "; compile cache "
              f"{row.get('compile_cache', '?')} (load {row['process']['load_average']})")
    return {"cold": cold, "warm": warm}


def section_plan(quick: bool, root: str = ROOT) -> dict[str, Any]:
    args = QUICK_PLAN_ARGS if quick else PLAN_ARGS
    command = python_command("-m", "ascendgraph", "plan", *args)
    # Twice with one empty cache directory: the first plan measures (and compiles), the second
    # finds its measurement in the plan cache (docs/plan.md) — the row's figure, the first beside it.
    with tempfile.TemporaryDirectory(prefix="ascendgraph-bench-plan-") as cache_dir:
        env = _env(root, ASCENDGRAPH_CACHE_DIR=cache_dir)
        first = run_measured(command, env=env, cwd=root)
        again = run_measured(command, env=env, cwd=root)
    print(f"\n4. ascendgraph plan {' '.join(args)}: {again.wall_s:.1f} s wall, {again.cpu_s:.1f} s CPU, "
          f"exit {again.exit_code} (second plan, same caches); first with empty caches {first.wall_s:.1f} s wall, "
          f"{first.cpu_s:.1f} s CPU (load {_load()})")
    return {**_proc_row(again), "first": _proc_row(first), "args": list(args)}


# A user's first test on the facade: one capture and one replay through torch_npu's API, on an
# npu tensor (a host tensor's op runs eagerly during a capture and is not replayed, on a card as
# on the facade).
FACADE_TEST = """\
import pytest
import torch


@pytest.mark.npu
def test_one_capture_and_replay():
    import torch_npu

    x = torch.ones(4, device="npu")
    graph = torch_npu.npu.NPUGraph()
    with torch_npu.npu.graph(graph):
        y = x * 2
    x.fill_(3.0)
    graph.replay()
    torch_npu.npu.synchronize()
    assert y.tolist() == [6.0, 6.0, 6.0, 6.0]
"""


def section_facade(quick: bool, root: str = ROOT) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ascendgraph-bench-facade-") as scratch:
        path = os.path.join(scratch, "test_first_facade.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(FACADE_TEST)
        argv = python_command("-m", "pytest", "-m", "npu", "--npu-facade", "-q", "-p", "no:cacheprovider",
                              "--rootdir", scratch, path)  # the plugin is the installed pytest11 entry point
        figures = run_measured(argv, env=_env(root), cwd=scratch)
    print(f"\n6. first facade test (pytest -m npu --npu-facade, one capture and replay): {figures.wall_s:.1f} s "
          f"wall, {figures.cpu_s:.1f} s CPU, exit {figures.exit_code} (load {_load()})")
    row = _proc_row(figures)
    if figures.exit_code != 0:
        row["error"] = figures.stdout_tail + "\n" + figures.stderr_tail
    return row


API_CODE = "import sys, ascendgraph; sys.exit(0 if ascendgraph.run({config}, device='sim'{extra}).ok else 1)"


def section_api(quick: bool, root: str = ROOT) -> dict[str, Any]:
    cli_args = QUICK_RUN_ARGS if quick else RUN_ARGS
    config, extra = ("{'num_layers': 1, 'max_num_seqs': 4}", ", requests=2") if quick else ("None", "")
    api = python_command("-c", API_CODE.format(config=config, extra=extra))
    cli = python_command("-m", "ascendgraph", "run", "--device", "sim", *cli_args)
    rows: dict[str, Any] = {}
    for load in ("idle", "loaded"):
        if load == "idle":
            pair = (run_measured(cli, env=_env(root), cwd=root), run_measured(api, env=_env(root), cwd=root))
            pids: list[int] = []
        else:
            with busy_load(1 if quick else None) as pids:
                pair = (run_measured(cli, env=_env(root), cwd=root), run_measured(api, env=_env(root), cwd=root))
        rows[load] = {"cli": _proc_row(pair[0]), "api": _proc_row(pair[1]), "busy_processes": len(pids),
                      "api_over_cli": pair[1].wall_s / pair[0].wall_s if pair[0].wall_s else None}
    print("\n5. Python API vs CLI, the same run" + (" (quick config)" if quick else " (default config)"))
    for load, row in rows.items():
        busy = f", {row['busy_processes']} busy process(es)" if row["busy_processes"] else ""
        print(f"   {load}{busy}: CLI {row['cli']['wall_s']:.1f} s ({row['cli']['cpu_s']:.1f} s CPU), API "
              f"{row['api']['wall_s']:.1f} s ({row['api']['cpu_s']:.1f} s CPU) (API/CLI {_fmt(row['api_over_cli'])}; "
              f"exits {row['cli']['exit_code']}/{row['api']['exit_code']}; load {row['cli']['load_average']})")
    return rows


def parse_cell(text: str) -> tuple[int, int]:
    """``LAYERSxSIZES`` (e.g. ``28x67``) -> (layers, sizes)."""
    from bench.bench_scale import GRID_SIZES

    layers, _, sizes = text.lower().partition("x")
    if not (layers.isdigit() and sizes.isdigit() and int(layers) >= 1 and int(sizes) in GRID_SIZES):
        raise argparse.ArgumentTypeError(f"expected LAYERSxSIZES with SIZES in {GRID_SIZES}, got {text!r}")
    return int(layers), int(sizes)


def section_scale(quick: bool, grid: Optional[Sequence[tuple[int, int]]] = None) -> dict[str, Any]:
    from bench.bench_scale import GRID_LAYERS, GRID_SIZES, growth_note

    if grid:
        cells = list(grid)
    else:
        cells = [(2, 35)] if quick else [(layers, sizes) for sizes in GRID_SIZES for layers in GRID_LAYERS]
    rows = []
    for layers, sizes in cells:
        figures = run_measured(python_command("-m", "bench.bench_scale", str(layers), str(sizes)), env=_env())
        row: dict[str, Any] = {"layers": layers, "sizes": sizes, "peak_rss_bytes": figures.peak_rss_bytes,
                               "wall_s": figures.wall_s, "exit_code": figures.exit_code}
        if figures.exit_code == 0:
            row.update(json.loads(figures.stdout_tail.splitlines()[-1]))
        else:
            row["error"] = figures.stderr_tail
        rows.append(row)
    note = growth_note(rows)
    print("\n7. scaling grid, qwen3-0.6b-shaped, FULL_AND_PIECEWISE, meta tensors, stream limit raised")
    print(f"   {'layers':>6} {'sizes':>5} {'graphs':>6} {'compile s':>9} {'capture s':>9} {'ms/graph':>8} "
          f"{'pool MiB':>9} {'peak RSS MiB':>12}")
    for row in rows:
        if "capture_seconds" not in row:
            print(f"   {row['layers']:>6} {row['sizes']:>5} FAILED: {row.get('error', '')[-200:]}")
            continue
        print(f"   {row['layers']:>6} {row['sizes']:>5} {row['graphs']:>6} {row['compile_seconds']:>9.2f} "
              f"{row['capture_seconds']:>9.2f} {row['ms_per_graph']:>8.1f} {row['pool_bytes'] / MIB:>9.1f} "
              f"{row['peak_rss_bytes'] / MIB:>12.0f}")
    if note:
        print(f"   growth: {note}")
    return {"cells": rows, "growth": note}


def section_modes(quick: bool, seed: int) -> dict[str, Any]:
    from bench.bench_engine import MODES, bench_mode

    modes, requests = (QUICK_MODES, 1) if quick else (MODES, 16)
    rows = {mode: bench_mode(mode, requests, seed) for mode in modes}
    print(f"\n8. replay vs eager per mode, tiny ({requests} requests; host CPU time and simulated device time)")
    print(f"   {'mode':<20} {'steps':>5} {'graph CPU ms':>13} {'eager CPU ms':>13} {'CPU ratio':>10} {'sim ratio':>10}")
    for mode, row in rows.items():
        print(f"   {mode:<20} {row['steps']:>5} {row['graph_cpu_ms']:>13.1f} {row['eager_cpu_ms']:>13.1f} "
              f"{_fmt(row['cpu_ratio']):>10} {_fmt(row['sim_ratio']):>10}{'' if row['ok'] else '   FAILED'}")
    return {"model": "tiny", "requests": requests, "modes": rows}


def section_padding(quick: bool, seed: int) -> dict[str, Any]:
    from bench.bench_plan import bench_padding, format_padding

    result = bench_padding(8, 24 if quick else 96, seed)
    print("\n9. " + format_padding(result).replace("\n", "\n   "))
    return result


VLLM_ASCEND_PYTHON_ENV = "ASCENDGRAPH_VLLM_ASCEND_PYTHON"
RANKS_VLLM = {"dp": 64, "steps": 100}
QUICK_RANKS_VLLM = {"dp": 4, "steps": 5}


def vllm_ascend_python(root: str = ROOT) -> Optional[str]:
    """The vLLM Ascend environment's python (``$ASCENDGRAPH_VLLM_ASCEND_PYTHON``, else the
    ``.venv-vllm-ascend`` link `make vllm-ascend-env` leaves in the tree), or None."""
    named = os.environ.get(VLLM_ASCEND_PYTHON_ENV) or os.path.join(root, ".venv-vllm-ascend", "bin", "python")
    return named if os.path.isfile(named) and os.access(named, os.X_OK) else None


def section_ranks(quick: bool, root: str = ROOT) -> dict[str, Any]:
    """`bench_ranks_vllm` in the vLLM Ascend environment, under the facade launcher (vLLM Ascend's
    platform imports torch_npu); the figure is the run's own wall time, printed by the module."""
    size = QUICK_RANKS_VLLM if quick else RANKS_VLLM
    title = f"\n10. {size['dp']} ranks x {size['steps']} steps of vLLM's coordinate_batch_across_dp"
    python = vllm_ascend_python(root)
    if python is None:
        reason = f"needs the vLLM Ascend environment (make vllm-ascend-env, or ${VLLM_ASCEND_PYTHON_ENV})"
        print(f"{title}: {NOT_MEASURED} ({reason})")
        return {"skipped": True, "reason": reason, **size}
    figures = run_measured([python, "-m", "sim.facade", "--", python, "-m", "bench.bench_ranks_vllm",
                            "--dp", str(size["dp"]), "--steps", str(size["steps"])], env=_env(root), cwd=root,
                           timeout_s=1800)
    row: dict[str, Any] = {"skipped": False, **size, "exit_code": figures.exit_code,
                           "process": _proc_row(figures)}
    try:
        row.update(json.loads(figures.stdout_tail.strip().splitlines()[-1]))
    except (ValueError, IndexError):
        row["error"] = (figures.stderr_tail.strip().splitlines() or ["no output"])[-1]
    if "wall_s" in row:
        print(f"{title}: {row['wall_s']:.1f} s wall for the run ({figures.wall_s:.1f} s with the interpreter's "
              f"start and imports), collectives {row['collectives_met']}")
    else:
        print(f"{title}: failed (exit {figures.exit_code}): {row.get('error')}")
    return row


def section_suite(enabled: bool) -> dict[str, Any]:
    return _section_recordable("suite", enabled, "11. test suite")


def section_ci(enabled: bool) -> dict[str, Any]:
    return _section_recordable("ci", enabled, "12. .ci/run")


def _section_recordable(name: str, enabled: bool, title: str) -> dict[str, Any]:
    """Measure the suite or .ci/run fresh in this run (opt-in; never from inside the suite)."""
    reason = f"opt-in: --{name}" if not enabled else "running inside the test suite" if os.environ.get(NESTED_ENV) else None
    if reason is not None:
        print(f"\n{title}: {NOT_MEASURED} ({reason})")
        return {"skipped": True, "reason": reason, "seconds": None}
    row = measure_recordable(name)
    print(f"\n{title} ({row['command']}): {row['seconds']:.1f} s wall, {row['cpu_seconds']:.0f} s CPU, exit "
          f"{row['exit_code']}: {row['summary']} (load {row['load_average']})")
    return {"skipped": False, **row}


def summary_line(stdout_tail: str, stderr_tail: str) -> str:
    """The line that sums a recorded command up: the last non-blank line of its stdout (pytest's
    result line, ``.ci/run``'s last step and total), else of its stderr (logs and notices)."""
    for text in (stdout_tail, stderr_tail):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        if lines:
            return lines[-1]
    return ""


def fresh_clone(root: str, into: str) -> str:
    """Copy the working tree's files as a fresh clone has them (tracked and new, unignored files;
    no ``__pycache__`` bytecode, no pytest cache) into ``into``; returns ``into``."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = os.path.join(root, name)
        if os.path.isfile(source):  # a file deleted from the tree but not yet from the index is skipped
            target = os.path.join(into, name)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            shutil.copy2(source, target)
    return into


def measure_recordable(name: str) -> dict[str, Any]:
    """Run the suite (``make test``'s pytest command) or ``.ci/run`` once, timed (wall, CPU of
    every process it started, load average at the end). The suite runs in a fresh clone of the
    working tree (`fresh_clone`: no bytecode caches), the condition of its goal; ``.ci/run``
    in the working tree itself (CI runs it in its own checkout)."""
    command = RECORD_COMMANDS[name]
    with tempfile.TemporaryDirectory(prefix="ascendgraph-bench-clone-") as clone:
        root = fresh_clone(ROOT, clone) if name == "suite" else ROOT
        figures = run_measured(command, env=_env(root, **{NESTED_ENV: "1"}), cwd=root, timeout_s=6 * 3600.0)
    return {"command": " ".join(os.path.basename(c) if i == 0 else c for i, c in enumerate(command)),
            "fresh_clone": name == "suite",
            "seconds": figures.wall_s, "cpu_seconds": figures.cpu_s, "exit_code": figures.exit_code,
            "summary": summary_line(figures.stdout_tail, figures.stderr_tail), "load_average": _load(),
            "cpus": os.cpu_count(),
            "recorded": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def read_recorded(path: str = RECORDED) -> dict[str, Any]:
    """The figures ``--record`` last wrote ({} when there are none or the file is unreadable)."""
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, ValueError):
        return {}
    return document if isinstance(document, dict) else {}


def record(names: Sequence[str], path: str = RECORDED) -> dict[str, Any]:
    """``--record suite|ci``: measure and keep the figures for the goals rows of later runs."""
    document = read_recorded(path)
    for name in names:
        row = measure_recordable(name)
        document[name] = row
        print(f"recorded {name}: {row['command']}: {row['seconds']:.0f} s wall, {row['cpu_seconds']:.0f} s CPU, exit "
              f"{row['exit_code']} (load {row['load_average']})")
    write_json_atomic(path, document)
    # the goal rows of what was just measured (the same figures, fresh: "this run")
    fresh = {name: {"skipped": False, **document[name]} for name in names}
    print_goals([row for row in goals(fresh, {}) if row["now"] != NOT_MEASURED])
    return document


# --------------------------------------------------------------------------- main


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny inputs, one grid cell, same keys")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"run only these sections ({', '.join(SECTIONS)})")
    parser.add_argument("--suite", action="store_true", help="also time the default test suite, fresh (minutes)")
    parser.add_argument("--ci", action="store_true", help="also time .ci/run, all steps, fresh (tens of minutes)")
    parser.add_argument("--grid", nargs="+", type=parse_cell, metavar="LxS",
                        help="scaling-grid cells to measure, e.g. 4x35 28x67 (default: layers 4 16 28 x sizes 35 67)")
    parser.add_argument("--repeats", type=int, default=None, metavar="N",
                        help="interleaved rounds of the sim section (default 200; --quick: 5)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads in this process (default 1)")
    parser.add_argument("--out", default=None, metavar="FILE", help="results file (default: a new temporary file)")
    parser.add_argument("--update-baseline", action="store_true",
                        help=f"also write the tracked baseline {os.path.relpath(BASELINE)}")
    parser.add_argument("--before", default=None, metavar="TREE",
                        help="a source tree of the code before a change: the process sections run there too, "
                             "each right before the same measurement here, printed side by side")
    parser.add_argument("--record", nargs="+", choices=sorted(RECORD_COMMANDS), metavar="WHAT",
                        help="time the suite (make test's pytest) and/or .ci/run once and keep the figures in "
                             f"{os.path.relpath(RECORDED)} for the goals rows; measures nothing else")
    args = parser.parse_args(argv)
    if args.before is not None and not os.path.isdir(os.path.join(args.before, "ascendgraph")):
        parser.error(f"--before {args.before!r} is not a source tree of ascendgraph (no ascendgraph/ directory in it)")
    if args.record:
        record(args.record)
        return 0

    import torch

    previous_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args)
    finally:
        torch.set_num_threads(previous_threads)


def _run(args: argparse.Namespace) -> int:
    import torch

    started = time.perf_counter()
    quick = args.quick
    chosen = list(args.only) if args.only else list(SECTIONS)
    for name in OPT_IN_SECTIONS:
        if getattr(args, name) and name not in chosen:
            chosen.append(name)
    print(f"ascendgraph bench: torch {torch.__version__}, {args.threads} thread(s) here, {os.cpu_count()} CPUs, "
          f"load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}" + (" (quick)" if quick else ""))
    runners: dict[str, Callable[[str], dict[str, Any]]] = {
        "run": lambda root: section_run(quick, root),
        "sim": lambda root: section_sim(quick, args.repeats),
        "capture": lambda root: section_capture(quick, root),
        "plan": lambda root: section_plan(quick, root),
        "api": lambda root: section_api(quick, root),
        "facade": lambda root: section_facade(quick, root),
        "scale": lambda root: section_scale(quick, args.grid),
        "modes": lambda root: section_modes(quick, args.seed),
        "padding": lambda root: section_padding(quick, args.seed),
        "ranks": lambda root: section_ranks(quick, root),
        "suite": lambda root: section_suite(args.suite or "suite" in (args.only or ())),
        "ci": lambda root: section_ci(args.ci or "ci" in (args.only or ())),
    }
    sections: dict[str, Any] = {}
    before: dict[str, Any] = {}
    for name in SECTIONS:
        if name not in chosen:
            continue
        if args.before is not None and name in PROCESS_SECTIONS:
            print(f"\n-- before ({args.before}):", end="")
            before[name] = runners[name](os.path.abspath(args.before))
            print("\n-- after (this tree):", end="")
        sections[name] = runners[name](ROOT)
    table = goals(sections, read_recorded())
    if before:
        print_side_by_side(goals(before, {}), table)
    print_goals(table)
    results: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "quick": quick,
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "environment": {"python": platform.python_version(), "torch": torch.__version__, "threads": args.threads,
                        "cpus": os.cpu_count(), "machine": platform.machine(), "load_average": os.getloadavg()},
        "sections": sections,
        "goals": table,
        "before": {"tree": os.path.abspath(args.before), "sections": before} if before else None,
        "seconds": time.perf_counter() - started,
    }
    out = args.out
    if out is None:
        handle, out = tempfile.mkstemp(prefix="ascendgraph-bench-", suffix=".json")
        os.close(handle)
    write_json_atomic(out, results)
    targets = [out]
    if args.update_baseline and os.path.abspath(out) != os.path.abspath(BASELINE):
        write_json_atomic(BASELINE, results)
        targets.append(BASELINE)
    print(f"\nresults: {', '.join(targets)} ({results['seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
