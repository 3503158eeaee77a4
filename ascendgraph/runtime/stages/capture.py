"""Capture stage: compile once, then warm up and capture every dispatcher key.

`Engine.capture()` hands the device the resolved `StreamPlan`, sets the FULL-graph parameter
sizes, compiles (`compile()`: one dummy eager forward at the largest size triggers Dynamo),
then for every dispatcher key in capture order runs the warm-ups eagerly and one capture run
with a dummy batch of that key's shape (a tqdm bar per group on stderr). A failure raises the
rewritten capture error, or, with ``on_capture_error="eager"``, releases every graph, the pool
and the stream plan and serves eagerly (`_fall_back_to_eager`).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import time
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Optional

import torch

from ascendgraph.compile.backend import AscendGraphBackend, CompiledModel
from ascendgraph.config import GraphConfig
from ascendgraph.device import Device, DeviceStats
from ascendgraph.dispatch import BatchDescriptor, GraphDispatcher
from ascendgraph.errors import DeviceLost, GraphHang
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Decision, Resolution
from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.forward_context import AttentionMetadata
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.stages.records import Inputs

if TYPE_CHECKING:
    from ascendgraph.runtime.engine import EngineOptions

__all__ = ["CaptureStage", "capture_groups"]

log = logging.getLogger(__name__)


class CaptureStage:
    """Compile and capture (a part of `Engine`, readable on its own). Runs its dummy batches
    through `ForwardPlumbing`; the fallback rebuilds the dispatcher with `BuildStage`."""

    config: GraphConfig
    options: "EngineOptions"
    resolution: Resolution
    device: Device
    mode: GraphMode
    dispatcher: GraphDispatcher
    decisions: list[Decision]
    inputs: Inputs
    query_len: int
    graph_params: GraphParams
    capture_state: CaptureState
    backend: Optional[AscendGraphBackend]
    compiled: CompiledModel
    captured: bool
    capture_seconds: float
    capture_fallback: Optional[BaseException]
    graphs_captured_before_failure: Optional[int]
    _stats_before_capture: Optional[DeviceStats]

    def _dummy_layout(self, mode: GraphMode, descriptor: BatchDescriptor) -> list[int]:
        """Query lengths of the dummy batch a key is warmed up or captured with.

        A FULL graph freezes its attention lists, so its capture uses the key's own shape:
        num_reqs requests (q tokens each when uniform). Everything else — warm-ups and
        piecewise captures, where attention runs eagerly — uses one request of num_tokens
        tokens: the graphs are the same and the eager attention stays cheap.
        """
        tokens = descriptor.num_tokens
        if mode is not GraphMode.FULL:
            return [tokens]
        if descriptor.uniform:
            return [self.query_len] * (descriptor.num_reqs or tokens // self.query_len)
        reqs = descriptor.num_reqs if descriptor.num_reqs is not None else min(tokens, self.config.max_num_seqs)
        reqs = max(1, min(reqs, tokens))
        base = tokens // reqs
        lengths = [base] * reqs
        lengths[-1] += tokens - base * reqs
        return lengths

    def _dummy_forward(self, mode: GraphMode, descriptor: BatchDescriptor) -> torch.Tensor:
        lengths = self._dummy_layout(mode, descriptor)
        tokens = sum(lengths)
        positions = [p for length in lengths for p in range(length)]
        ends = list(itertools.accumulate(lengths))
        self._write_inputs(
            [0] * tokens, positions, [-1] * tokens, [[] for _ in lengths], padded_tokens=tokens, padded_rows=len(lengths)
        )
        metadata = AttentionMetadata(
            num_reqs=len(lengths),
            num_actual_tokens=tokens,
            num_tokens=tokens,
            query_start_loc=ends,
            seq_lens=list(lengths),
            block_table=self.inputs.block_table[: len(lengths)],
            slot_mapping=self.inputs.slot_mapping[:tokens],
            uniform_decode=descriptor.uniform,
            query_len=self.query_len,
        )
        return self._forward(mode, descriptor, metadata, tokens)

    def _warmup_scope(self) -> ContextManager[Any]:
        """The device's context for work whose results are discarded (the simulator computes
        the warm-ups' half-precision matmuls in float32, `sim.warmup`); a no-op elsewhere."""
        scope: Optional[Callable[[], ContextManager[Any]]] = getattr(self.device, "warmup_scope", None)
        return scope() if scope is not None else contextlib.nullcontext()

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
            self._dummy_forward(GraphMode.NONE, BatchDescriptor(size))
        self.device.synchronize()
        return self.compiled.compile_seconds

    def capture(self) -> None:
        """Warm up and capture every dispatcher key (or nothing in NONE)."""
        if self.captured:
            return
        self.captured = True
        order = self.dispatcher.capture_order()
        self._stats_before_capture = self.device.stats()
        if not order:
            self.compile()
            return
        self.device.set_stream_plan(self.resolution.stream_plan)
        if self.mode.has_full_graphs():
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
            self.capture_seconds = time.perf_counter() - start
            self.graphs_captured_before_failure = self.capture_state.graphs_captured
            if self.options.on_capture_error != "eager":
                raise
            self._fall_back_to_eager(exc)
            return
        self.capture_seconds = time.perf_counter() - start
        log.info(
            "captured %d ACL graphs for %d keys in %.2f s",
            self.capture_state.graphs_captured,
            len(order),
            self.capture_seconds,
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
                        self._dummy_forward(GraphMode.NONE, key)
                self._dummy_forward(mode, key)
        finally:
            bar.close()

    def _fall_back_to_eager(self, exc: BaseException) -> None:
        """Release everything capture held and serve eagerly (``on_capture_error="eager"``)."""
        log.error("ACL graph capture failed; serving eagerly instead (--on-capture-error eager):\n%s", exc)
        self.capture_fallback = exc
        released = self.capture_state.release()
        self.device.set_stream_plan(None)
        stats = self.device.stats()
        log.info("released %d captured graphs; device now: %d/%d streams in use, %d graphs alive, pool %.1f MiB",
                 released, stats.streams_in_use, stats.stream_limit, stats.graphs_alive, stats.pool_bytes / 2**20)
        previous = self.mode
        self.mode = GraphMode.NONE
        self.dispatcher = self._make_dispatcher(GraphMode.NONE)
        self.decisions.append(
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

