"""Whole ``NPUModelRunner``s as DP ranks on the fabric (issue 36 item 3; docs/ranks.md
"Whole model runners as DP ranks").

Each DP rank is a thread of `sim.vllm_ranks.VllmRanks` on its own simulated NPU
(``sim.facade.configure_devices``: rank r calls ``torch.npu.set_device(r)`` and works on
``npu:r``), with its own ``VllmConfig`` (its ``data_parallel_rank``), its own vLLM and vLLM
Ascend groups on the fabric's torch.distributed backend, its own `serving.Worker` (vLLM
Ascend's ``NPUModelRunner``, whole: constructor, ``load_model``, ``initialize_kv_cache``,
``capture_model``) and its own vLLM ``Scheduler``, stepped by `dp_engine_loop` as vLLM's
``DPEngineCoreProc.run_busy_loop`` steps one engine core.

The models (`RankModel`). DP alone puts no collective inside a dense model's forward, so
nothing would meet during a replay. Two forwards meet across DP ranks, both vLLM's
``Qwen2MoeForCausalLM`` with one layer (``num_experts`` > 0 makes it a MoE model to vLLM,
``ModelConfig.is_moe``):

* `MOE_EP` (the default: a MoE deployment): the layer is vLLM Ascend's own fused MoE
  (``AscendMoERunner``, built by the MoE factory its global patches install:
  patch/platform/patch_fused_moe.py) with expert parallelism over the two DP ranks
  (``enable_expert_parallel``: each rank holds 2 of the 4 experts). On A2 with an EP group of
  fewer than 16 ranks vLLM Ascend picks the all-gather method
  (ascend_forward_context.py:223-239): the layer pads its tokens and router logits to the DP
  group's largest count and all-gathers them over the ``dp`` group
  (ops/fused_moe/prepare_finalize.py:439-449), routes every token with the gating top-k,
  computes the tokens its own experts were chosen for (the facade's MoE kernels,
  `sim.facade.moe_kernels`) and reduce-scatters the weighted sums back (prepare_finalize.py:
  536-540), so a token's output on one rank holds what the other rank's experts computed for
  it, and every forward of every rank, an idle rank's dummy batch included, must take part;
* `DENSE_MLP_TP`: the layer is dense (``mlp_only_layers``) with vLLM Ascend's fine-grained
  MLP tensor parallelism across the two DP ranks
  (``finegrained_tp_config.mlp_tensor_parallel_size = 2``, allowed for MoE models only,
  ascend_config.py:694-711@182b75ea): its ``gate_up_proj`` all-gathers its input over the
  ``mlptp`` group as it is (no padding to the DP maximum) and its ``down_proj``
  reduce-scatters (ops/linear_op.py:152-191), through vLLM's ``torch.ops.vllm.all_gather`` /
  ``reduce_scatter`` and vLLM Ascend's ``NPUCommunicator``
  (device_communicators/npu_communicator.py).

Either way the collectives are captured into each FULL graph and meet at each replay as
``graph:<key>``.

What is restated here (the rest is their code, unmodified):

* the groups: vLLM's ``GroupCoordinator``s built without ``__init__`` (`sim.vllm_ranks`) for
  vLLM's ``world``, ``dp``, ``pp``, ``tp``, ``ep``, ``dcp``, ``pcp`` and vLLM Ascend's ``mc2``
  and ``mlptp`` with the members vLLM's ``initialize_model_parallel`` and vLLM Ascend's
  ``init_ascend_model_parallel`` give them (distributed/parallel_state.py:21-135@182b75ea);
  each group of more than one rank has vLLM Ascend's ``NPUCommunicator`` and is registered for
  vLLM's collective custom ops, as ``GroupCoordinator.__init__`` does;
* the engine core's loop (`dp_engine_loop`), from vLLM 0.27.1 ``v1/engine/core.py:2102-2175``:
  ``step`` when the scheduler has requests, ``execute_dummy_batch`` (NPUWorker's,
  worker.py:1048-1051: ``_dummy_run(uniform_decode_query_len, uniform_decode=True)``) when no
  tokens ran and some rank still has work, and every 32nd step ``ParallelConfig.sync_dp_state``
  (vLLM's own) on the engine core's DP group;
* the per-process state each rank keeps for itself (`RANK_GLOBALS`).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Optional, Sequence

import serving

DP = 2
# vLLM's Qwen2-MoE with every layer dense (module docstring): the attention shapes of the runner
# tests (8 query heads over 2 KV heads of 128), one layer (each rank compiles and captures its
# own model: a second layer doubles that and shows nothing more), bf16.
DENSE_QWEN2_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 1024,
    "intermediate_size": 512, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 0, "num_experts": 4,
    "num_experts_per_tok": 2, "decoder_sparse_step": 1, "mlp_only_layers": [0], "norm_topk_prob": False,
    "num_attention_heads": 8, "num_key_value_heads": 2, "num_hidden_layers": 1, "hidden_act": "silu",
    "vocab_size": 512, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
    "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
# The same model with its layer a MoE layer: 4 experts of intermediate size 128, top 2, the
# softmax weights not renormalised (``norm_topk_prob`` False: the gating top-k's renorm 0).
QWEN2_MOE = {**DENSE_QWEN2_MOE, "mlp_only_layers": []}
MLP_TP = {"finegrained_tp_config": {"mlp_tensor_parallel_size": DP}}


@dataclass(frozen=True)
class RankModel:
    """What the DP ranks serve (module docstring): the model's config.json, whether experts are
    spread over the ranks (``enable_expert_parallel``) and vLLM Ascend's additional config."""

    name: str
    config: dict[str, Any]
    expert_parallel: bool = False
    additional_config: dict[str, Any] = field(default_factory=dict)


DENSE_MLP_TP = RankModel("dense Qwen2-MoE, MLP tensor parallel", DENSE_QWEN2_MOE, additional_config=MLP_TP)
MOE_EP = RankModel("Qwen2-MoE, expert parallel", QWEN2_MOE, expert_parallel=True)
UNFINISHED_INTERVAL = 32  # DPEngineCoreProc._has_global_unfinished_reqs (core.py:2170-2175)


_ORIGINAL_CODE: dict[str, Any] = {}  # the model's forward code as imported (before any compiled call)


def _attention_masks() -> Any:
    """The dictionary behind vLLM Ascend's AttentionMaskBuilder singleton (its closure)."""
    from vllm_ascend.attention import attention_mask

    for cell in attention_mask.AttentionMaskBuilder.__closure__ or ():
        if isinstance(cell.cell_contents, dict):
            return cell
    raise RuntimeError("vLLM Ascend's AttentionMaskBuilder no longer keeps its instance in a closure")


def _rank_globals() -> Any:
    """What vLLM 0.27.1 and vLLM Ascend 182b75ea keep per process that a rank
    must not share (module, attribute, and what a fresh process holds)."""
    from sim.vllm_ranks import PerRankGlobals, Slot, module_slot

    def platform_slot() -> Slot:  # vLLM's one graph pool per process (platforms/interface.py:174)
        from vllm.platforms import current_platform

        cls = type(current_platform)
        return Slot("Platform._global_graph_pool", lambda: cls._global_graph_pool,
                    lambda value: setattr(cls, "_global_graph_pool", value), lambda: None)

    def forward_code_slot() -> Slot:
        # vLLM runs a compiled model by swapping the class's forward code for the instance's
        # compiled bytecode for the call (compilation/wrapper.py:273-290
        # _dispatch_to_compiled_code); a rank that waits in a collective inside the forward
        # leaves its bytecode in the class, so each rank has its own class-level code
        from vllm.model_executor.models.qwen2_moe import Qwen2MoeModel

        original = _ORIGINAL_CODE.setdefault("Qwen2MoeModel.forward", Qwen2MoeModel.forward.__code__)
        return Slot("Qwen2MoeModel.forward.__code__", lambda: Qwen2MoeModel.forward.__code__,
                    lambda value: setattr(Qwen2MoeModel.forward, "__code__", value), lambda: original)

    def masks_slot() -> Slot:  # the mask builder keeps its masks on the NPU it was built on
        return Slot("AttentionMaskBuilder instances", lambda: _attention_masks().cell_contents,
                    lambda value: setattr(_attention_masks(), "cell_contents", value), dict)

    slots = [
        # vLLM: the forward context, the current config, the collective ops' group registry and
        # the groups vLLM's proxies (sim.vllm_ranks) do not cover, capturing enabled, the
        # workspace manager (on the rank's NPU), the rotary-embedding module cache (its cos/sin
        # buffers live on the NPU that built them)
        module_slot("vllm.forward_context", "_forward_context"),
        module_slot("vllm.config.vllm", "_current_vllm_config"),
        module_slot("vllm.config.vllm", "_current_prefix"),
        module_slot("vllm.distributed.parallel_state", "_groups", dict),
        module_slot("vllm.distributed.parallel_state", "_DCP"),
        module_slot("vllm.distributed.parallel_state", "_PCP"),
        module_slot("vllm.compilation.monitor", "cudagraph_capturing_enabled", lambda: True),
        module_slot("vllm.v1.worker.workspace", "_manager"),
        module_slot("vllm.model_executor.layers.rotary_embedding", "_ROPE_DICT", dict),
        platform_slot(),
        forward_code_slot(),
        # vLLM Ascend (the globals its functions assign with ``global``, per module)
        module_slot("vllm_ascend.ascend_config", "_ASCEND_CONFIG"),
        module_slot("vllm_ascend.ascend_forward_context", "_reserved_mc2_mask"),
        module_slot("vllm_ascend.ascend_forward_context", "_mc2_tokens_capacity"),
        module_slot("vllm_ascend.attention.attention_v1", "_ATTN_KEYS_BUFFER"),
        module_slot("vllm_ascend.compilation.acl_graph", "_graph_params"),
        module_slot("vllm_ascend.compilation.acl_graph", "_draft_graph_params"),
        module_slot("vllm_ascend.compilation.acl_graph", "_draft_graph_prefill_params"),
        module_slot("vllm_ascend.compilation.acl_graph", "_acl_graph_wrappers", weakref.WeakSet),
        # the MoE communication methods, built by each rank's MoE layer for its own groups
        # (ops/fused_moe/moe_comm_method.py:48-62); their prepare/finalize keep the forward's token
        # count between the all-gather and the reduce-scatter (prepare_finalize.py:442, 539)
        module_slot("vllm_ascend.ops.fused_moe.moe_comm_method", "_MoECommMethods", dict),
        masks_slot(),
    ]
    slots += [module_slot("vllm_ascend.distributed.parallel_state", name)
              for name in ("_MC2", "_MLP_TP", "_OTP", "_LMTP", "_EMBED_TP", "_P_TP", "_DYNAMIC_EPLB")]
    slots += [module_slot("vllm_ascend.ops.rotary_embedding", name)
              for name in ("_cos_mla", "_sin_mla", "_cos_cache", "_sin_cache", "_cos_sin_cache", "_cos", "_sin",
                           "_cos_slice", "_sin_slice")]
    slots += [module_slot("vllm_ascend.utils", name)  # the streams are the NPU's
              for name in ("_CURRENT_STREAM", "_GLOBAL_STREAM", "_SHARED_EXPERTS_CALCULATION_STREAM",
                           "_CP_CHUNKEDPREFILL_COMM_STREAM", "_ATNN_CALCULATION_STREAM", "_IS_MOE_MODEL",
                           "_IS_DRAFTER_MOE_MODEL", "_potential_max_tokens")]
    return PerRankGlobals(slots)


# --------------------------------------------------------------------------- a rank's set-up
def _set_up_groups(ranks: Any, rank: int) -> Callable[[Any], None]:
    """The distributed set-up of rank ``rank``'s worker (module docstring), in place of
    NPUWorker._init_worker_distributed_environment (worker.py:1053-1066)."""

    def set_up(config: Any) -> None:
        import torch
        from vllm.config import set_current_vllm_config
        from vllm.distributed import parallel_state
        from vllm.platforms import current_platform
        from vllm_ascend.batch_invariant import init_batch_invariance
        from vllm_ascend.distributed import parallel_state as ascend_state
        from vllm_ascend.distributed.device_communicators.npu_communicator import NPUCommunicator

        serving.set_up_patches()
        device = torch.device(f"npu:{rank}")
        world = list(range(DP))
        singles = [[r] for r in world]
        with set_current_vllm_config(config):
            init_batch_invariance()  # worker.py:1055
            coordinators = [ranks.group(kind) for kind in ("world", "dp", "pp", "tp", "ep")]
            parallel_state._DCP = ranks.coordinator("dcp", singles, rank, device)
            parallel_state._PCP = ranks.coordinator("pcp", singles, rank, device)
            # vLLM Ascend's groups (distributed/parallel_state.py:21-135): MC2 spans DP x PCP x TP, the MLP
            # TP group chunks the DP ranks of each TP rank by mlp_tensor_parallel_size (95-135)
            ascend_state._MC2 = ranks.coordinator("mc2", [world], rank, device)
            ascend_state._MLP_TP = ranks.coordinator("mlptp", [world], rank, device)
            coordinators += [parallel_state._DCP, parallel_state._PCP, ascend_state._MC2, ascend_state._MLP_TP]
            for coordinator in coordinators:
                coordinator.device = device
                coordinator.use_custom_op_call = current_platform.use_custom_op_collectives()
                if coordinator.world_size > 1:  # GroupCoordinator.__init__ (vLLM parallel_state.py:500-527)
                    coordinator.use_device_communicator = True
                    coordinator.device_communicator = NPUCommunicator(
                        cpu_group=coordinator.cpu_group, device=device, device_group=coordinator.device_group,
                        unique_name=coordinator.unique_name)
                parallel_state._register_group(coordinator)

    return set_up


def rank_config(rank: int, spec: serving.RunnerSpec, model: RankModel = MOE_EP) -> Any:
    """Rank ``rank``'s VllmConfig for ``model`` (module docstring)."""
    from vllm.config import ParallelConfig

    parallel = ParallelConfig(data_parallel_size=DP, data_parallel_rank=rank, enable_expert_parallel=model.expert_parallel)
    return serving.runner_config(spec, model=model.config, parallel_config=parallel,
                                 additional_config=dict(model.additional_config))


# --------------------------------------------------------------------------- the engine core's loop
@dataclass
class RankLog:
    """What one DP rank's engine core did, step by step."""

    rank: int
    steps: list[str] = field(default_factory=list)  # "step:<mode>:<padded tokens>" or "dummy" or "skip"
    syncs: int = 0  # sync_dp_state calls
    tokens: dict[str, list[int]] = field(default_factory=dict)
    records: list[serving.StepRecord] = field(default_factory=list)  # the served steps, their logits on the host
    graphs_captured: int = 0
    graphs: dict[str, str] = field(default_factory=dict)  # the simulator's graph name -> what vLLM captured in it


def captured_graphs(runner: Any) -> dict[str, str]:
    """The FULL graphs of the runner's ``ACLGraphWrapper`` (acl_graph.py:114-151: one entry per
    batch descriptor), by the name the simulator gives each (the ``graph:<name>`` of a replayed
    collective): ``{"graph#1": "FULL:4"}`` (the descriptor's token count)."""
    from vllm_ascend.compilation.acl_graph import ACLGraphWrapper

    wrapper = runner.model
    if not isinstance(wrapper, ACLGraphWrapper):
        return {}
    return {str(entry.aclgraph._sim.name): f"{wrapper.runtime_mode.name}:{descriptor.num_tokens}"
            for descriptor, entry in wrapper.concrete_aclgraph_entries.items() if entry.aclgraph is not None}


def dp_engine_loop(engine: serving.Engine, arrivals: Iterable[serving.Arrival], log: RankLog, *,
                   dummy_when_idle: bool = True, max_steps: int = 200) -> None:
    """One DP engine core (vLLM 0.27.1 ``DPEngineCoreProc.run_busy_loop``, core.py:2102-2175):
    each iteration adds the arrivals due, runs ``step`` (``EngineCore.step``: schedule,
    execute_model, sample_tokens, update_from_output) when the scheduler has requests; when no
    tokens ran and this rank or a peer still has work, ``execute_dummy_batch``; every 32nd
    iteration ``ParallelConfig.sync_dp_state`` on the engine core's DP group. The loop ends when
    the engines stop running and no arrival is left. ``dummy_when_idle=False`` is vLLM issue
    #43547's rank: it returns without the dummy batch, so without the step's DP sync."""
    from vllm.config import ParallelConfig

    pending = sorted(arrivals, key=lambda a: a.step)
    runner = engine.runner
    dp_engine_group = engine.ranks.engine_dp_group()
    running, counter = True, 0
    for index in range(max_steps):
        while pending and pending[0].step <= index:
            engine.add(pending.pop(0))
        executed = False
        if engine.scheduler.has_requests():
            issued, record = engine._issue(index)
            engine._complete(issued, record)
            executed = sum(record.scheduled.values()) > 0
            if executed:
                log.steps.append(f"step:{record.runtime_mode}:{record.padded_tokens}")
        local_unfinished = engine.scheduler.has_unfinished_requests()
        if not executed:
            if not local_unfinished and not running and not pending:
                break
            if dummy_when_idle:
                with engine.current_config():
                    num_tokens = getattr(runner, "uniform_decode_query_len", 1)  # worker.py:1048-1051
                    runner._dummy_run(num_tokens, uniform_decode=True)
                log.steps.append("dummy")
            else:
                log.steps.append("skip")
        counter += 1
        if counter % UNFINISHED_INTERVAL == 0:
            # the test's arrivals still to come count as work (vLLM's front-end would have queued them)
            running, _ = ParallelConfig.sync_dp_state(dp_engine_group, local_unfinished or bool(pending), False)
            log.syncs += 1
        else:
            running = True  # _has_global_unfinished_reqs between its all-reduces (core.py:2170-2174)
        if not running and not pending and not local_unfinished:
            break
    log.tokens = serving.tokens(engine.records)
    # on the host: the rank's simulated NPU is gone once the run returns
    log.records = [replace(record, logits=None if record.logits is None else record.logits.cpu())
                   for record in engine.records]


class RankEngine(serving.Engine):
    """`serving.Engine` on a DP rank: the same scheduler and steps, and the rank's groups."""

    def __init__(self, worker: serving.Worker, ranks: Any) -> None:
        super().__init__(worker)
        self.ranks = ranks

    def current_config(self) -> Any:
        from vllm.config import set_current_vllm_config

        return set_current_vllm_config(self.worker.config)


# --------------------------------------------------------------------------- a run
@dataclass(frozen=True)
class RankPlan:
    """What one DP rank serves and how its engine core behaves."""

    arrivals: tuple[serving.Arrival, ...] = ()
    dummy_when_idle: bool = True
    runner_class: Optional[Callable[[], Any]] = None  # a planted NPUModelRunner subclass (None: vLLM Ascend's)


@dataclass
class RankRun:
    logs: dict[int, RankLog]
    stats: Any


def run(spec: serving.RunnerSpec, plans: Sequence[RankPlan], *, devices: Optional[Sequence[dict[str, Any]]] = None,
        logs: Optional[dict[int, RankLog]] = None, model: RankModel = MOE_EP) -> RankRun:
    """Every DP rank of ``plans`` as a thread on its own simulated NPU (``devices``: each NPU's
    `sim.facade.configure_devices` options), each building its worker for ``model`` and serving
    its plan in lock-step; the fabric's error (mismatch, deadlock, timeout) is raised as it is
    (``logs``, when given, holds each rank's log however the run ends)."""
    import torch

    from ascendgraph.parallel.layout import ParallelLayout
    from sim import facade
    from sim.vllm_ranks import VllmRanks

    assert len(plans) == DP
    import vllm_ascend.ops  # noqa: F401  (model_runner_v1's imports need vllm_ascend.ops loaded first)

    serving.set_up_patches()
    facade.configure_devices(list(devices or [{} for _ in plans]))
    ranks = VllmRanks(ParallelLayout(dp=DP), per_rank_globals=_rank_globals())
    logs = {} if logs is None else logs
    logs.update({rank: RankLog(rank) for rank in range(DP)})

    def body(rank: int) -> None:
        torch.npu.set_device(rank)  # worker.py:406
        plan = plans[rank]
        worker = _worker(spec, rank, ranks, plan, model)
        logs[rank].graphs_captured = facade.device().stats().graphs_captured_total
        logs[rank].graphs = captured_graphs(worker.runner)
        dp_engine_loop(RankEngine(worker, ranks), plan.arrivals, logs[rank], dummy_when_idle=plan.dummy_when_idle)

    try:
        stats = ranks.run(body)
    finally:
        facade.configure()
    return RankRun(logs, stats)


def _worker(spec: serving.RunnerSpec, rank: int, ranks: Any, plan: RankPlan, model: RankModel) -> serving.Worker:
    runner_class = plan.runner_class() if plan.runner_class is not None else None
    return serving.Worker(spec, config=rank_config(rank, spec, model), index=rank, set_up=_set_up_groups(ranks, rank),
                          runner_class=runner_class)
