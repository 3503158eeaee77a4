"""The engine: resolve -> build -> compile -> capture -> serve -> report (`ascendgraph run`).

Theory of operation.

1. **Resolve** the configuration (`ascendgraph.resolve`) and build the dispatcher's keys.
2. **Build** the model from its spec with seeded weights. The same module serves the graph
   path (compiled) and the eager reference (the plain module), each with its own paged
   KV cache, so both see the same weights and inputs.
3. **Compile** with the `AscendGraphBackend` (nothing for NONE).
4. **Capture**: hand the device the resolved `StreamPlan`, set the FULL-graph parameter
   sizes, then for every dispatcher key in capture order run the warm-ups eagerly and one
   capture run with a dummy batch of that key's shape (tqdm bar per group). A failure
   raises the rewritten capture error — or, with ``on_capture_error="eager"``, releases
   every graph, the pool and the stream plan and serves eagerly.
5. **Serve** the workload: each scheduled batch is dispatched (runtime mode + padded key),
   its inputs written into persistent buffers (static addresses for the graphs), the
   compiled model run (capture wrappers replay), FULL-graph attention parameters updated
   after the replay is launched, the device synchronised (a hang surfaces here), and the
   result checked against the eager reference; a step beyond tolerance fails its
   requests with NumericalMismatch.
6. **Report** (`ascendgraph.runtime.report.Report`).

Each stage is a module of ascendgraph/runtime/stages/, readable on its own: build.py (device,
dispatcher, buffers: plain functions), forward.py (`ForwardPlumbing`, what every forward
shares), capture.py (`CaptureStage`), serve.py (`ServeStage`), check.py (`CheckStage`),
report.py (`ReportStage`); records.py holds what they hand each other and state.py the
`EngineState` that changes while the engine runs. Each stage is an object: its constructor
names what it needs (the state, its collaborators, the fixed parts it reads) and its public
methods are what it offers; no stage imports this module or reaches into another stage.
`Engine` (this module) builds the parts in order (`__init__`), composes the stages over them,
owns the state and releases everything (`close`); `run()` is the whole sequence. Options are
`ascendgraph.runtime.options.EngineOptions` (re-exported here).

Per-batch path: `Engine.route(batch)` names the runner and `Engine.runners[name](batch)`
returns a `RunResult` ("native": ACL graphs or eager as dispatched); `Engine.observers`
see every step (`StepRecord`, with CPU time, simulated time and kernel counts per path) —
the hooks xlite routing and the profiler plug into. All state lives on the engine object (its
fixed parts) and its `EngineState` (what changes).
"""

from __future__ import annotations

import functools
import logging
import math
from contextlib import nullcontext
from typing import Any, Callable, Optional, Union

import torch

from ascendgraph.compile.backend import AscendGraphBackend, CompiledModel
from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.compile.pass_manager import PassManager
from ascendgraph.compile.static_kernel import attach_static_kernels
from ascendgraph.compile.super_kernel import attach_super_kernel
from ascendgraph.config import GraphConfig
from ascendgraph.device import Device, HcclExpansionMode, soc_generation
from ascendgraph.dispatch import GraphDispatcher
from ascendgraph.errors import ConfigError, NumericalMismatch
from ascendgraph.forward_context import KVCache
from ascendgraph.models.build import DecoderModel, build_model, parse_dtype
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Decision, Resolution, resolve
from ascendgraph.runtime.options import (
    DEFAULT_REQUESTS,
    MAX_REQUESTS,
    MAX_SEED,
    MAX_SIMULATED_REQUESTS,
    ON_CAPTURE_ERROR,
    EngineOptions,
    default_atol,
    validate_engine_options,
)
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.profiler import KernelCounter, profile_run
from ascendgraph.runtime.report import Report
from ascendgraph.runtime.stages.build import (
    FLOAT32_ATTENTION_WARNING,
    check_requests_fit,
    make_device,
    make_dispatcher,
    make_inputs,
)
from ascendgraph.runtime.stages.capture import CaptureStage
from ascendgraph.runtime.stages.check import CheckStage
from ascendgraph.runtime.stages.forward import ForwardPlumbing
from ascendgraph.runtime.stages.records import RunResult, StepObserver, StepRecord
from ascendgraph.runtime.stages.report import KernelStages, ReportStage
from ascendgraph.runtime.stages.serve import ServeStage, XliteSetup, start_xlite
from ascendgraph.runtime.stages.state import EngineState
from ascendgraph.runtime.threads import acquire as acquire_threads
from ascendgraph.runtime.workload import Request, ScheduledBatch, Scheduler, WorkloadSpec, generate_workload
from ascendgraph.sizes import DEFAULT_MAX_STREAMS
from ascendgraph.xlite import XliteProfileRun, XliteRoute, XliteRouter, XliteRuntime

__all__ = [
    "EngineOptions",
    "Engine",
    "run",
    "DEFAULT_REQUESTS",
    "default_atol",
    "ON_CAPTURE_ERROR",
    "FLOAT32_ATTENTION_WARNING",
    "MAX_REQUESTS",
    "MAX_SIMULATED_REQUESTS",
    "MAX_SEED",
    "validate_engine_options",
]

log = logging.getLogger(__name__)


class Engine:
    """One engine: a resolved configuration, a model, its graphs and a workload to serve.

    The stages are read one at a time in ascendgraph/runtime/stages/. This class builds the
    fixed parts (device, resolution, workload, model, caches, compile backend), composes the
    stages over them, owns the `EngineState` they share, and ends the lifetime (`close`).
    """

    def __init__(self, config: GraphConfig, options: EngineOptions = EngineOptions()) -> None:
        if not isinstance(config, GraphConfig):
            raise ConfigError(
                f"Engine needs a GraphConfig, got {type(config).__name__}; build one with GraphConfig.from_vllm_args(...)"
            )
        self.options = options
        self.dtype = parse_dtype(options.dtype)
        self.atol = options.atol if options.atol is not None else default_atol(self.dtype)
        lenient: list[str] = []  # declared leniencies of the device (report "lenient")
        self.device: Device = make_device(options, self.dtype, config.soc, lenient)
        self.config = config = _config_for_device(config, options, self.device)
        # the stream limit: --stream-limit > the device's own (a profile's stream_limit) > 1800
        self.stream_limit = options.stream_limit or self.device.stats().stream_limit or DEFAULT_MAX_STREAMS
        self.resolution: Resolution = _resolve(config, options, self.device, self.stream_limit)
        self._make_dispatcher: Callable[[GraphMode], GraphDispatcher] = functools.partial(
            make_dispatcher, config, self.resolution)
        mode = self.resolution.mode
        self.state = EngineState(mode, self._make_dispatcher(mode), list(self.resolution.decisions), lenient)
        self.spec = config.model
        self.query_len = config.uniform_decode_query_len
        # workload first: the KV cache (captured by FULL graphs) is sized from it
        self.requests: list[Request] = list(options.workload) if options.workload is not None else generate_workload(
            options.workload_spec or WorkloadSpec(num_requests=options.requests, seed=options.seed),
            vocab_size=self.spec.vocab_size,
        )
        check_requests_fit(self.requests, self.spec, self.query_len)
        self.scheduler = Scheduler(
            self.requests, max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
            num_speculative_tokens=config.num_speculative_tokens, block_size=config.block_size,
            vocab_size=self.spec.vocab_size, seed=options.seed,
        )
        # The process-wide torch thread count: joined before the model is built (drawn with the
        # engine's count), given back at once if anything below fails, else by the last to close.
        self._threads = acquire_threads(self, options.num_threads)
        try:
            self.model: DecoderModel = self._build_model()
            self.kv_caches, self.reference_kv_caches = self._make_kv_caches()
            self.graph_params = GraphParams(self.device)
            self.capture_state = CaptureState(self.device, debug=options.debug, stream_budget=self.stream_limit,
                                              graph_params=self.graph_params)
            self.pass_manager = options.pass_manager or PassManager.for_resolution(self.resolution)
            self.backend: Optional[AscendGraphBackend] = None
            if mode is not GraphMode.NONE:
                self.backend = AscendGraphBackend(mode=mode, attention_split=self.resolution.attention_split,
                                                  capture_state=self.capture_state, pass_manager=self.pass_manager,
                                                  debug=options.debug)
            self.compiled = CompiledModel(self.model, self.backend, traced_key=self._traced_key(),
                                          cache=self.pass_manager.cache)
            self.observers: list[StepObserver] = []
            # npugraph_ex (issue 10): static-kernel builds are installed on the device, super kernel
            # optimises each captured FULL graph, and kernels per step are counted for the report.
            self.static_kernels = attach_static_kernels(self.pass_manager, self.device)
            self.super_kernel = attach_super_kernel(self.resolution.super_kernel, self.device, self.capture_state)
            self.kernel_counter = KernelCounter.attach(self.device, self.observers, check_eager=options.check_eager)
            self._compose_stages()
        except BaseException:
            self._threads.release()
            raise

    def _build_model(self) -> DecoderModel:
        """The model with seeded weights. A meta-tensor device (planning: `ascendgraph plan`) gets
        it built on meta directly: no weights are ever materialised, so large presets cost no memory."""
        meta = self.device.torch_device.type == "meta"
        # fork_rng: building nn.Modules draws from torch's global generator (their default
        # init); the engine seeds its own weights and must leave the caller's RNG untouched.
        with torch.device("meta") if meta else nullcontext(), torch.random.fork_rng(devices=[]):
            return build_model(
                self.spec,
                attention_backend=self.resolution.attention_backend,
                dtype=self.dtype,
                seed=self.options.seed,
                device=self.device.torch_device,
                quantization=self.options.quantization,
                tensor_parallel_size=self.config.tensor_parallel_size,
            )

    def _make_kv_caches(self) -> tuple[dict[str, KVCache], dict[str, KVCache]]:
        """The graph path's and the eager reference's KV caches: the scheduler's blocks, and at
        least what the warm-up and capture dummy batches need (the fused attention refuses a
        cache smaller than its KV lengths ask for: kernel contract enough_cache_blocks); the
        extra blocks stay unused by requests."""
        config = self.config
        dummy_tokens = max(self.resolution.max_capture_size, config.max_num_batched_tokens, 1)
        dummy_blocks = config.max_num_seqs + math.ceil(dummy_tokens / config.block_size) + 1
        num_blocks = max(self.scheduler.allocator.num_blocks, dummy_blocks)
        return (self.model.make_kv_caches(num_blocks, config.block_size),
                self.model.make_kv_caches(num_blocks, config.block_size))

    def _compose_stages(self) -> None:
        """The stages over the parts built so far, each given what it needs (see each stage's docstring)."""
        config, options, state, device = self.config, self.options, self.state, self.device
        self._forward = ForwardPlumbing(
            device=device, model=self.model, compiled=self.compiled, kv_caches=self.kv_caches,
            reference_kv_caches=self.reference_kv_caches, graph_params=self.graph_params,
            inputs=make_inputs(config, self.resolution, self.spec, device), query_len=self.query_len,
            max_num_seqs=config.max_num_seqs,
        )
        self._capture = CaptureStage(
            state=state, forward=self._forward, device=device, options=options, resolution=self.resolution,
            capture_state=self.capture_state, graph_params=self.graph_params, compiled=self.compiled,
            backend=self.backend, make_dispatcher=self._make_dispatcher,
        )
        self._check = CheckStage(
            state=state, forward=self._forward, model=self.model, device=device, options=options, atol=self.atol,
            xlite_enabled=self.resolution.xlite_enabled, scheduler=self.scheduler,
        )
        # XliteGraph (docs/semantics.md §11): router, the device's runtime and the full-mode
        # start-up profile run; None when xlite is off.
        self.xlite: Optional[XliteSetup] = start_xlite(
            config, dtype=self.dtype, device=device, model=self.model, forward=self._forward,
        ) if self.resolution.xlite_enabled else None
        self._serve = ServeStage(
            state=state, forward=self._forward, check=self._check, device=device, config=config, options=options,
            scheduler=self.scheduler, graph_params=self.graph_params, xlite=self.xlite, notify=self._notify,
        )
        self._report = ReportStage(
            state=state, config=config, options=options, resolution=self.resolution, device=device, spec=self.spec,
            dtype=self.dtype, atol=self.atol, requests_total=len(self.requests), scheduler=self.scheduler,
            capture_state=self.capture_state, compiled=self.compiled, pass_manager=self.pass_manager,
            kernel_stages=KernelStages(self.static_kernels, self.super_kernel, self.kernel_counter),
            xlite=self.xlite, has_clock=self._forward.has_clock,
        )

    def _traced_key(self) -> Optional[str]:
        """The compile cache's key for this engine's traced graph (None: not cached). Only when
        the pass manager uses the cache and every pass is a pure graph rewrite or a graph reader
        (the static-kernel build: `ascendgraph.compile.cache.GRAPH_READERS`)."""
        from ascendgraph.compile.cache import traceable, traced_key

        passes = list(self.pass_manager.passes)
        if self.backend is None or not self.pass_manager.use_cache or not traceable(passes):
            return None
        model_spec = repr((self.spec, self.resolution.attention_backend, str(self.dtype), self.options.quantization,
                           self.config.tensor_parallel_size))
        device = f"{self.device.name}:{self.device.torch_device.type}"
        return traced_key(model_spec, self.mode.name, self.resolution.attention_split, passes, device)

    def _notify(self, record: StepRecord) -> None:
        for observer in self.observers:
            observer.on_step(self, record)

    # ------------------------------------------------------------------ the sequence

    def compile(self) -> float:
        """Trigger the one Dynamo compilation (`CaptureStage.compile`); returns its seconds."""
        return self._capture.compile()

    def capture(self) -> None:
        """Warm up and capture every dispatcher key (`CaptureStage.capture`)."""
        self._capture.capture()

    def serve(self) -> None:
        """Serve the whole workload, capturing first if not done yet (`ServeStage.serve`)."""
        self.capture()
        self._serve.serve()

    def step(self, batch: ScheduledBatch) -> StepRecord:
        """Serve one batch (`ServeStage.step`)."""
        return self._serve.step(batch)

    def route(self, batch: ScheduledBatch) -> str:
        """Which runner serves a batch (`ServeStage.route`)."""
        return self._serve.route(batch)

    def route_decision(self, batch: ScheduledBatch) -> Optional[XliteRoute]:
        """The xlite routing decision of a batch with its reason (None when xlite is off)."""
        return self._serve.route_decision(batch)

    def report(self) -> Report:
        """What the engine did so far (`ReportStage.report`)."""
        return self._report.report()

    def close(self) -> None:
        """Release every captured graph and the stream plan (the engine can be dropped afterwards)."""
        self.capture_state.release()
        if self.state.captured:
            self.device.set_stream_plan(None)
        self._threads.release()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------ views of the parts and the state

    @property
    def runners(self) -> dict[str, Callable[[ScheduledBatch], RunResult]]:
        """Route name -> runner ("native"; "xlite" with XliteGraph on). Callers may wrap them in place."""
        return self._serve.runners

    @property
    def xlite_router(self) -> Optional[XliteRouter]:
        return self.xlite.router if self.xlite is not None else None

    @property
    def xlite_runtime(self) -> Optional[XliteRuntime]:
        return self.xlite.runtime if self.xlite is not None else None

    @property
    def xlite_profile_run(self) -> Optional[XliteProfileRun]:
        return self.xlite.profile_run if self.xlite is not None else None

    @property
    def mode(self) -> GraphMode:
        """The runtime mode served (NONE after an eager fallback)."""
        return self.state.mode

    @property
    def dispatcher(self) -> GraphDispatcher:
        return self.state.dispatcher

    @property
    def decisions(self) -> list[Decision]:
        return self.state.decisions

    @property
    def captured(self) -> bool:
        return self.state.captured

    @property
    def capture_seconds(self) -> float:
        return self.state.capture_seconds

    @property
    def capture_fallback(self) -> Optional[BaseException]:
        return self.state.capture_fallback

    @property
    def graphs_captured_before_failure(self) -> Optional[int]:
        return self.state.graphs_captured_before_failure

    @property
    def first_mismatch(self) -> Optional[NumericalMismatch]:
        return self.state.first_mismatch

    @property
    def error(self) -> Optional[BaseException]:
        """The run's failure (None so far); callers of `capture` / `serve` record what those raise here."""
        return self.state.error

    @error.setter
    def error(self, value: Optional[BaseException]) -> None:
        self.state.error = value


def _config_for_device(config: GraphConfig, options: EngineOptions, device: Device) -> GraphConfig:
    """--sim-profile X resolves as X's SoC does (the CLI refuses a different --soc)."""
    if options.sim_profile is None:
        return config
    generation = soc_generation(device.profile.soc)
    return config.replace(soc=generation) if generation is not None and generation != config.soc else config


def _resolve(config: GraphConfig, options: EngineOptions, device: Device, stream_limit: int) -> Resolution:
    """The resolution against the device's profile, its warnings logged. HCCL's expansion mode is a
    fact of the process (flag or HCCL_OP_EXPANSION_MODE): a device that prices captured collectives
    with it (sim/budget.py) is told the resolved plan's, never the plan's figures."""
    resolution = resolve(config, env=options.env, stream_limit=stream_limit,
                         hccl_op_expansion_mode=options.hccl_op_expansion_mode, device_profile=device.profile)
    for warning in resolution.warnings:
        log.warning("%s", warning)
    if isinstance(device, HcclExpansionMode) and resolution.stream_plan is not None:
        device.set_hccl_op_expansion_mode(resolution.stream_plan.expansion_mode)
    return resolution


def run(
    config: Optional[GraphConfig] = None,
    *,
    device: Union[str, Device] = "auto",
    requests: int = DEFAULT_REQUESTS,
    seed: int = 0,
    **options: Any,
) -> Report:
    """Run a configuration end to end and return the `Report` (never raises for a failed
    run: capture failures, hangs and mismatches are in ``report.error``; bad
    configurations raise ConfigError / GraphModeError / DeviceUnavailable).

    ``options`` are `EngineOptions` fields (on_capture_error, stream_limit, faults, dtype,
    atol, workload, ...).
    """
    engine_options = EngineOptions(device=device, requests=requests, seed=seed, **options)
    engine = Engine(config if config is not None else GraphConfig(), engine_options)
    try:
        # --profile-dir: capture and serving are profiled, the files written after them.
        with profile_run(engine, engine_options.profile_dir) as profile:
            report = _capture_and_serve(engine)
        if profile is not None:
            report.extensions["profile"] = profile.summary()
            if profile.write_error is not None:  # the profile asked for is missing: the run failed (exit 1)
                if report.error is None:
                    report.error = {"type": "ProfileNotWritten", "message": profile.write_error}
                else:
                    report.warnings.append(profile.write_error)
    finally:
        engine.close()
    report.settle_after_release(engine.device)  # a failed capture: what the device holds now
    return report


def _capture_and_serve(engine: Engine) -> Report:
    """Capture, then serve the workload; a failure is recorded in the report, not raised."""
    try:
        engine.capture()
    except RuntimeError as exc:
        engine.error = exc
        engine.scheduler.fail_all(f"capture failed: {type(exc).__name__}")
        return engine.report()
    try:
        engine.serve()
    except Exception as exc:  # a failed run is reported (exit 1), not a crash
        log.error("serving failed: %s: %s", type(exc).__name__, exc)
        engine.error = exc
        engine.scheduler.fail_all(f"{type(exc).__name__}: {exc}")
    return engine.report()
