"""A widened half-precision product split across two threads vs computed in one piece.

`sim.matmul` computes a large bfloat16 product widened to float64 with its output columns in
chunks shared by the calling thread and a helper thread (`sim.matmul.split_chunks`). This
measures, for the
products of a default ``ascendgraph run`` (hidden 512, intermediate 1024, vocab 2048; rows:
a decode batch of 4 and 16, a prefill of 458 tokens), the median wall time of the split and of
the one-piece product (``split=False``), timed in alternation so machine noise hits both
alike, the median per-round ratio split / one piece, and the CPU time of each; with
``--busy N``, while N busy processes load the machine (a loaded machine: the split must not
be slower there). Torch runs one intra-op thread, as under ``ascendgraph run``. No
assertions: this is a measurement. Run: ``python -m bench.bench_matmul [--repeats N]
[--busy N] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from typing import Any, Callable

import torch

from bench.bench_proc import busy_load
from sim.matmul import SPLIT_MIN_WORK, product_work, split_chunks, widened_matmul

aten = torch.ops.aten
SHAPES = [(rows, inner, columns) for rows in (4, 16, 458) for inner, columns in ((512, 2048), (512, 1024), (1024, 512))]


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(rows: int, inner: int, columns: int, repeats: int) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(rows, inner, generator=gen).bfloat16()
    weight = torch.randn(columns, inner, generator=gen).bfloat16()
    args = (a, weight.t())
    split = lambda: widened_matmul(aten.mm.default, args, {}, split=True)  # noqa: E731
    whole = lambda: widened_matmul(aten.mm.default, args, {}, split=False)  # noqa: E731
    for _ in range(3):
        split()
        whole()
    figures: dict[str, list[float]] = {"split_wall": [], "split_cpu": [], "whole_wall": [], "whole_cpu": [], "ratio": []}
    for _ in range(repeats):
        (sw, sc), (ww, wc) = _timed(split), _timed(whole)
        for key, value in (("split_wall", sw), ("split_cpu", sc), ("whole_wall", ww), ("whole_cpu", wc)):
            figures[key].append(value)
        figures["ratio"].append(sw / ww if ww else 1.0)
    row: dict[str, Any] = {"rows": rows, "inner": inner, "columns": columns, "work": product_work(a.shape, weight.t().shape),
                           "split_by_default": bool(split_chunks(args))}
    row.update({key: statistics.median(values) for key, values in figures.items()})
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--busy", type=int, default=0, help="measure while this many busy processes run")
    parser.add_argument("--json", help="write the rows to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with busy_load(args.busy) if args.busy else contextlib.nullcontext():
        rows = [measure(*shape, repeats=max(3, args.repeats * 16 // max(16, shape[0]))) for shape in SHAPES]
    busy = f", {args.busy} busy processes" if args.busy else ""
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"widened bfloat16 mm, split across two threads vs one piece (median of interleaved rounds{busy}; "
          f"load {load}; split by default from {SPLIT_MIN_WORK:,} multiply-adds)")
    print(f"   {'M x K x N':>16} {'split?':>6} {'split ms':>9} {'one ms':>7} {'split/one':>9} "
          f"{'split CPU ms':>12} {'one CPU ms':>10}")
    for row in rows:
        shape = f"{row['rows']}x{row['inner']}x{row['columns']}"
        print(f"   {shape:>16} {'yes' if row['split_by_default'] else 'no':>6} {row['split_wall'] * 1e3:>9.2f} "
              f"{row['whole_wall'] * 1e3:>7.2f} {row['ratio']:>9.2f} {row['split_cpu'] * 1e3:>12.2f} "
              f"{row['whole_cpu'] * 1e3:>10.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(rows, handle, indent=1)


if __name__ == "__main__":
    main()
