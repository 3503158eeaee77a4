"""Measure a real stack and write what was measured as a profile the simulator loads.

Theory of operation. The simulator refuses a capture when the streams its StreamPlan
charges exceed ``stream_limit``; a real stack refuses when the runtime runs out of
streams (207008, or ``Alloc sq cq fail`` on an old HDK), at a count that depends on the
HDK, CANN and what else holds streams. `measure_streams` finds that count: it captures
small single-stream FULL graphs, keeping every one alive, until the stack refuses (or a
ceiling is reached), then releases them all. `measure_costs` times what the simulator's
cost model charges (capture base and per-task cost, graph launch, eager launch).

`profile_document` turns the figures into the JSON ``sim.profiles.load_profile`` reads
(``--sim-profile FILE``): the device's own generation as ``base``, the measured
``stream_limit`` and versions, and the measured ``cost`` entries. Everything here uses only
the Device protocol, so it runs on the simulator as well (which is how it is tested on CPU).
"""

from __future__ import annotations

import contextlib
import json
import logging
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from ascendgraph.device import Device, DeviceProfile
from ascendgraph.errors import classify_capture_error

__all__ = ["StreamMeasurement", "CostMeasurement", "measure_streams", "measure_costs", "profile_document",
           "write_profile", "DEFAULT_CEILING"]

log = logging.getLogger("ascendgraph.hw.calibrate")  # under the CLI's "ascendgraph" logger (its handler, its -v levels)

DEFAULT_CEILING = 4096  # more than any stack's ~2048 streams: reaching it means "no refusal seen"


@dataclass(frozen=True)
class StreamMeasurement:
    """How many one-stream graphs the stack held before refusing the next capture."""

    graphs_captured: int
    refused: bool  # False: the ceiling was reached first (the limit is at least graphs_captured)
    signature: Optional[str] = None  # ascendgraph.errors signature name of the refusal
    error: str = ""  # the refusal's first line
    ceiling: int = DEFAULT_CEILING
    capture_seconds: float = 0.0

    @property
    def stream_limit(self) -> int:
        """Streams graph capture could use: one per probe graph."""
        return self.graphs_captured

    @property
    def old_hdk(self) -> bool:
        return self.signature == "old_hdk"


@dataclass(frozen=True)
class CostMeasurement:
    """Host-side timings in microseconds (the simulator's CostParams names)."""

    capture_base_us: float
    capture_per_task_us: float
    graph_launch_us: float
    host_launch_us: float
    samples: dict[str, int] = field(default_factory=dict)


def _probe(x: torch.Tensor, ops: int) -> torch.Tensor:
    y = x
    for _ in range(ops):
        y = y + 1
    return y


def measure_streams(
    device: Device,
    *,
    ceiling: int = DEFAULT_CEILING,
    elements: int = 16,
    progress: Optional[Callable[[int], None]] = None,
) -> StreamMeasurement:
    """Capture one-op FULL graphs on a side stream until the stack refuses or ``ceiling``.

    Only a RuntimeError during capture ends the measurement; the graphs captured so far
    are reset and the device cache emptied whatever happens.
    """
    if ceiling < 1:
        raise ValueError(f"ceiling must be at least 1, got {ceiling}")
    x = torch.zeros(elements, device=device.torch_device)
    stream = device.new_stream()
    pool = device.graph_pool_handle()
    graphs: list[Any] = []
    outputs: list[torch.Tensor] = []
    signature, error, refused = None, "", False
    started = time.perf_counter()
    try:
        while len(graphs) < ceiling:
            graph = device.new_graph()
            try:
                with device.graph(graph, pool=pool, stream=stream):
                    outputs.append(_probe(x, 1))
            except RuntimeError as exc:
                text = str(exc).strip()
                found = classify_capture_error(text)
                signature = found[0] if found else None
                error = text.splitlines()[0] if text else type(exc).__name__
                refused = True
                with contextlib.suppress(Exception):
                    graph.reset()
                break
            graphs.append(graph)
            if progress is not None:
                progress(len(graphs))
        count = len(graphs)
        elapsed = time.perf_counter() - started
    finally:
        for graph in graphs:
            try:
                graph.reset()
            except Exception:  # keep releasing the others
                log.exception("could not reset calibration graph %r", graph)
        graphs.clear()
        outputs.clear()
        device.empty_cache()
    if refused and not signature:
        log.warning("capture was refused with an unclassified error after %d graphs: %s", count, error)
    return StreamMeasurement(
        graphs_captured=count,
        refused=refused,
        signature=signature,
        error=error,
        ceiling=ceiling,
        capture_seconds=elapsed,
    )


def measure_costs(device: Device, *, repeats: int = 50, long_graph_ops: int = 32, elements: int = 16) -> CostMeasurement:
    """Host-side microseconds for: capturing a 1-op graph (base), each further captured op,
    one replay launch, one eager op launch. Means over ``repeats`` runs."""
    if repeats < 1 or long_graph_ops < 2:
        raise ValueError("repeats must be >= 1 and long_graph_ops >= 2")
    x = torch.zeros(elements, device=device.torch_device)
    stream = device.new_stream()
    pool = device.graph_pool_handle()

    def capture_us(ops: int) -> float:
        times = []
        for _ in range(repeats):
            graph = device.new_graph()
            began = time.perf_counter()
            with device.graph(graph, pool=pool, stream=stream):
                _probe(x, ops)
            times.append((time.perf_counter() - began) * 1e6)
            graph.reset()
        return statistics.median(times)

    short, long = capture_us(1), capture_us(long_graph_ops)
    per_task = max(0.0, (long - short) / (long_graph_ops - 1))

    graph = device.new_graph()
    with device.graph(graph, pool=pool, stream=stream):
        _probe(x, 1)
    device.synchronize()
    began = time.perf_counter()
    for _ in range(repeats):
        graph.replay()
    launch = (time.perf_counter() - began) * 1e6 / repeats
    device.synchronize()
    graph.reset()

    began = time.perf_counter()
    for _ in range(repeats):
        _probe(x, 1)
    eager = (time.perf_counter() - began) * 1e6 / repeats
    device.synchronize()
    device.empty_cache()
    return CostMeasurement(
        capture_base_us=max(0.0, short - per_task),
        capture_per_task_us=per_task,
        graph_launch_us=launch,
        host_launch_us=eager,
        samples={"repeats": repeats, "long_graph_ops": long_graph_ops},
    )


def profile_document(
    profile: DeviceProfile,
    streams: StreamMeasurement,
    costs: Optional[CostMeasurement] = None,
    *,
    name: Optional[str] = None,
) -> dict[str, Any]:
    """The ``sim.profiles`` JSON form of a calibration (only keys that loader accepts)."""
    if streams.graphs_captured < 1:
        raise ValueError("a calibration that captured no graph cannot give a stream limit")
    bound = "refused at" if streams.refused else "no refusal up to the ceiling of"
    document: dict[str, Any] = {
        "name": name or f"{profile.name}-calibrated",
        "base": profile.name,
        "soc": profile.soc,
        "stream_limit": streams.stream_limit,
        "hdk_version": profile.hdk_version,
        "cann_version": profile.cann_version,
        "old_hdk": bool(profile.old_hdk or streams.old_hdk),
        "description": (
            f"calibrated on {profile.soc}: {streams.graphs_captured} one-stream graphs held, "
            f"{bound} graph {streams.graphs_captured + 1 if streams.refused else streams.ceiling}"
            + (f" ({streams.signature or 'unclassified'}: {streams.error})" if streams.refused else "")
        ),
    }
    if costs is not None:
        document["cost"] = {
            "capture_base_us": round(costs.capture_base_us, 3),
            "capture_per_task_us": round(costs.capture_per_task_us, 3),
            "graph_launch_us": round(costs.graph_launch_us, 3),
            "host_launch_us": round(costs.host_launch_us, 3),
        }
    return document


def write_profile(path: Path | str, document: dict[str, Any]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return target
