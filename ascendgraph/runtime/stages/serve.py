"""Serve stage: route, run and record every scheduled batch of the workload.

Each scheduled batch is routed (`route`: "native", or "xlite" with XliteGraph on), and its
runner (`runners[route]`) returns a `RunResult`: the native runner dispatches (runtime mode +
padded key), writes the batch into the persistent buffers (static addresses for the graphs),
runs the compiled model (capture wrappers replay), updates FULL-graph attention parameters
after the replay is launched and synchronises the device (a hang surfaces here). The step is
then checked against eager (`CheckStage`), counted, and shown to every observer. `start_xlite`
builds XliteGraph's router and runtime (and its full-mode profile run) when the engine is built.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from ascendgraph.config import GraphConfig
from ascendgraph.device import Device
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import ConfigError, DeviceLost, GraphHang, StaleGraphParams
from ascendgraph.models.build import DecoderModel
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.options import EngineOptions
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.stages.check import CheckStage
from ascendgraph.runtime.stages.forward import ForwardPlumbing
from ascendgraph.runtime.stages.records import RunResult, StepRecord
from ascendgraph.runtime.stages.state import EngineState
from ascendgraph.runtime.workload import ScheduledBatch, Scheduler
from ascendgraph.xlite import NATIVE, XLITE, XliteProfileRun, XliteRoute, XliteRouter, XliteRuntime, XliteRuntimeSpec

__all__ = ["ServeStage", "XliteSetup", "start_xlite", "MAX_IDLE_STEPS"]

log = logging.getLogger(__name__)

MAX_IDLE_STEPS = 10_000


@dataclass(frozen=True)
class XliteSetup:
    """XliteGraph's router, the device's xlite runtime and the full-mode start-up profile run."""

    router: XliteRouter
    runtime: XliteRuntime
    profile_run: Optional[XliteProfileRun]


def start_xlite(
    config: GraphConfig, *, dtype: torch.dtype, device: Device, model: DecoderModel, forward: ForwardPlumbing
) -> XliteSetup:
    """Router and runtime of XliteGraph (docs/semantics.md §11); in full mode the start-up profile
    run (a dummy batch of max_num_batched_tokens, routed like any batch with is_profile_run=True)."""
    router = XliteRouter.from_config(config)
    runtime = device.xlite_runtime(model, XliteRuntimeSpec.from_config(config, dtype=dtype))
    log.info(
        "XliteGraph %s mode: token budget %d (batches over it run on the native runnable)",
        router.mode_name, router.budget,
    )
    if not router.full_mode:
        return XliteSetup(router, runtime, None)
    tokens = config.max_num_batched_tokens
    decided = router.route(
        [tokens] * config.data_parallel_size, num_reqs=min(config.max_num_seqs, tokens),
        has_prefill=True, is_profile_run=True,
    )
    buffer_tokens: Optional[int] = None
    with torch.no_grad():
        if decided.route == XLITE:
            buffer_tokens = int(runtime.profile_run().shape[0])
        else:
            forward.dummy_forward(GraphMode.NONE, BatchDescriptor(tokens))
            device.synchronize()
    log.info("xlite profile run: %d tokens -> %s (%s)", tokens, decided.route, decided.reason)
    return XliteSetup(router, runtime, XliteProfileRun(tokens, decided.route, decided.reason, buffer_tokens))


class ServeStage:
    """Routing, the runners and the serving loop.

    Needs: the engine's state (reads ``dispatcher``; writes ``counters``,
    ``batches_by_route`` and ``error``), the forward plumbing, the check stage, the device, the
    configuration (data parallel size), the options (``dp_peer_tokens``, ``check_eager``, the
    failure-mode switches), the scheduler, the FULL-graph parameters, XliteGraph's setup (None
    when off) and ``notify``, which shows a step to the engine's observers. Offers: `runners`
    (route name -> runner; callers may wrap them), `route`, `route_decision`, `run_native`,
    `run_xlite`, `step`, `serve`.
    """

    def __init__(
        self,
        *,
        state: EngineState,
        forward: ForwardPlumbing,
        check: CheckStage,
        device: Device,
        config: GraphConfig,
        options: EngineOptions,
        scheduler: Scheduler,
        graph_params: GraphParams,
        xlite: Optional[XliteSetup],
        notify: Callable[[StepRecord], None],
    ) -> None:
        self.state = state
        self.forward = forward
        self.check = check
        self.device = device
        self.config = config
        self.options = options
        self.scheduler = scheduler
        self.graph_params = graph_params
        self.xlite = xlite
        self.notify = notify
        self.runners: dict[str, Callable[[ScheduledBatch], RunResult]] = {NATIVE: self.run_native}
        if xlite is not None:
            self.runners[XLITE] = self.run_xlite

    def route(self, batch: ScheduledBatch) -> str:
        """Which runner (a key of `runners`) serves a batch: "native" (ACL graphs or eager, as
        dispatched) or, with XliteGraph on, "xlite" when `XliteRouter` says so."""
        decided = self.route_decision(batch)
        return NATIVE if decided is None else decided.route

    def route_decision(self, batch: ScheduledBatch) -> Optional[XliteRoute]:
        """The xlite routing decision of a batch with its reason (None when xlite is off)."""
        if self.xlite is None:
            return None
        return self.xlite.router.route(
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

    def run_xlite(self, batch: ScheduledBatch) -> RunResult:
        """The xlite runtime: the whole forward, unpadded, into its hidden-state buffer (no ACL graph)."""
        assert self.xlite is not None, "the xlite runner exists only with XliteGraph on"
        forward = self.forward
        tokens = batch.num_tokens
        forward.write_batch(batch, padded_tokens=tokens, padded_rows=batch.num_reqs)
        descriptor = BatchDescriptor(tokens, num_reqs=batch.num_reqs, uniform=batch.uniform_decode)
        metadata = forward.batch_metadata(batch, descriptor, tokens)
        context = forward.context(GraphMode.NONE, descriptor, metadata)
        with forward.measured() as measure:
            hidden = self.xlite.runtime.forward(forward.inputs.input_ids[:tokens], forward.inputs.positions[:tokens],
                                                context)
            self.device.synchronize()
        return RunResult(hidden[:tokens].clone(), GraphMode.NONE, descriptor, tokens, measure)

    def run_native(self, batch: ScheduledBatch) -> RunResult:
        """ACL graphs or eager, as the dispatcher says: pad, replay, update FULL params, sync."""
        forward = self.forward
        tokens = batch.num_tokens
        mode, descriptor = self.state.dispatcher.dispatch(tokens, uniform_decode=batch.uniform_decode)
        padded = descriptor.num_tokens if mode is not GraphMode.NONE else tokens
        rows = forward.table_rows(batch, descriptor)
        forward.write_batch(batch, padded_tokens=padded, padded_rows=rows)
        metadata = forward.batch_metadata(batch, descriptor, padded)
        with forward.measured() as measure:
            hidden = forward.forward(mode, descriptor, metadata, padded)
            if mode is GraphMode.FULL:
                # After the replay was launched: it waits on the attention events until updated.
                self.graph_params.update(
                    descriptor,
                    metadata,
                    query_len=forward.query_len,
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
        state = self.state
        with torch.no_grad():
            result = runner(batch)
            state.batches_by_route[route] = state.batches_by_route.get(route, 0) + 1
            hidden, mode, descriptor = result.hidden, result.runtime_mode, result.descriptor
            comparison = self.check.compare_with_eager(batch, hidden)
            diff, eager = comparison.diff, comparison.eager
            counters = state.counters
            counters.steps += 1
            counters.batches_by_mode[mode.name] += 1
            if mode is not GraphMode.NONE:
                counters.graphed_real_tokens += batch.num_tokens
                counters.graphed_padded_tokens += result.padded_tokens
            counters.max_abs_diff = max(counters.max_abs_diff, diff)
            counters.checked_steps += int(self.options.check_eager)
            counters.graph_time_us += result.measure.device_us
            counters.eager_time_us += eager.device_us if eager is not None else 0.0
            self.check.judge(batch, result, comparison)
        has_clock = self.forward.has_clock
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
            graph_time_us=result.measure.device_us if has_clock else None,
            eager_time_us=eager.device_us if eager is not None and has_clock else None,
            graph_cpu_s=result.measure.cpu_s,
            eager_cpu_s=eager.cpu_s if eager is not None else 0.0,
            graph_kernels=result.measure.kernels,
            eager_kernels=eager.kernels if eager is not None else 0,
            tolerance=comparison.tolerance,
        )
        self.notify(record)
        return record

    def serve(self) -> None:
        """Serve the whole workload (the engine captures first)."""
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
                self.state.error = exc
                self.scheduler.fail_all(f"{type(exc).__name__}: {exc}")
                return
