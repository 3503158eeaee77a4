"""Capture stage: compile once, then warm up and capture every dispatcher key.

`Engine.capture()` hands the device the resolved `StreamPlan`, sets the FULL-graph parameter
sizes, compiles (`compile()`: one dummy eager forward at the largest size triggers Dynamo),
then for every dispatcher key in capture order runs the warm-ups eagerly and one capture run
with a dummy batch of that key's shape (a tqdm bar per group on stderr). A failure raises the
rewritten capture error, or, with ``on_capture_error="eager"``, releases every graph, the pool
and the stream plan and serves eagerly (the engine's state says NONE from then on).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from typing import Any, Callable, ContextManager, Optional

import torch

from ascendgraph.compile.backend import AscendGraphBackend, CompiledModel
from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.device import Device, WarmupScope
from ascendgraph.dispatch import BatchDescriptor, GraphDispatcher
from ascendgraph.errors import DeviceLost, GraphHang
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Decision, Resolution
from ascendgraph.runtime.options import EngineOptions
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.stages.forward import ForwardPlumbing
from ascendgraph.runtime.stages.state import EngineState

__all__ = ["CaptureStage", "capture_groups"]

log = logging.getLogger(__name__)


class CaptureStage:
    """Compile and capture.

    Needs: the engine's state (writes ``captured``, ``capture_seconds``, ``capture_fallback``,
    ``graphs_captured_before_failure``; the eager fallback switches ``mode`` / ``dispatcher``
    and appends a decision), the forward plumbing (dummy batches), the device, the options
    (``on_capture_error``, ``progress``), the resolution, the capture state, the FULL-graph
    parameters, the compiled model and its backend, and a dispatcher factory for the fallback.
    Offers: `compile`, `capture`.
    """

    def __init__(
        self,
        *,
        state: EngineState,
        forward: ForwardPlumbing,
        device: Device,
        options: EngineOptions,
        resolution: Resolution,
        capture_state: CaptureState,
        graph_params: GraphParams,
        compiled: CompiledModel,
        backend: Optional[AscendGraphBackend],
        make_dispatcher: Callable[[GraphMode], GraphDispatcher],
    ) -> None:
        self.state = state
        self.forward = forward
        self.device = device
        self.options = options
        self.resolution = resolution
        self.capture_state = capture_state
        self.graph_params = graph_params
        self.compiled = compiled
        self.backend = backend
        self.make_dispatcher = make_dispatcher

    def _warmup_scope(self) -> ContextManager[Any]:
        """The device's context for work whose results are discarded (the simulator computes
        the warm-ups' half-precision matmuls in float32, `sim.warmup`); a no-op elsewhere."""
        device = self.device
        return device.warmup_scope() if isinstance(device, WarmupScope) else contextlib.nullcontext()

    def _progress(self) -> bool:
        if self.options.progress is not None:
            return self.options.progress
        return sys.stderr.isatty() and log.getEffectiveLevel() <= logging.INFO

    def compile(self) -> float:
        """Trigger the one Dynamo compilation (a dummy eager forward at the largest size)."""
        if not self.compiled.is_compiled or self.backend is None or self.backend.artifacts:
            return self.compiled.compile_seconds
        size = max(self.resolution.max_capture_size, 1)
        with self._warmup_scope():  # its results are discarded, like a warm-up's
            self.forward.dummy_forward(GraphMode.NONE, BatchDescriptor(size))
        self.device.synchronize()
        return self.compiled.compile_seconds

    def capture(self) -> None:
        """Warm up and capture every dispatcher key (or nothing in NONE)."""
        state = self.state
        if state.captured:
            return
        state.captured = True
        order = state.dispatcher.capture_order()
        if not order:
            self.compile()
            return
        self.device.set_stream_plan(self.resolution.stream_plan)
        if state.mode.has_full_graphs():
            self.graph_params.set_sizes(self.resolution.capture_sizes)
        start = time.perf_counter()
        try:
            self.compile()
            start = time.perf_counter()
            with torch.no_grad(), self.capture_state.capturing():
                for label, group in capture_groups(order):
                    self._capture_group(label, group)
            self.device.synchronize()
        except (GraphHang, DeviceLost):
            raise
        except RuntimeError as exc:
            state.capture_seconds = time.perf_counter() - start
            state.graphs_captured_before_failure = self.capture_state.graphs_captured
            if self.options.on_capture_error != "eager":
                raise
            self._fall_back_to_eager(exc)
            return
        state.capture_seconds = time.perf_counter() - start
        log.info(
            "captured %d ACL graphs for %d keys in %.2f s",
            self.capture_state.graphs_captured,
            len(order),
            state.capture_seconds,
        )

    def _capture_group(self, label: str, group: list[tuple[GraphMode, BatchDescriptor]]) -> None:
        from tqdm import tqdm

        warmups = self.resolution.warmups
        bar = tqdm(group, desc=f"Capturing ACL graphs ({label})", file=sys.stderr, disable=not self._progress(),
                   unit="size", leave=False, dynamic_ncols=True)
        try:
            for mode, key in bar:
                for _ in range(warmups):
                    with self._warmup_scope():
                        self.forward.dummy_forward(GraphMode.NONE, key)
                self.forward.dummy_forward(mode, key)
        finally:
            bar.close()

    def _fall_back_to_eager(self, exc: BaseException) -> None:
        """Release everything capture held and serve eagerly (``on_capture_error="eager"``)."""
        log.error("ACL graph capture failed; serving eagerly instead (--on-capture-error eager):\n%s", exc)
        state = self.state
        state.capture_fallback = exc
        released = self.capture_state.release()
        self.device.set_stream_plan(None)
        stats = self.device.stats()
        log.info("released %d captured graphs; device now: %d/%d streams in use, %d graphs alive, pool %.1f MiB",
                 released, stats.streams_in_use, stats.stream_limit, stats.graphs_alive, stats.pool_bytes / 2**20)
        previous = state.mode
        state.mode = GraphMode.NONE
        state.dispatcher = self.make_dispatcher(GraphMode.NONE)
        state.decisions.append(
            Decision("capture_fallback", previous.name, GraphMode.NONE.name,
                     f"capture failed with {type(exc).__name__}; graphs released, serving eagerly")
        )


def capture_groups(
    order: list[tuple[GraphMode, BatchDescriptor]],
) -> list[tuple[str, list[tuple[GraphMode, BatchDescriptor]]]]:
    """Capture order split into progress-bar groups: (mixed prefill-decode | decode, MODE)."""
    groups: list[tuple[str, list[tuple[GraphMode, BatchDescriptor]]]] = []
    for mode, key in order:
        label = f"{'decode' if key.uniform else 'mixed prefill-decode'}, {mode.name}"
        if not groups or groups[-1][0] != label:
            groups.append((label, []))
        groups[-1][1].append((mode, key))
    return groups

