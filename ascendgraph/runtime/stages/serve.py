"""Serve stage: route, run and record every scheduled batch of the workload.

Each scheduled batch is routed (`route`: "native", or "xlite" with XliteGraph on), and its
runner (`runners[route]`) returns a `RunResult`: the native runner dispatches (runtime mode +
padded key), writes the batch into the persistent buffers (static addresses for the graphs),
runs the compiled model (capture wrappers replay), updates FULL-graph attention parameters
after the replay is launched and synchronises the device (a hang surfaces here). The step is
then checked against eager (`CheckStage`), counted, and shown to every observer.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Callable, Optional

import torch

from ascendgraph.config import GraphConfig
from ascendgraph.device import Device
from ascendgraph.dispatch import BatchDescriptor, GraphDispatcher
from ascendgraph.errors import ConfigError, DeviceLost, GraphHang, NumericalMismatch, StaleGraphParams
from ascendgraph.models.build import DecoderModel
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.stages.records import Counters, Inputs, RunResult, StepObserver, StepRecord
from ascendgraph.runtime.workload import ScheduledBatch, Scheduler
from ascendgraph.xlite import NATIVE, XLITE, XliteProfileRun, XliteRoute, XliteRouter, XliteRuntime, XliteRuntimeSpec

if TYPE_CHECKING:
    from ascendgraph.runtime.engine import EngineOptions

__all__ = ["ServeStage", "MAX_IDLE_STEPS"]

log = logging.getLogger(__name__)

MAX_IDLE_STEPS = 10_000


class ServeStage:
    """Routing, the runners and the serving loop (a part of `Engine`, readable on its own).
    Runs batches through `ForwardPlumbing`, checks them with `CheckStage`, captures first
    with `CaptureStage`."""

    config: GraphConfig
    options: "EngineOptions"
    device: Device
    model: DecoderModel
    dtype: torch.dtype
    dispatcher: GraphDispatcher
    scheduler: Scheduler
    inputs: Inputs
    query_len: int
    graph_params: GraphParams
    runners: dict[str, Callable[[ScheduledBatch], RunResult]]
    observers: list[StepObserver]
    batches_by_route: dict[str, int]
    xlite_router: Optional[XliteRouter]
    xlite_runtime: Optional[XliteRuntime]
    xlite_profile_run: Optional[XliteProfileRun]
    error: Optional[BaseException]
    first_mismatch: Optional[NumericalMismatch]
    _counters: Counters
    _has_clock: bool

    def route(self, batch: ScheduledBatch) -> str:
        """Which runner (a key of `runners`) serves a batch: "native" (ACL graphs or eager, as
        dispatched) or, with XliteGraph on, "xlite" when `XliteRouter` says so."""
        decided = self.route_decision(batch)
        return NATIVE if decided is None else decided.route

    def route_decision(self, batch: ScheduledBatch) -> Optional[XliteRoute]:
        """The xlite routing decision of a batch with its reason (None when xlite is off)."""
        if self.xlite_router is None:
            return None
        return self.xlite_router.route(
            self._dp_token_counts(batch), num_reqs=batch.num_reqs, has_prefill=batch.has_prefill
        )

    def _dp_token_counts(self, batch: ScheduledBatch) -> list[int]:
        """This rank's token count followed by the simulated other DP ranks' (EngineOptions.dp_peer_tokens)."""
        counts = [batch.num_tokens]
        peers = self.options.dp_peer_tokens
        if peers is not None:
            others = [int(n) for n in peers(batch)]
            expected = self.config.data_parallel_size - 1
            if len(others) != expected:
                raise ConfigError(
                    f"dp_peer_tokens gave {len(others)} token count(s) for step {batch.step} but "
                    f"data_parallel_size={self.config.data_parallel_size} has {expected} other rank(s)",
                    key="dp_peer_tokens",
                )
            counts.extend(others)
        return counts

    def _start_xlite(self) -> None:
        """Router and runtime of XliteGraph; in full mode the start-up profile run (a dummy batch
        of max_num_batched_tokens, routed like any batch with is_profile_run=True)."""
        config = self.config
        self.xlite_router = XliteRouter.from_config(config)
        spec = XliteRuntimeSpec.from_config(config, dtype=self.dtype)
        self.xlite_runtime = self.device.xlite_runtime(self.model, spec)
        self.runners[XLITE] = self._run_xlite
        log.info(
            "XliteGraph %s mode: token budget %d (batches over it run on the native runnable)",
            self.xlite_router.mode_name, self.xlite_router.budget,
        )
        if not self.xlite_router.full_mode:
            return
        tokens = config.max_num_batched_tokens
        decided = self.xlite_router.route(
            [tokens] * config.data_parallel_size, num_reqs=min(config.max_num_seqs, tokens),
            has_prefill=True, is_profile_run=True,
        )
        buffer_tokens: Optional[int] = None
        with torch.no_grad():
            if decided.route == XLITE:
                buffer_tokens = int(self.xlite_runtime.profile_run().shape[0])
            else:
                self._dummy_forward(GraphMode.NONE, BatchDescriptor(tokens))
                self.device.synchronize()
        self.xlite_profile_run = XliteProfileRun(tokens, decided.route, decided.reason, buffer_tokens)
        log.info("xlite profile run: %d tokens -> %s (%s)", tokens, decided.route, decided.reason)

    def _run_xlite(self, batch: ScheduledBatch) -> RunResult:
        """The xlite runtime: the whole forward, unpadded, into its hidden-state buffer (no ACL graph)."""
        runtime = self.xlite_runtime
        assert runtime is not None, "the xlite runner exists only with XliteGraph on"
        tokens = batch.num_tokens
        self._write_batch(batch, padded_tokens=tokens, padded_rows=batch.num_reqs)
        descriptor = BatchDescriptor(tokens, num_reqs=batch.num_reqs, uniform=batch.uniform_decode)
        metadata = self._batch_metadata(batch, descriptor, tokens)
        context = self._context(GraphMode.NONE, descriptor, metadata)
        with self._measured() as measure:
            hidden = runtime.forward(self.inputs.input_ids[:tokens], self.inputs.positions[:tokens], context)
            self.device.synchronize()
        return RunResult(hidden[:tokens].clone(), GraphMode.NONE, descriptor, tokens, measure)

    def _run_native(self, batch: ScheduledBatch) -> RunResult:
        """ACL graphs or eager, as the dispatcher says: pad, replay, update FULL params, sync."""
        tokens = batch.num_tokens
        mode, descriptor = self.dispatcher.dispatch(tokens, uniform_decode=batch.uniform_decode)
        padded = descriptor.num_tokens if mode is not GraphMode.NONE else tokens
        rows = self._table_rows(batch, descriptor)
        self._write_batch(batch, padded_tokens=padded, padded_rows=rows)
        metadata = self._batch_metadata(batch, descriptor, padded)
        with self._measured() as measure:
            hidden = self._forward(mode, descriptor, metadata, padded)
            if mode is GraphMode.FULL:
                # After the replay was launched: it waits on the attention events until updated.
                self.graph_params.update(
                    descriptor,
                    metadata,
                    query_len=self.query_len,
                    skip_kernel=self.options.skip_param_update,
                    record_events=self.options.record_update_events,
                )
            self.device.synchronize()
        return RunResult(hidden[:tokens].clone(), mode, descriptor, padded, measure)

    def step(self, batch: ScheduledBatch) -> StepRecord:
        """Serve one batch: run it on its route, check it against eager, apply the results."""
        route = self.route(batch)
        runner = self.runners.get(route)
        if runner is None:
            raise KeyError(f"no runner for route {route!r}; known routes: {', '.join(self.runners)}")
        with torch.no_grad():
            result = runner(batch)
            self.batches_by_route[route] = self.batches_by_route.get(route, 0) + 1
            hidden, mode, descriptor = result.hidden, result.runtime_mode, result.descriptor
            diff, eager = self._compare_with_eager(batch, hidden)
            counters = self._counters
            counters.steps += 1
            counters.batches_by_mode[mode.name] += 1
            if mode is not GraphMode.NONE:
                counters.graphed_real_tokens += batch.num_tokens
                counters.graphed_padded_tokens += result.padded_tokens
            counters.max_abs_diff = max(counters.max_abs_diff, diff)
            counters.checked_steps += int(self.options.check_eager)
            counters.graph_time_us += result.measure.device_us
            counters.eager_time_us += eager.device_us if eager is not None else 0.0
            self._judge(batch, result, diff)
        record = StepRecord(
            step=batch.step,
            kind=batch.kind,
            route=route,
            runtime_mode=mode,
            descriptor=descriptor,
            num_reqs=batch.num_reqs,
            num_tokens=batch.num_tokens,
            padded_tokens=result.padded_tokens,
            max_abs_diff=diff,
            graph_time_us=result.measure.device_us if self._has_clock else None,
            eager_time_us=eager.device_us if eager is not None and self._has_clock else None,
            graph_cpu_s=result.measure.cpu_s,
            eager_cpu_s=eager.cpu_s if eager is not None else 0.0,
            graph_kernels=result.measure.kernels,
            eager_kernels=eager.kernels if eager is not None else 0,
            tolerance=self.step_tolerance,
        )
        for observer in self.observers:
            observer.on_step(self, record)
        return record

    def serve(self) -> None:
        """Serve the whole workload (capturing first if not done yet)."""
        self.capture()
        idle = 0
        while self.scheduler.has_unfinished():
            batch = self.scheduler.schedule()
            if batch is None:
                idle += 1
                if idle > MAX_IDLE_STEPS:  # pragma: no cover - arrivals are bounded
                    raise RuntimeError("the scheduler made no progress for too many steps")
                continue
            idle = 0
            try:
                self.step(batch)
            except (GraphHang, DeviceLost, StaleGraphParams) as exc:
                log.error("%s: %s", type(exc).__name__, exc)
                self.error = exc
                self.scheduler.fail_all(f"{type(exc).__name__}: {exc}")
                return
