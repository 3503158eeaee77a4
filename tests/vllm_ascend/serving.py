"""vLLM Ascend's NPUModelRunner, whole and unmodified, serving on the simulated NPU.

What this module supplies, and nothing more (docs/vllm-ascend.md "The model runner"):

* the configuration: a tiny llama written as a ``config.json`` (2 layers, 8 query heads over
  2 KV heads of 128, bf16), dummy weights (``load_format="dummy"``: vLLM's own loader), and a
  `VllmConfig` with the graph mode, capture sizes and scheduler limits a test asks for;
* the worker's set-up, in NPUWorker's order (vllm_ascend/worker/worker.py@182b75ea, cited per
  step in `Worker`): vLLM Ascend's patches and custom ops, its config, the distributed groups
  (gloo for the one rank: the simulator has no HCCL), the device, vLLM's workspace manager,
  then ``NPUModelRunner(config, device)``, ``load_model``, ``initialize_kv_cache`` with the KV
  cache config vLLM's ``get_kv_cache_configs`` computes, and ``capture_model``;
* the scheduler outputs: vLLM's own ``Scheduler`` (``AsyncScheduler`` under
  ``async_scheduling``), fed `Arrival`s, driven as vLLM's ``EngineCore.step`` /
  ``step_with_batch_queue`` drive it (vllm/v1/engine/core.py@0.27.1:584-739);
* the process-wide state vLLM and vLLM Ascend keep in module globals, reset per test so a
  test starts on a clean simulated NPU (`reset_process_state`).

Everything else (the batch's padding, the attention metadata, the batch descriptor, the
FULL/PIECEWISE dispatch, the captures and replays, sampling) is the runner's own code.
"""

from __future__ import annotations

import copy
import json
import os
import tempfile
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import harness

# The runner's model: the attention shapes of tests/vllm_ascend/test_full_graph_attention.py
# (8 query heads over 2 KV heads of 128), llama's layers otherwise, as small as vLLM allows.
RUNNER_MODEL = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 2,
    "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
BLOCK_SIZE = 128
DISTRIBUTED_INIT = "tcp://127.0.0.1:{port}"


@dataclass(frozen=True)
class RunnerSpec:
    """What a runner test varies. ``mode`` is vLLM's ``cudagraph_mode``; the rest are vLLM's
    own options of the same names."""

    mode: str = "FULL_DECODE_ONLY"
    capture_sizes: tuple[int, ...] = (1, 2, 4)
    max_num_seqs: int = 4
    max_num_batched_tokens: int = 256
    max_model_len: int = 1024
    num_blocks: int = 24
    async_scheduling: bool = False
    enforce_eager: bool = False
    # vLLM's n-gram drafting (SpeculativeConfig method "ngram"): draft tokens proposed on the
    # host from the request's own tokens, no draft model; 0 = no speculative decoding.
    ngram_speculative_tokens: int = 0
    # vLLM Ascend's own options (additional_config). npugraph_ex (torch_npu's FX backend over
    # torchair, on by default: ascend_config.py:726) and the graph fusion passes, whose pattern
    # base imports npugraph_ex or else torchair (compilation/passes/base_pattern.py:9-12; configured by
    # graph_fusion_pass_manager.py:50-66), need torch_npu's torchair, which the facade does not
    # model: the compiled model goes through AscendCompiler without them (docs/vllm-ascend.md;
    # the tiny llama has nothing those passes fuse: no quantisation, no q/k norm).
    additional_config: tuple[tuple[str, Any], ...] = (("ascend_compilation_config", {
        "enable_npugraph_ex": False, "fuse_norm_quant": False, "fuse_qknorm_rope": False, "fuse_muls_add": False}),)

    def eager(self) -> "RunnerSpec":
        """The same serving set-up without graphs: the reference a graph runner must equal."""
        return RunnerSpec(mode=self.mode, capture_sizes=self.capture_sizes, max_num_seqs=self.max_num_seqs,
                          max_num_batched_tokens=self.max_num_batched_tokens, max_model_len=self.max_model_len,
                          num_blocks=self.num_blocks, async_scheduling=False, enforce_eager=True,
                          ngram_speculative_tokens=self.ngram_speculative_tokens,
                          additional_config=self.additional_config)


_MODEL_DIRS: dict[str, Path] = {}


def model_dir(model: Optional[dict[str, Any]] = None) -> Path:
    """A directory holding ``model`` (default: `RUNNER_MODEL`) as its ``config.json``."""
    text = json.dumps(RUNNER_MODEL if model is None else model, sort_keys=True)
    if text not in _MODEL_DIRS:
        directory = Path(tempfile.mkdtemp(prefix="vllm-ascend-runner-model-"))
        (directory / "config.json").write_text(text)
        _MODEL_DIRS[text] = directory
    return _MODEL_DIRS[text]


_MODEL_CONFIGS: dict[tuple[Path, bool], Any] = {}


def _model_config(enforce_eager: bool, directory: Path) -> Any:
    """vLLM's ModelConfig of the tiny model (inspected once per process, then copied: VllmConfig
    writes into the one it is given)."""
    key = (directory, enforce_eager)
    if key not in _MODEL_CONFIGS:
        from vllm.config import ModelConfig

        with harness.environment(VLLM_PLUGINS=harness.INSPECTION_PLUGINS, HF_HUB_OFFLINE="1"):
            _MODEL_CONFIGS[key] = ModelConfig(
                model=str(directory), skip_tokenizer_init=True, dtype="bfloat16", seed=0,
                max_model_len=1024, enforce_eager=enforce_eager)
    return copy.deepcopy(_MODEL_CONFIGS[key])


def runner_config(spec: RunnerSpec, *, model: Optional[dict[str, Any]] = None, parallel_config: Any = None,
                  additional_config: Optional[dict[str, Any]] = None) -> Any:
    """The VllmConfig a worker of ``spec`` receives (NPUPlatform.check_and_update_config runs in
    its constructor, as in vLLM's engine). ``model`` (a ``config.json``'s content, default
    `RUNNER_MODEL`), ``parallel_config`` (vLLM's ParallelConfig, default one rank) and
    ``additional_config`` (merged over the spec's) serve the DP ranks of runner_ranks.py."""
    from vllm.config import (CacheConfig, CompilationConfig, LoadConfig, ObservabilityConfig, ParallelConfig,
                             SchedulerConfig, SpeculativeConfig, VllmConfig)

    model_config = _model_config(spec.enforce_eager, model_dir(model))
    model_config.max_model_len = spec.max_model_len
    parallel_config = parallel_config or ParallelConfig()
    speculative = None
    if spec.ngram_speculative_tokens:
        # n-grams of 1 to 3 tokens (vLLM's default minimum is 5: config/speculative.py@0.27.1:750-752):
        # a sampled token seen earlier in the request proposes the tokens that followed it
        # (v1/spec_decode/ngram_proposer.py:64-120, batch_propose)
        speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=spec.ngram_speculative_tokens,
                                        prompt_lookup_min=1, prompt_lookup_max=3, target_model_config=model_config,
                                        target_parallel_config=parallel_config)
    compilation = CompilationConfig(cudagraph_mode=spec.mode, cudagraph_capture_sizes=list(spec.capture_sizes))
    scheduler = SchedulerConfig(max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
                                max_model_len=spec.max_model_len, is_encoder_decoder=False,
                                async_scheduling=spec.async_scheduling)
    with harness.environment(PYTORCH_NPU_ALLOC_CONF=os.environ.get("PYTORCH_NPU_ALLOC_CONF")):  # platform.py:1208-1227
        return VllmConfig(model_config=model_config,
                          cache_config=CacheConfig(block_size=BLOCK_SIZE, num_gpu_blocks_override=spec.num_blocks),
                          parallel_config=parallel_config, speculative_config=speculative,
                          scheduler_config=scheduler, load_config=LoadConfig(load_format="dummy"),
                          compilation_config=compilation,
                          observability_config=ObservabilityConfig(cudagraph_metrics=True),
                          additional_config={**dict(spec.additional_config), **(additional_config or {})})


# --------------------------------------------------------------------------- process state
_PROCESS: dict[str, Any] = {}


def set_up_patches() -> None:
    """What NPUWorker.__init__ does once per worker process before its groups (worker.py:117-124):
    vLLM Ascend's patches and custom ops."""
    if "patches" in _PROCESS:
        return
    # vLLM's compile cache and AOT compilation (on by default for torch >= 2.10, vllm/envs.py:
    # 344-353): with them torch 2.13's AOTAutograd cache expects an OutputCode from the forward
    # compiler, and vLLM Ascend's AscendCompiler hands back the FX graph module itself
    # (compilation/compiler_interface.py:47-67), so the first compiled forward fails ("expected
    # OutputCode"). vLLM Ascend pins torch 2.10 (requirements.txt:16), this environment has
    # 2.13; the runner tests compile without vLLM's cache (VLLM_DISABLE_COMPILE_CACHE=1).
    os.environ.setdefault("VLLM_DISABLE_COMPILE_CACHE", "1")
    from vllm_ascend import ops
    from vllm_ascend.utils import adapt_patch

    # vLLM Ascend's global patches, which its plugin entry applies in every vLLM process
    # (vllm_ascend/__init__.py:47-61, platform.py:261-265), among them the MoE factory that
    # builds vLLM Ascend's own fused-MoE layer (patch/platform/patch_fused_moe.py), then the
    # worker's (worker.py:117-119)
    adapt_patch(is_global_patch=True)
    adapt_patch()
    # vLLM Ascend's compiled custom ops (vllm_ascend_C, built by setup.py) are not built here:
    # enable_custom_op() answers False and its layers take the torch_npu kernels
    # (ops/layernorm.py:71-76). It caches that answer on its first call (utils.py:403-440);
    # asked first inside a Dynamo trace, its import of the missing module stops the trace, so
    # it is asked once now, as a build with the module would have cached True before any trace.
    from vllm_ascend.utils import enable_custom_op

    enable_custom_op()
    ops.register_dummy_fusion_op()  # worker.py:124
    _PROCESS["patches"] = True


def _set_up_process(config: Any) -> None:
    """What NPUWorker.__init__ and _init_worker_distributed_environment do once per worker
    process (worker.py:117-131, 1053-1066), with gloo for the one rank's groups: vLLM Ascend's
    GroupCoordinator builds HCCL options and hands the backend to torch.distributed.new_group
    (patch/worker/patch_distributed.py:133-172), and the simulator registers no HCCL backend."""
    from vllm.config import set_current_vllm_config

    if "distributed" in _PROCESS:
        return
    set_up_patches()
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm_ascend.batch_invariant import init_batch_invariance
    from vllm_ascend.distributed.parallel_state import init_ascend_model_parallel

    with set_current_vllm_config(config):
        init_batch_invariance()  # worker.py:1055
        import socket

        with socket.socket() as probe:  # a free port for the one-rank store
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        init_distributed_environment(1, 0, DISTRIBUTED_INIT.format(port=port), 0, "gloo")  # worker.py:1056-1058
        ensure_model_parallel_initialized(1, 1, 1, 1)  # worker.py:1059-1064
        init_ascend_model_parallel(config.parallel_config)  # worker.py:1065
    _PROCESS["distributed"] = "gloo"


def reset_process_state() -> None:
    """The module-level state vLLM and vLLM Ascend keep across workers in one process, put back
    to what a fresh worker process starts with (each test is a fresh worker on a fresh NPU):

    * vLLM Ascend's graph parameters and attention key buffer (harness.reset_vllm_ascend_state);
    * vLLM Ascend's rotary cos/sin buffers, set once per process on the runner's device
      (ops/rotary_embedding.py:53-61, set_cos_and_sin returns early once set: 64-71);
    * vLLM Ascend's MC2 mask and capacity (ascend_forward_context.py:176-215);
    * vLLM's workspace manager (vllm/v1/worker/workspace.py, locked by capture_model);
    * vLLM's "capturing enabled" flag (vllm/compilation/monitor.py);
    * vLLM's cache of rotary-embedding modules (rotary_embedding/__init__.py:30, 83-84: a model
      built later reuses the module, whose cos/sin buffer lives on the earlier NPU).
    """
    from vllm.compilation.monitor import set_cudagraph_capturing_enabled
    from vllm_ascend import ascend_forward_context
    from vllm_ascend.ops import rotary_embedding

    harness.reset_vllm_ascend_state()
    for name in ("_cos_mla", "_sin_mla", "_cos_cache", "_sin_cache", "_cos_sin_cache", "_cos", "_sin",
                 "_cos_slice", "_sin_slice"):
        setattr(rotary_embedding, name, None)
    ascend_forward_context._reserved_mc2_mask = None
    if hasattr(ascend_forward_context, "_mc2_tokens_capacity"):
        ascend_forward_context._mc2_tokens_capacity = None
    from vllm.model_executor.layers import rotary_embedding as vllm_rotary
    from vllm.v1.worker import workspace

    workspace._manager = None
    vllm_rotary._ROPE_DICT.clear()
    set_cudagraph_capturing_enabled(True)


def fresh_npu(**configure: Any) -> None:
    """A fresh simulated NPU behind the facade (`sim.facade.configure`; ``configure``: its
    options, ``faults=`` a fault plan...). torch's ``npu`` device serves whichever simulated NPU
    the facade has now (sim.facade attaches the npu device to its runtime), so nothing a previous
    test left on its NPU (a replay waiting for an event, queued work) reaches this one."""
    from sim import facade

    facade.configure(**configure)


def model_runner_class() -> Any:
    """vLLM Ascend's NPUModelRunner class, imported after the worker process's set-up (as NPUWorker
    imports it; imported first, vllm_ascend.device.device_op runs into a circular import)."""
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.utils import register_ascend_customop

    config = runner_config(RunnerSpec().eager())
    register_ascend_customop(config)
    init_ascend_config(config)
    _set_up_process(config)
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    return NPUModelRunner


# --------------------------------------------------------------------------- the worker
class Worker:
    """NPUModelRunner set up as NPUWorker sets it up, on the facade's simulated NPU ``npu:<index>``
    (the DP ranks of runner_ranks.py give their own ``config``, ``index`` and ``set_up``: the
    distributed set-up in place of `_set_up_process`; ``runner_class``: a planted subclass)."""

    def __init__(self, spec: RunnerSpec, *, config: Any = None, index: int = 0,
                 set_up: Optional[Callable[[Any], None]] = None, runner_class: Optional[type] = None) -> None:
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.utils.torch_utils import set_random_seed
        from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
        from vllm.v1.worker.workspace import init_workspace_manager
        from vllm_ascend.ascend_config import init_ascend_config
        from vllm_ascend.utils import register_ascend_customop

        self.spec = spec
        self.config = runner_config(spec) if config is None else config
        register_ascend_customop(self.config)  # worker.py:127
        init_ascend_config(self.config)  # worker.py:129
        (set_up or _set_up_process)(self.config)
        reset_process_state()
        self.device = torch.device(f"npu:{index}")
        with set_current_vllm_config(self.config):
            torch.npu.set_device(self.device)  # worker.py:406
            torch.npu.empty_cache()  # worker.py:416
            set_random_seed(self.config.model_config.seed)  # worker.py:455
            init_workspace_manager(self.device, 1)  # worker.py:466-467 (one micro-batch)
            from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

            from sim.facade import triton_kernels

            triton_kernels.install()  # the runner's Triton launches as simulator kernels
            self.runner = (runner_class or NPUModelRunner)(self.config, self.device)  # worker.py:476
            self.runner.load_model()  # worker.py:697-711
            specs = self.runner.get_kv_cache_spec()  # worker.py:946-958
            # vLLM's engine turns the workers' specs and memory into one KV cache config
            # (vllm/v1/engine/core.py:250-310); num_gpu_blocks_override fixes the block count.
            self.kv_cache_config = get_kv_cache_configs(self.config, [specs], [1 << 40])[0]
            self.runner.initialize_kv_cache(self.kv_cache_config)  # worker.py:972-987
            self.graph_bytes = 0
            if not self.config.model_config.enforce_eager:  # worker.py:722-771 compile_or_warm_up_model
                self.graph_bytes = self.runner.capture_model()
            set_random_seed(self.config.model_config.seed)  # worker.py:810

    def engine(self) -> "Engine":
        return Engine(self)


# --------------------------------------------------------------------------- the scheduled stream
@dataclass(frozen=True)
class Arrival:
    """A request that arrives before step ``step``: a prompt of ``prompt_len`` tokens (drawn
    from ``seed``, or ``prompt`` itself when given), greedy sampling, ``max_tokens`` generated
    tokens."""

    step: int
    request_id: str
    prompt_len: int
    max_tokens: int
    seed: int = 0
    prompt: Optional[tuple[int, ...]] = None

    def __post_init__(self) -> None:
        if self.prompt is not None and len(self.prompt) != self.prompt_len:
            raise ValueError(f"Arrival {self.request_id!r}: prompt has {len(self.prompt)} tokens, "
                             f"prompt_len says {self.prompt_len}")


@dataclass
class StepRecord:
    """What one step did, as the runner reported it (``ModelRunnerOutput``) or left it."""

    index: int
    scheduled: dict[str, int]
    finished: tuple[str, ...]
    sampled: dict[str, list[int]] = field(default_factory=dict)
    runtime_mode: Optional[str] = None
    padded_tokens: Optional[int] = None
    logits: Any = None
    # the draft tokens vLLM's scheduler put in the step, per request (speculative decoding)
    drafts: dict[str, list[int]] = field(default_factory=dict)


class Engine:
    """vLLM's scheduler in front of the worker's runner, stepped as vLLM's EngineCore steps it:
    ``step`` is EngineCore.step (core.py:584-614: schedule, execute_model, sample_tokens,
    update_from_output); under async scheduling ``step_with_batch_queue`` (core.py:625-739,
    batch queue of 2: a step is scheduled and issued before the previous step's output is
    awaited). The runner's async outputs are awaited as vLLM's UniProcExecutor awaits them
    (``AsyncModelRunnerOutput.get_output``, vllm/v1/executor/uniproc_executor.py:26-40)."""

    BATCH_QUEUE_SIZE = 2  # vLLM's UniProcExecutor.max_concurrent_batches under async scheduling

    def __init__(self, worker: Worker) -> None:
        from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config
        from vllm.v1.structured_output import StructuredOutputManager

        self.worker = worker
        self.runner = worker.runner
        config = worker.config
        scheduler_kv = generate_scheduler_kv_cache_config([worker.kv_cache_config])
        config.cache_config.num_gpu_blocks = scheduler_kv.num_blocks  # core.py:316
        # EngineCore.__init__ (core.py:144-168, 219-229): the scheduler class the config names,
        # its block sizes, and the block hasher of prefix caching.
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import (get_request_block_hasher, init_none_hash,
                                                 resolve_kv_cache_block_sizes)

        block_size, hash_block_size = resolve_kv_cache_block_sizes(scheduler_kv, config)
        scheduler_cls = config.scheduler_config.get_scheduler_cls()
        self.scheduler = scheduler_cls(vllm_config=config, kv_cache_config=scheduler_kv,
                                       structured_output_manager=StructuredOutputManager(config),
                                       block_size=block_size, hash_block_size=hash_block_size, log_stats=False)
        self.block_hasher = None
        if config.cache_config.enable_prefix_caching:
            hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
            init_none_hash(hash_fn)
            self.block_hasher = get_request_block_hasher(hash_block_size, hash_fn)
        self.records: list[StepRecord] = []
        self._queue: deque[tuple[Any, StepRecord]] = deque()

    def add(self, arrival: Arrival) -> None:
        import torch
        from vllm import SamplingParams
        from vllm.v1.request import Request

        generator = torch.Generator().manual_seed(arrival.seed)
        prompt = torch.randint(1, harness_vocab(), (arrival.prompt_len,), generator=generator).tolist()
        if arrival.prompt is not None:
            prompt = list(arrival.prompt)
        params = SamplingParams(temperature=0.0, max_tokens=arrival.max_tokens, ignore_eos=True)
        self.scheduler.add_request(Request(arrival.request_id, prompt, params, None, block_hasher=self.block_hasher))

    def _issue(self, index: int) -> tuple[Any, StepRecord]:
        """Schedule one step and issue it to the runner (execute_model, then sample_tokens when
        execute_model returns None): what EngineCore does before it awaits any output."""
        from vllm.config import set_current_vllm_config

        output = self.scheduler.schedule()
        record = StepRecord(index, dict(output.num_scheduled_tokens), tuple(sorted(output.finished_req_ids)),
                            drafts={r: list(ids) for r, ids in output.scheduled_spec_decode_tokens.items()})
        with set_current_vllm_config(self.worker.config):
            result = self.runner.execute_model(output)
            if result is None:
                state = self.runner.execute_model_state
                record.logits = state.logits.clone()  # a device copy, queued on the stream: no sync
                record.padded_tokens = state.batch_desc.num_tokens
                result = self.runner.sample_tokens(None)
        return (output, result), record

    def _complete(self, issued: tuple[Any, Any], record: StepRecord) -> None:
        output, result = issued
        model_output = result.get_output() if hasattr(result, "get_output") else result
        if model_output.cudagraph_stats is not None:
            record.runtime_mode = model_output.cudagraph_stats.runtime_mode
        for request_id, index in model_output.req_id_to_index.items():
            if index < len(model_output.sampled_token_ids):
                record.sampled[request_id] = list(model_output.sampled_token_ids[index])
        self.scheduler.update_from_output(output, model_output)
        self.records.append(record)

    def _post_step(self) -> None:
        """EngineCore.post_step (core.py:616-623): without async scheduling, the draft tokens the
        runner proposed in the step just run go to the scheduler for the next one."""
        if self.worker.config.speculative_config is None or not self.records[-1].scheduled:
            return
        draft_token_ids = self.runner.take_draft_token_ids()  # NPUWorker.take_draft_token_ids
        if draft_token_ids is not None:
            self.scheduler.update_draft_token_ids(draft_token_ids)

    def serve(self, arrivals: Iterable[Arrival], *, max_steps: int = 200) -> list[StepRecord]:
        """Serve ``arrivals`` to the end: every request finished and its finish flushed to the
        runner (the last step schedules nothing and carries the finished ids)."""
        pending = sorted(arrivals, key=lambda a: a.step)
        asynchronous = self.worker.config.scheduler_config.async_scheduling
        index = 0
        while index < max_steps:
            while pending and pending[0].step <= index:
                self.add(pending.pop(0))
            if not self.scheduler.has_requests() and not self._queue:
                if not pending:
                    break
                index += 1
                continue
            if not asynchronous:
                self._complete(*self._issue(index))
                self._post_step()
            else:
                # step_with_batch_queue: issue when there is work and room, await the oldest
                # step when the queue is full or nothing more can be scheduled.
                if self.scheduler.has_requests():
                    self._queue.appendleft(self._issue(index))
                    if len(self._queue) < self.BATCH_QUEUE_SIZE:
                        index += 1
                        continue
                self._complete(*self._queue.pop())
            index += 1
        while self._queue:
            self._complete(*self._queue.pop())
        return self.records


@dataclass
class Served:
    """A worker built on a fresh simulated NPU and served ``arrivals`` to the end: its step
    records, every kernel call vLLM Ascend issued meanwhile (`harness.KernelLog`, the captures
    included), and the graphs the device had captured when serving began and when it ended."""

    worker: Worker
    records: list[StepRecord]
    log: harness.KernelLog
    graphs_before_serving: int
    graphs_after_serving: int


def serve(spec: RunnerSpec, arrivals: Iterable[Arrival], **configure: Any) -> Served:
    """`Worker(spec)` on a fresh simulated NPU (``configure``: `fresh_npu`'s), then its engine
    serves ``arrivals``."""
    from sim import facade

    fresh_npu(**configure)
    log = harness.KernelLog()
    with log.recording():
        worker = Worker(spec)
        before = facade.device().stats().graphs_captured_total
        records = worker.engine().serve(arrivals)
        after = facade.device().stats().graphs_captured_total
    return Served(worker, records, log, before, after)


def harness_vocab() -> int:
    return int(RUNNER_MODEL["vocab_size"])


def tokens(records: list[StepRecord]) -> dict[str, list[int]]:
    """Every request's generated tokens, in order."""
    generated: dict[str, list[int]] = {}
    for record in records:
        for request_id, ids in record.sampled.items():
            generated.setdefault(request_id, []).extend(ids)
    return generated


def iter_logits(records: list[StepRecord]) -> Iterator[tuple[int, Any]]:
    for record in records:
        if record.logits is not None:
            yield record.index, record.logits
