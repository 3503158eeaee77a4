"""How capture cost grows: capture time, pool bytes and peak RSS against layers and sizes.

One cell = the ``qwen3-0.6b``-shaped preset with ``layers`` decoder layers and ``sizes``
capture sizes (35: vLLM's default list up to 256; 67: up to 768), the default mode
(FULL_AND_PIECEWISE), captured on a simulator with **meta tensors** (shapes, strides, pool
bytes and streams are exact; no weight or activation is materialised: the 28-layer model's
weights alone would be 2.4 GB in float32) and the stream limit raised out of the way
(docs/decisions.md "Performance figures"). Every cell runs in a fresh process (`python -m bench.bench_scale LAYERS
SIZES`), so its peak RSS is its own.

No assertions: this is a measurement.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from typing import Any

GRID_LAYERS = (4, 16, 28)
GRID_SIZES = (35, 67)
_MAX_CAPTURE = {35: 256, 67: 768}  # vLLM's default size list up to this many tokens has that many sizes
STREAM_LIMIT = 2**30


def cell_config(layers: int, sizes: int) -> Any:
    from ascendgraph.config import GraphConfig

    top = _MAX_CAPTURE[sizes]
    return GraphConfig.from_vllm_args(
        model="qwen3-0.6b", num_layers=layers, max_num_seqs=top, max_num_batched_tokens=max(2048, top),
        compilation_config={"max_cudagraph_capture_size": top},
    )


def measure_cell(layers: int, sizes: int) -> dict[str, Any]:
    """Compile and capture one cell in this process (call it in a fresh one for RSS)."""
    import resource

    from ascendgraph.device import get_device
    from ascendgraph.runtime.engine import Engine, EngineOptions

    logging.getLogger("ascendgraph").setLevel(logging.ERROR)
    device = get_device("sim", meta_tensors=True)
    engine = Engine(cell_config(layers, sizes), EngineOptions(
        device=device, requests=1, stream_limit=STREAM_LIMIT, check_eager=False, progress=False))
    try:
        start = time.perf_counter()
        engine.compile()
        compile_s = time.perf_counter() - start
        engine.capture()
        stats = device.stats()
        graphs = engine.capture_state.graphs_captured
        return {
            "layers": layers,
            "sizes": len(engine.resolution.capture_sizes),
            "graphs": graphs,
            "compile_seconds": compile_s,
            "capture_seconds": engine.capture_seconds,
            "ms_per_graph": engine.capture_seconds / max(graphs, 1) * 1e3,
            "pool_bytes": stats.pool_bytes,
            "streams": stats.streams_in_use,
            "peak_rss_bytes_in_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        }
    finally:
        engine.close()


def growth_note(rows: list[dict[str, Any]]) -> str:
    """A line or two on how capture time, pool bytes and RSS grow across the grid."""
    by = {(r["layers"], r["sizes"]): r for r in rows if "capture_seconds" in r}
    layers = sorted({key[0] for key in by})
    sizes = sorted({key[1] for key in by})
    parts = []
    if len(layers) >= 2:
        lo, hi = layers[0], layers[-1]
        for s in sizes:
            if (lo, s) in by and (hi, s) in by:
                a, b = by[(lo, s)], by[(hi, s)]
                parts.append(
                    f"{lo}->{hi} layers ({hi / lo:.1f}x) at {s} sizes: capture x{b['capture_seconds'] / a['capture_seconds']:.1f}, "
                    f"graphs x{b['graphs'] / a['graphs']:.1f}, pool x{b['pool_bytes'] / max(a['pool_bytes'], 1):.1f}, "
                    f"RSS x{b['peak_rss_bytes'] / max(a['peak_rss_bytes'], 1):.2f}"
                )
                break
    if len(sizes) >= 2:
        lo, hi = sizes[0], sizes[-1]
        for n in layers:
            if (n, lo) in by and (n, hi) in by:
                a, b = by[(n, lo)], by[(n, hi)]
                parts.append(
                    f"{lo}->{hi} sizes ({hi / lo:.1f}x) at {n} layers: capture x{b['capture_seconds'] / a['capture_seconds']:.1f}, "
                    f"pool x{b['pool_bytes'] / max(a['pool_bytes'], 1):.1f} (the largest size sets the pool), "
                    f"RSS x{b['peak_rss_bytes'] / max(a['peak_rss_bytes'], 1):.2f}"
                )
                break
    return "; ".join(parts)


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", type=int)
    parser.add_argument("sizes", type=int, choices=sorted(_MAX_CAPTURE))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    json.dump(measure_cell(args.layers, args.sizes), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
