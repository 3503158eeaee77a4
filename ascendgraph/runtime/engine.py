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

Per-batch path: `Engine.route(batch)` names the runner and `Engine.runners[name](batch)`
returns a `RunResult` ("native": ACL graphs or eager as dispatched); `Engine.observers`
see every step (`StepRecord`, with CPU time, simulated time and kernel counts per path) —
the hooks xlite routing and the profiler plug into. All state lives on the engine object.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Optional, Protocol, Sequence, Union

import torch

from ascendgraph.runtime.capture import CaptureState
from ascendgraph.compile.backend import AscendGraphBackend, CompiledModel
from ascendgraph.compile.pass_manager import PassManager
from ascendgraph.compile.passes import fused_ops
from ascendgraph.compile.static_kernel import attach_static_kernels
from ascendgraph.compile.super_kernel import attach_super_kernel
from ascendgraph.config import GraphConfig
from ascendgraph.device import Device, get_device, resolve_device_name
from ascendgraph.dispatch import BatchDescriptor, GraphDispatcher
from ascendgraph.errors import (
    CaptureError,
    ConfigError,
    DeviceLost,
    GraphHang,
    NumericalMismatch,
)
from ascendgraph.runtime.forward_context import AttentionMetadata, ForwardContext, KVCache, set_forward_context
from ascendgraph.models.build import DecoderModel, build_model, parse_dtype
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.profiler import KernelCounter, profile_run
from ascendgraph.runtime.report import (
    MISMATCH_CAUSES_EAGER,
    MISMATCH_CAUSES_GRAPH,
    RUNTIME_MODE_KEYS,
    Report,
    failure_notes,
)
from ascendgraph.runtime.threads import AUTO, ThreadRequest, resolve_num_threads
from ascendgraph.runtime.threads import acquire as acquire_threads
from ascendgraph.resolve import Decision, Resolution, resolve
from ascendgraph.sizes import DEFAULT_MAX_STREAMS
from ascendgraph.runtime.workload import Request, ScheduledBatch, Scheduler, WorkloadSpec, generate_workload
from ascendgraph.xlite import NATIVE, XLITE, XliteProfileRun, XliteRoute, XliteRouter, XliteRuntime, XliteRuntimeSpec

__all__ = [
    "EngineOptions",
    "Engine",
    "StepRecord",
    "StepObserver",
    "RunResult",
    "run",
    "DEFAULT_REQUESTS",
    "default_atol",
    "ON_CAPTURE_ERROR",
]

log = logging.getLogger(__name__)

DEFAULT_REQUESTS = 16
ON_CAPTURE_ERROR = ("raise", "eager")
# Upper bounds (the CLI's `ascendgraph.cli.app.LIMITS` say the same; a test keeps them equal).
MAX_REQUESTS = 1_000_000
MAX_SEED = 2**63 - 1
_ATOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
_MAX_IDLE_STEPS = 10_000


def default_atol(dtype: Union[str, torch.dtype]) -> float:
    """INTERFACES "Checking against eager": 1e-4 for float32, 2e-2 for bfloat16."""
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
    dtype: str = "float32"
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
    # Failure-mode switches for tests of SEMANTICS §7 (never use them to "fix" a run).
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


@dataclass(frozen=True)
class StepRecord:
    """What one served step did (observers receive these)."""

    step: int
    kind: str  # decode | prefill | mixed
    route: str  # native | (xlite, ...)
    runtime_mode: GraphMode
    descriptor: BatchDescriptor
    num_reqs: int
    num_tokens: int
    padded_tokens: int
    max_abs_diff: float
    graph_time_us: Optional[float]  # simulated device time (None on devices without a virtual clock)
    eager_time_us: Optional[float]
    graph_cpu_s: float = 0.0  # host CPU time of the graph path (dispatch, replay, update, sync)
    eager_cpu_s: float = 0.0  # host CPU time of the eager reference
    graph_kernels: int = 0  # device kernel records of the graph path (while the device records them)
    eager_kernels: int = 0


@dataclass
class _Measure:
    cpu_s: float = 0.0
    device_us: float = 0.0
    kernels: int = 0


@dataclass
class RunResult:
    """What a runner returns for one batch: the real tokens' hidden states and how it ran."""

    hidden: torch.Tensor  # [num_tokens, hidden], unpadded
    runtime_mode: GraphMode
    descriptor: BatchDescriptor
    padded_tokens: int
    measure: _Measure


class StepObserver(Protocol):
    """Sees every served step (profilers, kernel counters)."""

    def on_step(self, engine: "Engine", record: StepRecord) -> None: ...


@dataclass
class _Inputs:
    """Persistent input buffers: graphs read these addresses at every replay."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    block_table: torch.Tensor


@dataclass
class _Counters:
    batches_by_mode: dict[str, int] = field(default_factory=lambda: {k: 0 for k in RUNTIME_MODE_KEYS})
    graphed_real_tokens: int = 0
    graphed_padded_tokens: int = 0
    max_abs_diff: float = 0.0
    graph_time_us: float = 0.0
    eager_time_us: float = 0.0
    steps: int = 0
    checked_steps: int = 0  # steps compared with eager


class Engine:
    """One engine: a resolved configuration, a model, its graphs and a workload to serve."""

    def __init__(self, config: GraphConfig, options: EngineOptions = EngineOptions()) -> None:
        if not isinstance(config, GraphConfig):
            raise ConfigError(
                f"Engine needs a GraphConfig, got {type(config).__name__}; build one with GraphConfig.from_vllm_args(...)"
            )
        self.config = config
        self.options = options
        self.dtype = parse_dtype(options.dtype)
        self.atol = options.atol if options.atol is not None else default_atol(self.dtype)
        self.stream_limit = options.stream_limit or DEFAULT_MAX_STREAMS
        self.resolution: Resolution = resolve(
            config,
            env=options.env,
            stream_limit=self.stream_limit,
            hccl_op_expansion_mode=options.hccl_op_expansion_mode,
        )
        for warning in self.resolution.warnings:
            log.warning("%s", warning)
        self.decisions: list[Decision] = list(self.resolution.decisions)
        self.device: Device = self._make_device()
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
            )
        num_blocks = self.scheduler.allocator.num_blocks
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
        self.compiled = CompiledModel(self.model, self.backend)
        self.observers: list[StepObserver] = []
        # npugraph_ex (issue 10): static-kernel builds are installed on the device, super kernel
        # optimises each captured FULL graph, and kernels per step are counted for the report.
        self.static_kernels = attach_static_kernels(self)
        self.super_kernel = attach_super_kernel(self)
        self.kernel_counter = KernelCounter.attach(self)
        # route name -> runner; `route(batch)` picks one per batch (xlite adds its own).
        self.runners: dict[str, Callable[[ScheduledBatch], RunResult]] = {"native": self._run_native}
        # XliteGraph (SEMANTICS §11): router, the device's runtime, served batches per route and
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
        self._counters = _Counters()
        self._stats_before_capture = None
        # torch's intra-op thread count is process-global: join the policy last (nothing above
        # may fail with it changed); the last engine to close gives the caller's value back.
        self._threads = acquire_threads(self, options.num_threads)

    # ------------------------------------------------------------------ construction
    def _make_device(self) -> Device:
        device = self.options.device
        if not isinstance(device, str):
            if self.options.faults is not None:
                set_plan = getattr(device, "set_fault_plan", None)
                if set_plan is None:
                    raise ConfigError("--faults needs the sim device (fault injection is simulated)", key="faults")
                set_plan(self.options.faults)
            return device
        name = device.strip().lower()
        sim_only = self.options.faults is not None or self.options.sim_profile is not None
        if name == "auto":
            # fault injection only exists on the simulator; otherwise the backend auto lands on,
            # so the simulator's options (profile, seed, stream limit) apply to `auto` too
            name = "sim" if sim_only else resolve_device_name(name)
        if name == "npu" and sim_only:
            raise ConfigError(
                "--faults and --sim-profile need --device sim (they configure the simulator)", key="device"
            )
        device_options: dict[str, Any] = {}
        if name == "sim":
            device_options = {"seed": self.options.seed, "profile": self.options.sim_profile or self.config.soc}
            if self.options.stream_limit is not None:
                device_options["stream_limit"] = self.options.stream_limit
            if self.options.faults is not None:
                device_options["faults"] = self.options.faults
            if self.options.env is not None:
                device_options["env"] = self.options.env
        return get_device(name, **device_options)

    def _make_dispatcher(self, mode: GraphMode) -> GraphDispatcher:
        config = self.config
        return GraphDispatcher(
            mode,
            capture_sizes=self.resolution.capture_sizes if mode is not GraphMode.NONE else [],
            max_num_seqs=config.max_num_seqs,
            uniform_decode_query_len=config.uniform_decode_query_len,
            max_loras=config.max_loras,
            specialize_lora=config.cudagraph_specialize_lora,
        )

    def _check_requests_fit(self) -> None:
        limit = self.spec.max_position_embeddings
        for request in self.requests:
            longest = request.prompt_len + request.max_tokens + self.query_len
            if longest > limit:
                raise ConfigError(
                    f"request {request.request_id} needs {longest} positions (prompt {request.prompt_len} + "
                    f"{request.max_tokens} outputs + {self.query_len}) but the model has {limit}",
                    key="requests",
                )

    def _make_inputs(self) -> _Inputs:
        config = self.config
        device = self.device.torch_device
        max_tokens = max(config.max_num_batched_tokens, self.resolution.max_capture_size, 1)
        rows = max(config.max_num_seqs, 1)
        width = max(1, math.ceil(self.spec.max_position_embeddings / config.block_size))
        return _Inputs(
            input_ids=torch.zeros(max_tokens, dtype=torch.long, device=device),
            positions=torch.zeros(max_tokens, dtype=torch.long, device=device),
            slot_mapping=torch.full((max_tokens,), -1, dtype=torch.long, device=device),
            block_table=torch.zeros((rows, width), dtype=torch.int32, device=device),
        )

    # ------------------------------------------------------------------ forward plumbing
    def _context(
        self, mode: GraphMode, descriptor: BatchDescriptor, metadata: AttentionMetadata, *, reference: bool = False
    ) -> ForwardContext:
        return ForwardContext(
            runtime_mode=mode,
            batch_descriptor=descriptor,
            attn_metadata=metadata,
            kv_caches=self.reference_kv_caches if reference else self.kv_caches,
            attention_layers=self.model.attention_layers,
            device=self.device,
            graph_params=None if reference else self.graph_params,
        )

    def _write_batch(self, batch: ScheduledBatch, *, padded_tokens: int, padded_rows: int) -> None:
        """The persistent buffers for a scheduled batch: its requests' tokens, positions, slots, blocks."""
        requests = batch.requests
        self._write_inputs(
            [t for r in requests for t in r.token_ids],
            [r.start_position + i for r in requests for i in range(r.num_tokens)],
            [s for r in requests for s in r.slot_ids],
            [r.block_ids for r in requests],
            padded_tokens=padded_tokens,
            padded_rows=padded_rows,
        )

    def _write_inputs(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        block_rows: Sequence[Sequence[int]],
        *,
        padded_tokens: int,
        padded_rows: int,
    ) -> None:
        """Fill the persistent buffers for one forward (padding: token 0, position 0, slot -1)."""
        inputs = self.inputs
        device = inputs.input_ids.device
        count = len(token_ids)
        inputs.input_ids[:count].copy_(torch.tensor(token_ids, dtype=torch.long, device=device))
        inputs.positions[:count].copy_(torch.tensor(positions, dtype=torch.long, device=device))
        inputs.slot_mapping[:count].copy_(torch.tensor(slots, dtype=torch.long, device=device))
        if padded_tokens > count:
            inputs.input_ids[count:padded_tokens].zero_()
            inputs.positions[count:padded_tokens].zero_()
            inputs.slot_mapping[count:padded_tokens].fill_(-1)
        table = inputs.block_table
        table[: max(padded_rows, len(block_rows))].zero_()
        for row, blocks in enumerate(block_rows):
            if blocks:
                table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32, device=device)

    def _forward(
        self, mode: GraphMode, descriptor: BatchDescriptor, metadata: AttentionMetadata, padded_tokens: int
    ) -> torch.Tensor:
        with set_forward_context(self._context(mode, descriptor, metadata)):
            return self.compiled(self.inputs.input_ids[:padded_tokens], self.inputs.positions[:padded_tokens])

    # ------------------------------------------------------------------ capture
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

    def _progress(self) -> bool:
        if self.options.progress is not None:
            return self.options.progress
        return sys.stderr.isatty() and log.getEffectiveLevel() <= logging.INFO

    def compile(self) -> float:
        """Trigger the one Dynamo compilation (a dummy eager forward at the largest size)."""
        if not self.compiled.is_compiled or self.backend is None or self.backend.artifacts:
            return self.compiled.compile_seconds
        size = max(self.resolution.max_capture_size, 1)
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
                for label, group in _capture_groups(order):
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
        log.info("released %d captured graphs; device now: %s", released, self.device.stats())
        previous = self.mode
        self.mode = GraphMode.NONE
        self.dispatcher = self._make_dispatcher(GraphMode.NONE)
        self.decisions.append(
            Decision("capture_fallback", previous.name, GraphMode.NONE.name,
                     f"capture failed with {type(exc).__name__}; graphs released, serving eagerly")
        )

    # ------------------------------------------------------------------ serving
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

    def _route_extensions(self) -> dict[str, Any]:
        """Report.extensions of routing: batches_by_route always; the xlite settings when on."""
        extensions: dict[str, Any] = {}
        router = self.xlite_router
        if router is not None:
            extensions["xlite"] = {
                "enabled": True,
                "full_mode": router.full_mode,
                "budget": router.budget,
                "data_parallel_size": router.data_parallel_size,
                "profile_run": self.xlite_profile_run.as_dict() if self.xlite_profile_run else None,
            }
        extensions["batches_by_route"] = dict(self.batches_by_route)
        return extensions

    def _batch_metadata(
        self, batch: ScheduledBatch, descriptor: BatchDescriptor, padded_tokens: int
    ) -> AttentionMetadata:
        rows = max(batch.num_reqs, descriptor.num_reqs or 0)
        return AttentionMetadata(
            num_reqs=batch.num_reqs,
            num_actual_tokens=batch.num_tokens,
            num_tokens=padded_tokens,
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_table=self.inputs.block_table[:rows],
            slot_mapping=self.inputs.slot_mapping[:padded_tokens],
            uniform_decode=descriptor.uniform,
            query_len=self.query_len,
        )

    @contextmanager
    def _measured(self) -> Iterator[_Measure]:
        """Host CPU time, virtual device time and kernel records of the block (eager ops are
        tracked on devices that price them, e.g. the simulator's ``track_eager``)."""
        measure = _Measure()
        track = getattr(self.device, "track_eager", None)
        records = getattr(self.device, "kernel_records", None)
        kernels_before = len(records) if records is not None else 0
        before = self.device.stats().virtual_time_us
        cpu_before = time.process_time()
        with track() if track is not None else nullcontext():
            yield measure
        measure.cpu_s = time.process_time() - cpu_before
        measure.device_us = self.device.stats().virtual_time_us - before
        measure.kernels = (len(records) - kernels_before) if records is not None else 0

    def _run_native(self, batch: ScheduledBatch) -> RunResult:
        """ACL graphs or eager, as the dispatcher says: pad, replay, update FULL params, sync."""
        tokens = batch.num_tokens
        mode, descriptor = self.dispatcher.dispatch(tokens, uniform_decode=batch.uniform_decode)
        padded = descriptor.num_tokens if mode is not GraphMode.NONE else tokens
        rows = max(batch.num_reqs, descriptor.num_reqs or 0)
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

    def _run_reference(self, batch: ScheduledBatch) -> tuple[torch.Tensor, _Measure]:
        """The uncompiled model, eagerly, on the unpadded batch, with its own KV cache."""
        device = self.device.torch_device
        tokens = batch.num_tokens
        ids = torch.tensor([t for r in batch.requests for t in r.token_ids], dtype=torch.long, device=device)
        positions = torch.tensor(
            [r.start_position + i for r in batch.requests for i in range(r.num_tokens)], dtype=torch.long, device=device
        )
        width = self.inputs.block_table.shape[1]
        table = torch.zeros((batch.num_reqs, width), dtype=torch.int32, device=device)
        for row, r in enumerate(batch.requests):
            table[row, : len(r.block_ids)] = torch.tensor(r.block_ids, dtype=torch.int32, device=device)
        metadata = AttentionMetadata(
            num_reqs=batch.num_reqs,
            num_actual_tokens=tokens,
            num_tokens=tokens,
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_table=table,
            slot_mapping=torch.tensor([s for r in batch.requests for s in r.slot_ids], dtype=torch.long, device=device),
            query_len=self.query_len,
        )
        context = self._context(GraphMode.NONE, BatchDescriptor(tokens), metadata, reference=True)
        with self._measured() as measure, set_forward_context(context):
            hidden = self.model(ids, positions)
            self.device.synchronize()
        return hidden, measure

    def _sample(self, batch: ScheduledBatch, hidden: torch.Tensor) -> dict[str, list[int]]:
        """Greedy predictions after every query token of each request (from the graph path)."""
        predictions = self.model.compute_logits(hidden).argmax(dim=-1).tolist()
        sampled, start = {}, 0
        for r in batch.requests:
            sampled[r.request_id] = predictions[start : start + r.num_tokens]
            start += r.num_tokens
        return sampled

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
            diff, eager = 0.0, None
            if self.options.check_eager:
                reference, eager = self._run_reference(batch)
                diff = (hidden.float() - reference.float()).abs().max().item() if hidden.numel() else 0.0
                if math.isnan(diff):
                    diff = math.inf
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
            ids = [r.request_id for r in batch.requests]
            if not diff <= self.atol:
                mismatch = NumericalMismatch(
                    f"step {batch.step} ({batch.kind}, {batch.num_tokens} tokens, {mode.name} {descriptor}) differs from "
                    f"eager by {diff:.3g} > atol {self.atol:g}; requests {', '.join(ids)} failed; "
                    + (MISMATCH_CAUSES_EAGER if mode is GraphMode.NONE and route != XLITE else MISMATCH_CAUSES_GRAPH)
                )
                log.error("%s", mismatch)
                if self.first_mismatch is None:
                    self.first_mismatch = mismatch
                self.scheduler.fail(ids, str(mismatch))
            else:
                self.scheduler.complete(batch, self._sample(batch, hidden))
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
                if idle > _MAX_IDLE_STEPS:  # pragma: no cover - arrivals are bounded
                    raise RuntimeError("the scheduler made no progress for too many steps")
                continue
            idle = 0
            try:
                self.step(batch)
            except (GraphHang, DeviceLost) as exc:
                log.error("%s: %s", type(exc).__name__, exc)
                self.error = exc
                self.scheduler.fail_all(f"{type(exc).__name__}: {exc}")
                return

    # ------------------------------------------------------------------ report
    def report(self) -> Report:
        resolution = self.resolution
        stats = self.device.stats()
        counters = self._counters
        completed = len(self.scheduler.finished)
        failed = len(self.scheduler.failed)
        error_exc: Optional[BaseException] = self.error or self.first_mismatch
        error = {"type": type(error_exc).__name__, "message": str(error_exc)} if error_exc else None
        if error is None and failed:
            error = {"type": "RequestsFailed", "message": f"{failed} request(s) failed"}
        real, padded = counters.graphed_real_tokens, counters.graphed_padded_tokens
        has_clock = self._has_clock
        fallback = self.capture_fallback
        plan = resolution.stream_plan
        report = Report(
            requested_mode=resolution.requested_mode.name,
            effective_mode=self.mode.name,
            decisions=[d.as_dict() for d in self.decisions],
            capture_sizes=list(resolution.capture_sizes) if self.mode is not GraphMode.NONE else [],
            graphs_captured=self.capture_state.graphs_captured if fallback is None else 0,
            streams_used=stats.streams_in_use,
            stream_limit=plan.max_streams if plan is not None else stats.stream_limit,
            pool_bytes=stats.pool_bytes,
            capture_seconds=self.capture_seconds,
            requests_completed=completed,
            requests_failed=failed,
            batches_by_mode=dict(counters.batches_by_mode),
            padding_waste=(padded / real - 1) if real else 0.0,
            max_abs_diff_vs_eager=counters.max_abs_diff,
            simulated_time_us={
                "graph": counters.graph_time_us if has_clock else None,
                "eager": counters.eager_time_us if has_clock and self.options.check_eager else None,
            },
            error=error,
            device=getattr(self.device, "name", str(self.device)),
            model=self.spec.name,
            architecture=self.spec.architecture,
            num_layers=self.spec.num_hidden_layers,
            attention_backend=resolution.attention_backend,
            dtype=str(self.dtype).replace("torch.", ""),
            atol=self.atol,
            compile_seconds=self.compiled.compile_seconds,
            steps=counters.steps,
            requests_total=len(self.requests),
            warnings=list(resolution.warnings),
            capture_fallback={"type": type(fallback).__name__, "message": str(fallback)} if fallback else None,
            graphs_captured_before_failure=self.graphs_captured_before_failure,
            eager_checked_steps=counters.checked_steps,
            requested_mode_is_default=self.config.cudagraph_mode is None,
            notes=self._notes(error_exc or fallback),
            exception=error_exc,
        )
        report.extensions.update(self._route_extensions())
        report.extensions.update(self._npugraph_ex_extensions())
        report.notes += failure_notes(report)
        return report

    def _npugraph_ex_extensions(self) -> dict[str, Any]:
        """Report.extensions of the passes and kernel stages: fused_ops, kernels_per_step,
        and the static / super kernel summaries when those stages ran."""
        counter = self.kernel_counter
        extensions: dict[str, Any] = {
            "fused_ops": fused_ops(self.pass_manager),
            "kernels_per_step": counter.per_step() if counter is not None else {"graph": None, "eager": None},
        }
        build = self.static_kernels.build if self.static_kernels is not None else None
        if build is not None:
            extensions["static_kernel"] = {
                "build_dir": str(build.directory), "kernels": len(build.kernels), "sizes": list(build.sizes),
                "reused": build.reused,
            }
        if self.super_kernel is not None:
            extensions["super_kernel"] = {
                "graphs": self.super_kernel.graphs_optimized, "super_kernels": self.super_kernel.super_kernels,
            }
        return extensions

    def _notes(self, failure: Optional[BaseException]) -> list[str]:
        """What the planner knew when a capture failed (SEMANTICS §8: beyond vLLM Ascend)."""
        notes = []
        if isinstance(failure, CaptureError):
            parts = []
            if failure.graphs_captured is not None:
                parts.append(f"{failure.graphs_captured} graphs were captured before the failure")
            if failure.streams_in_use is not None and failure.stream_budget is not None:
                parts.append(f"streams in use {failure.streams_in_use}/{failure.stream_budget}")
            if parts:
                notes.append("; ".join(parts))
            plan = self.resolution.stream_plan
            if plan is not None and not plan.fits and plan.max_num_sizes == 0:
                notes.append(plan.warnings[-1] if plan.warnings else "not even one capture size fits the stream budget")
            elif plan is not None and not plan.fits:
                notes.append(
                    f"the stream plan fits at most {plan.max_num_sizes} of the {len(plan.requested_sizes)} capture sizes "
                    f"({plan.streams_per_size} streams per size, budget {plan.max_streams}); largest fitting "
                    f"selection: {plan.sizes} — see `ascendgraph explain` with the same flags"
                )
        return notes

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


def _capture_groups(
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
