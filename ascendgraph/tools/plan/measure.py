"""Capture cost measurement for `ascendgraph plan`: meta-tensor capture, sampled sizes, interpolation.

Theory of operation. Graph-pool memory and capture time are *measured* by capturing on
the simulator with meta tensors (`SimDevice(meta_tensors=True)`: shapes, pool bytes,
streams and the virtual clock are real, no memory is held and nothing computes, so
`qwen3-0.6b` plans in a few hundred MB). `measure_capture` captures a sample of the
configured sizes (`sample_for_measure`: an even sample plus the smallest and largest size
of every key family; or all of them, ``method="all"``) through the engine and records, per
captured dispatcher key, the virtual time of its warm-ups and capture, its graphs and its
pool footprint (`KeyCost`). Stream limits are lifted: this measures memory and time, not
streams (the plan's stream answer comes from the `StreamPlan`).

`Measurement.predict(sizes)` turns the measured keys into the cost of another selection:
it sums the keys the selection's dispatcher would capture, interpolating per-key time
(and pool) piecewise-linearly in num_tokens between measured keys of the same kind
(`interpolate`); the pool is the largest key's footprint (graphs share one pool, which
costs its largest graph). When every key was measured nothing is interpolated.

torch is imported only inside `measure_capture` (through the engine), so importing this
module — and `ascendgraph.tools.plan` — stays light.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from ascendgraph.dispatch import GraphDispatcher
from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Resolution
from ascendgraph.sizes import sample_sizes

__all__ = [
    "DEFAULT_SAMPLE_SIZES",
    "Prediction",
    "KeyCost",
    "Measurement",
    "dispatcher_for",
    "interpolate",
    "sample_for_measure",
    "measure_capture",
]

DEFAULT_SAMPLE_SIZES = 6
# The measurement must never run out of streams: it is about memory and time, not streams.
_MEASURE_STREAM_LIMIT = 1 << 30


def dispatcher_for(resolution: Resolution, sizes: Sequence[int]) -> GraphDispatcher:
    """The dispatcher the resolution's mode would build for ``sizes`` (its keys are what is captured)."""
    config = resolution.config
    return GraphDispatcher(
        resolution.mode,
        capture_sizes=sizes,
        max_num_seqs=config.max_num_seqs,
        uniform_decode_query_len=config.uniform_decode_query_len,
        max_loras=config.max_loras,
        specialize_lora=config.cudagraph_specialize_lora,
    )


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of capturing a set of sizes (from a `Measurement`)."""

    graphs: int
    pool_bytes: int
    capture_seconds: float
    interpolated_keys: int  # keys whose time was interpolated (0 with --measure all)

    def as_dict(self) -> dict[str, Any]:
        return {"graphs": self.graphs, "pool_bytes": self.pool_bytes, "capture_seconds": self.capture_seconds,
                "interpolated_keys": self.interpolated_keys}


@dataclass(frozen=True)
class KeyCost:
    """What capturing one dispatcher key cost on the simulator (warm-ups included)."""

    mode: str  # PIECEWISE | FULL
    num_tokens: int
    uniform: bool
    graphs: int
    seconds: float  # virtual time: warm-ups + captures (+ eager attention between pieces)
    pool_bytes: int  # the largest footprint among the key's graphs

    def as_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "num_tokens": self.num_tokens, "uniform": self.uniform, "graphs": self.graphs,
                "capture_seconds": self.seconds, "pool_bytes": self.pool_bytes}


@dataclass
class Measurement:
    """Per-key capture costs measured on a meta-tensor simulator, and predictions from them."""

    method: str
    profile: str
    sizes: list[int]  # the sizes captured
    keys: list[KeyCost]
    graphs_captured: int
    pool_bytes: int
    capture_seconds: float  # virtual: warm-ups + captures of the measured sizes
    compile_seconds: float  # host wall clock of the Dynamo compile (the same work as on a real host)
    wall_seconds: float  # host wall clock of the whole measurement
    resolution: Resolution
    cached: bool = False  # read from the plan cache (`ascendgraph.tools.plan.measure_cache`), not measured now

    def predict(self, sizes: Sequence[int]) -> Prediction:
        """Graphs, pool bytes and capture time of capturing ``sizes`` (see the module docstring)."""
        families: dict[tuple[str, bool], list[KeyCost]] = {}
        for cost in self.keys:
            families.setdefault((cost.mode, cost.uniform), []).append(cost)
        for members in families.values():
            members.sort(key=lambda c: c.num_tokens)
        graphs = pool = interpolated = 0
        seconds = 0.0
        for mode, key in dispatcher_for(self.resolution, sizes).capture_order():
            family = families.get((mode.name, key.uniform))
            if not family:
                raise ConfigError(
                    f"the measurement has no {mode.name} {'decode ' if key.uniform else ''}keys to predict "
                    f"size {key.num_tokens} from; measure with --measure all",
                    key="measure",
                )
            exact = next((c for c in family if c.num_tokens == key.num_tokens), None)
            if exact is None:
                interpolated += 1
            graphs += exact.graphs if exact else max(c.graphs for c in family)
            seconds += exact.seconds if exact else interpolate([(c.num_tokens, c.seconds) for c in family], key.num_tokens)
            key_pool = exact.pool_bytes if exact else interpolate(
                [(c.num_tokens, float(c.pool_bytes)) for c in family], key.num_tokens
            )
            pool = max(pool, int(round(key_pool)))
        return Prediction(graphs=graphs, pool_bytes=pool, capture_seconds=seconds, interpolated_keys=interpolated)

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "device": "sim (meta tensors)",
            "profile": self.profile,
            "sizes_measured": list(self.sizes),
            "graphs_captured": self.graphs_captured,
            "pool_bytes": self.pool_bytes,
            "capture_seconds": self.capture_seconds,
            "compile_seconds": self.compile_seconds,
            "wall_seconds": self.wall_seconds,
            "cached": self.cached,
            "keys": [k.as_dict() for k in self.keys],
        }


def interpolate(points: Sequence[tuple[int, float]], x: int) -> float:
    """Piecewise-linear through the points (sorted by x), extended linearly past the ends, >= 0."""
    if len(points) == 1:
        return points[0][1]
    xs = [p[0] for p in points]
    i = bisect.bisect_left(xs, x)
    a = min(max(i - 1, 0), len(points) - 2)
    (x0, y0), (x1, y1) = points[a], points[a + 1]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


def sample_for_measure(resolution: Resolution, method: str, count: int) -> list[int]:
    """The sizes to capture: all, or an even sample plus the ends of every key family."""
    sizes = list(resolution.capture_sizes)
    if method == "all" or count >= len(sizes):
        return sizes
    chosen = set(sample_sizes(sizes, max(count, 2)))
    dispatcher = dispatcher_for(resolution, sizes)
    families: dict[tuple[GraphMode, bool], list[int]] = {}
    for mode, key in dispatcher.capture_order():
        families.setdefault((mode, key.uniform), []).append(key.num_tokens)
    for tokens in families.values():
        chosen.update((min(tokens), max(tokens)))
    return sorted(chosen)


def measure_capture(
    resolution: Resolution,
    *,
    method: str = "sample",
    sample: int = DEFAULT_SAMPLE_SIZES,
    profile: Optional[str] = None,
    hccl_op_expansion_mode: Optional[str] = None,
    seed: int = 0,
    env: Optional[Mapping[str, str]] = None,
) -> Measurement:
    """Capture (a sample of) the resolution's sizes on a meta-tensor simulator and record
    the cost of every key. Stream limits are lifted: this measures memory and time.
    ``env``: the environment the resolution was made with (default: this process's)."""
    if method not in ("sample", "all"):
        raise ConfigError(f"measure must be one of sample, all, got {method!r}", key="measure")
    started = time.perf_counter()
    # torch (through the engine) is imported here only: the rest of the module does without it.
    from ascendgraph.device import VirtualClock, get_device
    from ascendgraph.runtime.engine import Engine, EngineOptions

    sizes = sample_for_measure(resolution, method, sample)
    config = resolution.config.replace(cudagraph_capture_sizes=tuple(sizes), max_cudagraph_capture_size=None)
    profile_name = profile or config.soc
    device = get_device("sim", profile=profile_name, meta_tensors=True, seed=seed)
    assert isinstance(device, VirtualClock), "the simulator prices capture on its virtual clock"
    options = EngineOptions(
        device=device,
        requests=1,
        seed=seed,
        stream_limit=_MEASURE_STREAM_LIMIT,
        hccl_op_expansion_mode=hccl_op_expansion_mode,
        env=dict(env) if env is not None else None,
        progress=False,
        check_eager=False,
        num_threads=None if os.environ.get("OMP_NUM_THREADS") else 1,
    )
    # The measurement engine repeats the resolution's warnings and logs its capture: keep it quiet.
    engine_logs = [logging.getLogger(name) for name in ("ascendgraph.runtime.engine", "ascendgraph.runtime.stages")]
    previous_levels = [engine_log.level for engine_log in engine_logs]
    for engine_log in engine_logs:
        engine_log.setLevel(logging.ERROR)
    engine = None
    try:
        engine = Engine(config, options)
        if list(engine.resolution.capture_sizes) != sizes:  # pragma: no cover - re-resolving a subset keeps it
            raise RuntimeError(
                f"measuring sizes {sizes} resolved to {engine.resolution.capture_sizes}; please report this"
            )
        compile_start = time.perf_counter()
        engine.compile()
        compile_seconds = time.perf_counter() - compile_start
        marks: list[tuple[GraphMode, Any, float, int]] = []

        def on_capture(wrapper: Any, entry: Any) -> None:
            host, dev = device.clock()
            marks.append((wrapper.runtime_mode, entry.descriptor, max(host, dev), int(entry.graph.pool_bytes)))

        engine.capture_state.after_capture.append(on_capture)
        before = max(device.clock())
        with device.track_eager():
            engine.capture()
        total_us = max(device.clock()) - before
        stats = device.stats()
        keys: list[KeyCost] = []
        previous = before
        index = 0
        while index < len(marks):
            mode, descriptor = marks[index][0], marks[index][1]
            end = index
            while end + 1 < len(marks) and marks[end + 1][0] is mode and marks[end + 1][1] == descriptor:
                end += 1
            group = marks[index : end + 1]
            keys.append(KeyCost(
                mode=mode.name,
                num_tokens=descriptor.num_tokens,
                uniform=bool(descriptor.uniform),
                graphs=len(group),
                seconds=(group[-1][2] - previous) / 1e6,
                pool_bytes=max(m[3] for m in group),
            ))
            previous = group[-1][2]
            index = end + 1
        return Measurement(
            method="all" if sizes == list(resolution.capture_sizes) else "sample",
            profile=device.profile.name,
            sizes=sizes,
            keys=keys,
            graphs_captured=engine.capture_state.graphs_captured,
            pool_bytes=stats.pool_bytes,
            capture_seconds=total_us / 1e6,
            compile_seconds=compile_seconds,
            wall_seconds=time.perf_counter() - started,
            resolution=resolution,
        )
    finally:
        if engine is not None:
            engine.close()
        for engine_log, previous_level in zip(engine_logs, previous_levels):
            engine_log.setLevel(previous_level)
