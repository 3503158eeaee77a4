"""Simulator replay cost vs eager, and capture time per graph.

Runs a decoder-block-sized op sequence (a Qwen3-like block: rms_norm, qkv projection,
q/k norm + rope, KV-cache write, paged attention, o projection, add + rms_norm, SwiGLU MLP;
hidden 512, 4 heads x 128, 2 KV heads, intermediate 1024, repeated for 4 layers) in decode
batches of 1, 8 and 64 tokens, and reports the median host CPU time of

* eager: the ops issued directly (torch.no_grad),
* replay: ``graph.replay()`` of the same sequence captured on a SimDevice (timed in
  alternation with eager, so machine noise hits both alike),

* floor: the same aten overloads the graph recorded, called directly in a loop (the C++
  overload handles, no dispatch mode, no Python wrapper, no copy into captured outputs) —
  what the kernels cost on their own (docs/decisions.md "Performance figures"); a
  half-precision matmul is called as a replay computes it, widened (`sim.matmul`), while
  eager runs torch's own bfloat16 kernel,

their ratios to eager (goals: replay <= 0.5 / 0.7 / 0.9 at batch 1 / 8 / 64), replay's
fraction of the way from eager to the floor, the number of recorded tasks, and the capture
time per graph (median of 5 captures, wall clock).
No assertions: this is a measurement. Run: ``python bench/bench_sim.py [--repeats N]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Callable

import torch

from ascendgraph import ops
from ascendgraph.device import get_device

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, LAYERS = 512, 4, 2, 128, 1024, 4
BLOCK_SIZE, KV_LEN = 16, 64


def build(batch: int, seed: int = 0) -> tuple[Callable[[], torch.Tensor], dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * 0.05

    q_size, kv_size = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    layers = [
        dict(
            ln1=torch.ones(HIDDEN), ln2=torch.ones(HIDDEN), qkv=w(q_size + 2 * kv_size, HIDDEN),
            qn=torch.ones(HEAD_DIM), kn=torch.ones(HEAD_DIM), o=w(HIDDEN, q_size),
            gate_up=w(2 * INTERMEDIATE, HIDDEN), down=w(HIDDEN, INTERMEDIATE),
            kc=torch.zeros(batch * 8, BLOCK_SIZE, KV_HEADS, HEAD_DIM),
            vc=torch.zeros(batch * 8, BLOCK_SIZE, KV_HEADS, HEAD_DIM),
        )
        for _ in range(LAYERS)
    ]
    inputs = dict(
        hidden=torch.randn(batch, HIDDEN, generator=g),
        positions=torch.full((batch,), KV_LEN - 1, dtype=torch.long),
        slots=torch.arange(batch, dtype=torch.long) * 8 * BLOCK_SIZE + KV_LEN - 1,
        block_table=torch.arange(batch * 8, dtype=torch.int32).view(batch, 8),
    )
    cos_sin = torch.randn(4096, HEAD_DIM, generator=g)
    ends = list(range(1, batch + 1))
    seq_lens = [KV_LEN] * batch
    scale = 1 / math.sqrt(HEAD_DIM)

    def step() -> torch.Tensor:
        h = inputs["hidden"]
        residual = h
        x = ops.rms_norm(h, layers[0]["ln1"], 1e-6)
        for i, p in enumerate(layers):
            if i:
                x, residual = ops.add_rms_norm(h, residual, p["ln1"], 1e-6)
            qkv = torch.nn.functional.linear(x, p["qkv"])
            q, k, v = ops.split_qkv_rmsnorm_rope(
                qkv, p["qn"], p["kn"], inputs["positions"], cos_sin, q_size, kv_size, HEAD_DIM, 1e-6, True
            )
            ops.reshape_and_cache(
                k.view(-1, KV_HEADS, HEAD_DIM), v.view(-1, KV_HEADS, HEAD_DIM), p["kc"], p["vc"], inputs["slots"]
            )
            attn = torch.empty(batch, HEADS, HEAD_DIM)
            ops.paged_attention(
                q.view(-1, HEADS, HEAD_DIM), p["kc"], p["vc"], inputs["block_table"], ends, seq_lens, scale, attn
            )
            h = torch.nn.functional.linear(attn.view(batch, -1), p["o"])
            x, residual = ops.add_rms_norm(h, residual, p["ln2"], 1e-6)
            gate, up = torch.nn.functional.linear(x, p["gate_up"]).chunk(2, dim=-1)
            h = torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, p["down"])
        return h + residual

    return step, inputs


def floor_calls(graph: object) -> list[tuple[Callable[..., object], tuple, dict]]:
    """The recorded ops of a captured SimGraph as (C++ overload handle, args, kwargs); a
    half-precision matmul as the widened call a replay makes of it (`sim.matmul`), so the
    floor computes what the replay computes."""
    from sim.matmul import widened_call

    program = getattr(graph, "program")
    calls = []
    for record in program.records:
        func = getattr(record, "func", None)
        if func is not None:  # OpRecord (ControlRecords carry no kernel)
            kwargs = dict(record.kwargs)
            calls.append((widened_call(func, record.args, kwargs) or func._op, record.args, kwargs))
    return calls


def make_floor(calls: list[tuple[Callable[..., object], tuple, dict]]) -> Callable[[], None]:
    """The floor: the kernels called back to back, nothing else (below autograd, as replay)."""

    def floor() -> None:
        with torch._C._AutoDispatchBelowADInplaceOrView():
            for op, args, kwargs in calls:
                op(*args, **kwargs)

    return floor


def interleaved_many(callables: list[Callable[[], object]], repeats: int) -> tuple[list[float], list[float]]:
    """Median CPU time (us) of each callable, and the median per-round ratio of each to the
    first; timed in alternation so machine noise hits all alike."""
    for _ in range(5):
        for fn in callables:
            fn()
    times: list[list[float]] = [[] for _ in callables]
    ratios: list[list[float]] = [[] for _ in callables]
    for _ in range(repeats):
        marks = [time.process_time_ns()]
        for fn in callables:
            fn()
            marks.append(time.process_time_ns())
        spans = [max(1, b - a) for a, b in zip(marks, marks[1:])]
        for index, span in enumerate(spans):
            times[index].append(span / 1000.0)
            ratios[index].append(span / spans[0])
    return [statistics.median(t) for t in times], [statistics.median(r) for r in ratios]


def interleaved_us(first: Callable[[], object], second: Callable[[], object], repeats: int) -> tuple[float, float, float]:
    """Median CPU time of each callable and the median of their per-round ratio, timed in
    alternation so that machine noise hits both alike."""
    for _ in range(5):
        first()
        second()
    a, b, ratios = [], [], []
    for _ in range(repeats):
        start = time.process_time_ns()
        first()
        middle = time.process_time_ns()
        second()
        end = time.process_time_ns()
        a.append((middle - start) / 1000.0)
        b.append((end - middle) / 1000.0)
        ratios.append((end - middle) / max(1, middle - start))
    return statistics.median(a), statistics.median(b), statistics.median(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8, 64])
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, median of {args.repeats} interleaved rounds (CPU time, us; ratio = median of per-round replay/eager)")
    print(f"{'batch':>5} {'tasks':>5} {'eager_us':>10} {'replay_us':>10} {'ratio':>6} {'capture_ms':>10} {'replay==eager':>13}")
    for batch in args.batches:
        device = get_device("sim", allow_float32_attention=True)  # a float32 model: the declared leniency
        step, _ = build(batch)
        with torch.no_grad():
            expected = step()
            captures = []
            for _ in range(5):  # the first capture also pays one-off meta-kernel set-up
                graph = device.new_graph()
                start = time.perf_counter()
                with device.graph(graph):
                    out = step()
                captures.append((time.perf_counter() - start) * 1e3)
            capture_ms = statistics.median(captures)
            graph.replay()
            same = torch.allclose(out, expected, atol=1e-5)
            eager, replay, ratio = interleaved_us(step, graph.replay, args.repeats)
        print(
            f"{batch:>5} {graph.num_tasks:>5} {eager:>10.1f} {replay:>10.1f} {ratio:>6.2f} "
            f"{capture_ms:>10.2f} {str(same):>13}"
        )


if __name__ == "__main__":
    main()
