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
dispatcher, buffers), forward.py (the plumbing every forward shares), capture.py, serve.py,
check.py, report.py; records.py holds what they hand each other. `Engine` (this module) holds
the state, builds it in order (`__init__`) and releases it (`close`); `run()` is the whole
sequence.

Per-batch path: `Engine.route(batch)` names the runner and `Engine.runners[name](batch)`
returns a `RunResult` ("native": ACL graphs or eager as dispatched); `Engine.observers`
see every step (`StepRecord`, with CPU time, simulated time and kernel counts per path) —
the hooks xlite routing and the profiler plug into. All state lives on the engine object.
"""

from __future__ import annotations

import logging
import math
import os
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch

from ascendgraph.compile.backend import AscendGraphBackend, CompiledModel
from ascendgraph.compile.pass_manager import PassManager
from ascendgraph.compile.static_kernel import attach_static_kernels
from ascendgraph.compile.super_kernel import attach_super_kernel
from ascendgraph.config import GraphConfig
from ascendgraph.device import Device, soc_generation
from ascendgraph.errors import ConfigError, NumericalMismatch
from ascendgraph.models.build import DecoderModel, build_model, parse_dtype
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Decision, Resolution, resolve
from ascendgraph.compile.graph_wrapper import CaptureState
from ascendgraph.forward_context import KVCache
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.profiler import KernelCounter, profile_run
from ascendgraph.runtime.report import Report
from ascendgraph.runtime.stages.build import FLOAT32_ATTENTION_WARNING, BuildStage
from ascendgraph.runtime.stages.capture import CaptureStage
from ascendgraph.runtime.stages.check import CheckStage
from ascendgraph.runtime.stages.forward import ForwardPlumbing
from ascendgraph.runtime.stages.records import Counters, RunResult, StepObserver
from ascendgraph.runtime.stages.report import ReportStage
from ascendgraph.runtime.stages.serve import ServeStage
from ascendgraph.runtime.threads import AUTO, ThreadRequest, resolve_num_threads
from ascendgraph.runtime.threads import acquire as acquire_threads
from ascendgraph.runtime.workload import Request, ScheduledBatch, Scheduler, WorkloadSpec, generate_workload
from ascendgraph.sizes import DEFAULT_MAX_STREAMS
from ascendgraph.xlite import NATIVE, XLITE, XliteProfileRun, XliteRouter, XliteRuntime

__all__ = [
    "EngineOptions",
    "Engine",
    "run",
    "DEFAULT_REQUESTS",
    "default_atol",
    "ON_CAPTURE_ERROR",
    "FLOAT32_ATTENTION_WARNING",
]

log = logging.getLogger(__name__)

DEFAULT_REQUESTS = 16
ON_CAPTURE_ERROR = ("raise", "eager")
# Upper bounds (the CLI's `ascendgraph.cli.args.LIMITS` say the same; a test keeps them equal).
MAX_REQUESTS = 1_000_000
# Requests one run simulates at most: every step runs the model on the CPU simulator (about 0.2 to
# 0.4 s of CPU a request for the default tiny model on a 2-core laptop, measured with
# `ascendgraph run --requests 16` and `--requests 160`), so a million requests would run for days.
# Larger workloads are for `ascendgraph plan --workload FILE`, which models the scheduler only.
MAX_SIMULATED_REQUESTS = 1_000
MAX_SEED = 2**63 - 1
_ATOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def default_atol(dtype: Union[str, torch.dtype]) -> float:
    """docs/semantics.md "Checking against eager": 1e-4 for float32, 2e-2 for bfloat16."""
    return _ATOL[parse_dtype(dtype)]


@dataclass(frozen=True)
class EngineOptions:
    """How to run a configuration (everything that is not the vLLM configuration itself)."""

    device: Union[str, Device] = "auto"
    requests: int = DEFAULT_REQUESTS
    seed: int = 0
    workload: Optional[Sequence[Request]] = None  # overrides requests / seed-generated prompts
    workload_spec: Optional[WorkloadSpec] = None
    on_capture_error: str = "raise"
    stream_limit: Optional[int] = None
    hccl_op_expansion_mode: Optional[str] = None
    faults: Optional[str] = None
    sim_profile: Optional[str] = None  # sim only: a profile name or calibration JSON; default: config.soc
    dtype: str = "bfloat16"  # what torch_npu's fused attention takes; float32 is a declared sim leniency
    atol: Optional[float] = None
    check_eager: bool = True
    debug: bool = False  # check input addresses at every replay
    progress: Optional[bool] = None  # None: when stderr is a terminal
    env: Optional[dict[str, str]] = None
    # torch intra-op threads, process-wide (ascendgraph.runtime.threads): "auto" is the CLI's policy
    # (1 unless OMP_NUM_THREADS is set), None leaves torch alone, an int asks for exactly that many.
    num_threads: ThreadRequest = AUTO
    pass_manager: Optional[PassManager] = None
    quantization: Optional[str] = None  # None | "w8a8" | "w8a8_dynamic": the W8A8-like model variant
    profile_dir: Optional[str] = None  # `run()` profiles capture + serving into this directory
    # Failure-mode switches for tests of docs/semantics.md §7 (never use them to "fix" a run).
    skip_param_update: bool = False  # the kernel is not re-issued: stale lengths -> wrong results
    record_update_events: bool = True  # False: replays wait for ever -> GraphHang
    # Simulated data parallelism (the engine is one process): the token counts of the OTHER
    # dp-1 ranks for each batch; xlite routes on the maximum over all ranks. None: they are idle.
    dp_peer_tokens: Optional[Callable[[ScheduledBatch], Sequence[int]]] = None

    def __post_init__(self) -> None:
        validate_engine_options(self)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, low: int, high: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_int(value) or not low <= value <= high:
        upper = "2**63 - 1" if high == 2**63 - 1 else str(high)
        raise ConfigError(f"{name} must be an integer from {low} to {upper}, got {value!r}", key=name)


def validate_engine_options(options: EngineOptions) -> None:
    """Every EngineOptions value has the right type and range (ConfigError naming it)."""
    device = options.device  # a backend name (checked by get_device) or a Device object
    if not isinstance(device, str) and not callable(getattr(device, "new_stream", None)):
        raise ConfigError(f"device must be a backend name (sim, npu, auto) or a Device object, got {device!r}",
                          key="device")
    if options.on_capture_error not in ON_CAPTURE_ERROR:
        raise ConfigError(
            f"on_capture_error must be one of {', '.join(ON_CAPTURE_ERROR)}, got {options.on_capture_error!r}",
            key="on_capture_error",
        )
    _check_int("requests", options.requests, 1, MAX_REQUESTS)
    if options.requests > MAX_SIMULATED_REQUESTS:
        raise ConfigError(
            f"requests {options.requests} is more than a run simulates ({MAX_SIMULATED_REQUESTS} at most: every step "
            f"runs the model on the simulator, about 0.2-0.4 s of CPU a request, so this would take hours); "
            f"run at most {MAX_SIMULATED_REQUESTS} requests, or size a large workload with "
            f"`ascendgraph plan --workload FILE`",
            key="requests",
        )
    _check_int("seed", options.seed, 0, MAX_SEED)
    _check_int("stream_limit", options.stream_limit, 1, 2**63 - 1, optional=True)  # planning uses 2**30
    atol = options.atol
    if atol is not None and (isinstance(atol, bool) or not isinstance(atol, (int, float))
                             or not (atol >= 0 and math.isfinite(atol))):
        raise ConfigError(f"atol must be a finite number >= 0, got {atol!r}", key="atol")
    if options.profile_dir is not None and not (isinstance(options.profile_dir, (str, os.PathLike))
                                                and str(options.profile_dir).strip()):
        raise ConfigError(f"profile_dir must be a directory path, got {options.profile_dir!r}", key="profile_dir")
    if options.env is not None and not isinstance(options.env, Mapping):
        raise ConfigError(f"env must be a mapping of variable names to values, got {options.env!r}", key="env")
    parse_dtype(options.dtype)
    resolve_num_threads(options.num_threads)


class Engine(BuildStage, ForwardPlumbing, CaptureStage, ServeStage, CheckStage, ReportStage):
    """One engine: a resolved configuration, a model, its graphs and a workload to serve.

    The stages are read one at a time in ascendgraph/runtime/stages/: build (`BuildStage`),
    forward plumbing (`ForwardPlumbing`), capture (`CaptureStage`), serve (`ServeStage`),
    check (`CheckStage`) and report (`ReportStage`). This class holds all state (set here)
    and the lifetime (`close`).
    """

    def __init__(self, config: GraphConfig, options: EngineOptions = EngineOptions()) -> None:
        if not isinstance(config, GraphConfig):
            raise ConfigError(
                f"Engine needs a GraphConfig, got {type(config).__name__}; build one with GraphConfig.from_vllm_args(...)"
            )
        self.config = config
        self.options = options
        self.dtype = parse_dtype(options.dtype)
        self.atol = options.atol if options.atol is not None else default_atol(self.dtype)
        self.lenient: list[str] = []  # declared leniencies of the device (report "lenient")
        self.device: Device = self._make_device()
        profile = getattr(self.device, "profile", None)
        if options.sim_profile is not None and profile is not None:
            # --sim-profile X resolves as X's SoC does (the CLI refuses a different --soc)
            generation = soc_generation(profile.soc)
            if generation is not None and generation != config.soc:
                config = self.config = config.replace(soc=generation)
        # the stream limit: --stream-limit > the device's own (a profile's stream_limit) > 1800
        device_limit = self.device.stats().stream_limit if profile is not None else None
        self.stream_limit = options.stream_limit or device_limit or DEFAULT_MAX_STREAMS
        self.resolution: Resolution = resolve(
            config,
            env=options.env,
            stream_limit=self.stream_limit,
            hccl_op_expansion_mode=options.hccl_op_expansion_mode,
            device_profile=profile,
        )
        for warning in self.resolution.warnings:
            log.warning("%s", warning)
        self.decisions: list[Decision] = list(self.resolution.decisions)
        # HCCL's expansion mode is a fact of the process (flag or HCCL_OP_EXPANSION_MODE): the
        # simulator prices captured collectives with it (sim/budget.py), never with the plan's figures.
        set_expansion = getattr(self.device, "set_hccl_op_expansion_mode", None)
        if set_expansion is not None and self.resolution.stream_plan is not None:
            set_expansion(self.resolution.stream_plan.expansion_mode)
        self.mode = self.resolution.mode
        self.dispatcher = self._make_dispatcher(self.mode)
        self.spec = config.model
        self.query_len = config.uniform_decode_query_len

        # workload first: the KV cache (captured by FULL graphs) is sized from it
        self.requests = list(options.workload) if options.workload is not None else generate_workload(
            options.workload_spec or WorkloadSpec(num_requests=options.requests, seed=options.seed),
            vocab_size=self.spec.vocab_size,
        )
        self._check_requests_fit()
        self.scheduler = Scheduler(
            self.requests,
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            num_speculative_tokens=config.num_speculative_tokens,
            block_size=config.block_size,
            vocab_size=self.spec.vocab_size,
            seed=options.seed,
        )

        # A meta-tensor device (planning: `ascendgraph plan`) gets a model built on meta
        # directly: no weights are ever materialised, so large presets cost no memory.
        meta = self.device.torch_device.type == "meta"
        # fork_rng: building nn.Modules draws from torch's global generator (their default
        # init); the engine seeds its own weights and must leave the caller's RNG untouched.
        with torch.device("meta") if meta else nullcontext(), torch.random.fork_rng(devices=[]):
            self.model: DecoderModel = build_model(
                self.spec,
                attention_backend=self.resolution.attention_backend,
                dtype=self.dtype,
                seed=options.seed,
                device=self.device.torch_device,
                quantization=options.quantization,
                tensor_parallel_size=config.tensor_parallel_size,
            )
        # The scheduler's blocks, and at least what the warm-up and capture dummy batches
        # need (the fused attention refuses a cache smaller than its KV lengths ask for:
        # kernel contract enough_cache_blocks); the extra blocks stay unused by requests.
        dummy_tokens = max(self.resolution.max_capture_size, config.max_num_batched_tokens, 1)
        dummy_blocks = config.max_num_seqs + math.ceil(dummy_tokens / config.block_size) + 1
        num_blocks = max(self.scheduler.allocator.num_blocks, dummy_blocks)
        self.kv_caches: dict[str, KVCache] = self.model.make_kv_caches(num_blocks, config.block_size)
        self.reference_kv_caches: dict[str, KVCache] = self.model.make_kv_caches(num_blocks, config.block_size)
        self.inputs = self._make_inputs()

        self.graph_params = GraphParams(self.device)
        self.capture_state = CaptureState(
            self.device,
            debug=options.debug,
            stream_budget=self.stream_limit,
            graph_params=self.graph_params,
        )
        self.pass_manager = options.pass_manager or PassManager.for_resolution(self.resolution)
        self.backend: Optional[AscendGraphBackend] = None
        if self.mode is not GraphMode.NONE:
            self.backend = AscendGraphBackend(
                mode=self.mode,
                attention_split=self.resolution.attention_split,
                capture_state=self.capture_state,
                pass_manager=self.pass_manager,
                debug=options.debug,
            )
        self.compiled = CompiledModel(self.model, self.backend, traced_key=self._traced_key(options),
                                      cache=self.pass_manager.cache)
        self.observers: list[StepObserver] = []
        # npugraph_ex (issue 10): static-kernel builds are installed on the device, super kernel
        # optimises each captured FULL graph, and kernels per step are counted for the report.
        self.static_kernels = attach_static_kernels(self.pass_manager, self.device)
        self.super_kernel = attach_super_kernel(self.resolution.super_kernel, self.device, self.capture_state)
        self.kernel_counter = KernelCounter.attach(self)
        # route name -> runner; `route(batch)` picks one per batch (xlite adds its own).
        self.runners: dict[str, Callable[[ScheduledBatch], RunResult]] = {"native": self._run_native}
        # XliteGraph (docs/semantics.md §11): router, the device's runtime, served batches per route and
        # the full-mode start-up profile run; router/runtime are None when xlite is off.
        self.batches_by_route: dict[str, int] = {XLITE: 0, NATIVE: 0}
        self.xlite_router: Optional[XliteRouter] = None
        self.xlite_runtime: Optional[XliteRuntime] = None
        self.xlite_profile_run: Optional[XliteProfileRun] = None
        if self.resolution.xlite_enabled:
            self._start_xlite()
        self._has_clock = getattr(self.device, "track_eager", None) is not None
        self.capture_seconds = 0.0
        self.capture_fallback: Optional[BaseException] = None
        self.graphs_captured_before_failure: Optional[int] = None  # set when a capture fails
        self.captured = False
        self.error: Optional[BaseException] = None
        self.first_mismatch: Optional[NumericalMismatch] = None
        self._counters = Counters()
        self._stats_before_capture = None
        # torch's intra-op thread count is process-global: join the policy last (nothing above
        # may fail with it changed); the last engine to close gives the caller's value back.
        self._threads = acquire_threads(self, options.num_threads)


    def _traced_key(self, options: "EngineOptions") -> Optional[str]:
        """The compile cache's key for this engine's traced graph (None: not cached). Only when
        the pass manager uses the cache and every pass is a pure graph rewrite."""
        from ascendgraph.compile.cache import cacheable, traced_key

        passes = list(self.pass_manager.passes)
        if self.backend is None or not self.pass_manager.use_cache or (passes and not cacheable(passes)):
            return None
        model_spec = repr((self.spec, self.resolution.attention_backend, str(self.dtype), options.quantization,
                           self.config.tensor_parallel_size))
        device = f"{getattr(self.device, 'name', type(self.device).__name__)}:{self.device.torch_device.type}"
        return traced_key(model_spec, self.mode.name, self.resolution.attention_split, passes, device)

    def close(self) -> None:
        """Release every captured graph and the stream plan (the engine can be dropped afterwards)."""
        self.capture_state.release()
        if self.captured:
            self.device.set_stream_plan(None)
        self._threads.release()

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()



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
