"""What the tests of vLLM Ascend's batch decision on fabric ranks share
(tests/vllm_ascend/test_ranks_batch_decision.py, docs/ranks.md "Their own code per rank").

Each simulated rank gets its own ``VllmConfig`` (its ``data_parallel_rank``) built the way
vLLM Ascend's worker sees it, and an ``NPUModelRunner`` made with ``__new__`` that holds only
the attributes ``_determine_batch_execution_and_padding`` and ``_sync_metadata_across_dp``
read (model_runner_v1.py:669-710 and 2714-2800 @182b75ea): its configs, ``dp_size`` /
``dp_rank``, ``uniform_decode_query_len``, vLLM's own ``CudagraphDispatcher`` with its keys
initialised for the config's mode, and an input batch reduced to the two fields the method
reads (``num_computed_tokens_cpu``, ``lora_id_to_lora_request``). Building a whole runner per
rank would load a model and allocate its buffers; nothing of that reaches the decision.

vLLM Ascend keeps some state per process, set once by ``NPUModelRunner.__init__``
(model_runner_v1.py:469-473): the MC2 token capacity, the potential decode token count, the
"is this a MoE model" answer, the Ascend config. Simulated ranks are threads of one process,
so `process_state` sets these once for a run (every rank of a run has the same model and
graph settings, so one value per process is what each rank's process would hold) and puts
the previous values back afterwards.

After the decision, `moe_layer` issues what one MoE layer of the forward puts on the EP
communicator: the communication method is vLLM Ascend's own choice
(``select_moe_comm_method`` on the DP maximum, ascend_forward_context.py:95-99); the token
count it carries is the forward context's padded count (ascend_forward_context.py:159); MC2's
``global_bs`` is ``TokenDispatcherWithMC2``'s (token_dispatcher.py:133-149: the per-rank MC2
capacity times the EP size when ``should_skip_allreduce_across_dp_group`` holds, else 0).
Those three lines are re-stated here (the dispatcher needs a real HCCL communicator name); the
decision itself is vLLM Ascend's code, unmodified.
"""

from __future__ import annotations

import contextlib
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator, Optional, Sequence

import numpy as np
import torch

import harness

# A tiny Qwen3-MoE for a real ModelConfig, offline: 64 experts, so 16 EP ranks hold 4 each
# (A2's MC2 needs at most 24 experts per device and an EP group of at least 16:
# ascend_forward_context.py _select_a2_moe_comm_method).
TINY_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 128, "num_experts": 64, "num_experts_per_tok": 4,
    "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2, "vocab_size": 1000,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16", "tie_word_embeddings": False,
}
HIDDEN = TINY_MOE["hidden_size"]
A2_MC2_MIN_EP = 16  # ascend_forward_context.py _select_a2_moe_comm_method: ep_world_size >= 16
_MOE_DIR: list[Path] = []


def moe_model_config() -> Any:
    """vLLM's ModelConfig of the tiny MoE model (built once per process: harness.model_config)."""
    if not _MOE_DIR:
        directory = Path(tempfile.mkdtemp(prefix="vllm-ascend-tiny-moe-"))
        (directory / "config.json").write_text(json.dumps(TINY_MOE))
        _MOE_DIR.append(directory)
    return harness.model_config(_MOE_DIR[0])


def rank_configs(dp: int, mode: str, *, capture_sizes: Sequence[int] = (1, 2, 4, 8), max_num_seqs: int = 8,
                 max_num_batched_tokens: Optional[int] = None, kv_consumer: bool = True,
                 recompute_scheduler: bool = True, enable_prefill_mc2: bool = False) -> list[Any]:
    """One VllmConfig per DP rank (NPUPlatform.check_and_update_config runs in each): the tiny
    MoE model with expert parallelism, ``mode`` with ``capture_sizes``, a decode node of a PD
    deployment (``kv_consumer``: vLLM's ExampleConnector as the stand-in connector, only its
    role is read), vLLM Ascend's ``recompute_scheduler_enable`` and ``enable_prefill_mc2``
    (ascend_config.py:158@182b75ea: the MC2 token capacity becomes ``max_num_batched_tokens``
    instead of the largest capture size, ascend_forward_context.py:180-185)."""
    from vllm.config import CompilationConfig, KVTransferConfig, ParallelConfig, SchedulerConfig, VllmConfig

    model = moe_model_config()
    transfer = KVTransferConfig(kv_connector="ExampleConnector", kv_role="kv_consumer") if kv_consumer else None
    additional = {"scheduler_config": {"recompute_scheduler_enable": recompute_scheduler},
                  "enable_prefill_mc2": enable_prefill_mc2}
    batched = {} if max_num_batched_tokens is None else {"max_num_batched_tokens": max_num_batched_tokens}
    configs = []
    for rank in range(dp):
        configs.append(VllmConfig(
            model_config=model,
            parallel_config=ParallelConfig(data_parallel_size=dp, data_parallel_rank=rank, enable_expert_parallel=True),
            scheduler_config=SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=harness.MAX_MODEL_LEN,
                                             is_encoder_decoder=False, **batched),
            compilation_config=CompilationConfig(cudagraph_mode=mode, cudagraph_capture_sizes=list(capture_sizes)),
            kv_transfer_config=transfer, additional_config=additional))
    return configs


@contextlib.contextmanager
def process_state(config: Any) -> Iterator[None]:
    """vLLM Ascend's per-process state as ``NPUModelRunner.__init__`` sets it for ``config``
    (module docstring), and vLLM's current config; the previous values come back at the end."""
    from vllm.config import set_current_vllm_config
    from vllm_ascend import ascend_config, ascend_forward_context, utils
    from vllm_ascend.ascend_config import init_ascend_config

    saved = (utils._IS_MOE_MODEL, utils._IS_DRAFTER_MOE_MODEL, utils._potential_max_tokens,
             ascend_forward_context._mc2_tokens_capacity, ascend_config._ASCEND_CONFIG)
    utils._IS_MOE_MODEL = utils._IS_DRAFTER_MOE_MODEL = utils._potential_max_tokens = None
    ascend_forward_context._mc2_tokens_capacity = None
    try:
        init_ascend_config(config)
        uniform_decode_query_len = 1 + config.num_speculative_tokens
        ascend_forward_context.set_mc2_tokens_capacity(config, config.scheduler_config.max_num_seqs,
                                                       uniform_decode_query_len)
        utils.set_potential_max_tokens(config)
        with set_current_vllm_config(config):
            yield
    finally:
        (utils._IS_MOE_MODEL, utils._IS_DRAFTER_MOE_MODEL, utils._potential_max_tokens,
         ascend_forward_context._mc2_tokens_capacity, ascend_config._ASCEND_CONFIG) = saved


def batch_runner(config: Any) -> Any:
    """An NPUModelRunner holding what the batch decision reads (module docstring)."""
    from vllm.v1.cudagraph_dispatcher import CudagraphDispatcher
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    runner = object.__new__(NPUModelRunner)
    runner.vllm_config = config
    runner.model_config = config.model_config
    runner.parallel_config = config.parallel_config
    runner.compilation_config = config.compilation_config
    runner.speculative_config = config.speculative_config
    runner.dp_size = config.parallel_config.data_parallel_size
    runner.dp_rank = config.parallel_config.data_parallel_rank
    runner.uniform_decode_query_len = 1 + config.num_speculative_tokens
    runner.cudagraph_dispatcher = CudagraphDispatcher(config)
    runner.cudagraph_dispatcher.initialize_cudagraph_keys(config.compilation_config.cudagraph_mode,
                                                          runner.uniform_decode_query_len)
    max_reqs = config.scheduler_config.max_num_seqs
    runner.input_batch = SimpleNamespace(num_computed_tokens_cpu=np.ones(max_reqs, dtype=np.int32),
                                         lora_id_to_lora_request={})
    return runner


@dataclass(frozen=True)
class Batch:
    """One step's scheduled batch on one rank: each request's scheduled tokens (query lengths);
    ``force_uniform_decode`` as ``_dummy_run`` passes it (None: decided from the batch)."""

    query_lens: tuple[int, ...]
    force_uniform_decode: Optional[bool] = None

    def decide(self, runner: Any) -> tuple[Any, Any, Optional[torch.Tensor]]:
        """vLLM Ascend's ``_determine_batch_execution_and_padding`` for this batch: (mode,
        batch descriptor, num_tokens_across_dp)."""
        scheduled = np.array(self.query_lens, dtype=np.int32)
        mode, descriptor, _, across, _ = runner._determine_batch_execution_and_padding(
            num_tokens=int(scheduled.sum()), num_reqs=len(scheduled), num_scheduled_tokens_np=scheduled,
            max_num_scheduled_tokens=int(scheduled.max()), use_cascade_attn=False,
            force_uniform_decode=self.force_uniform_decode)
        return mode, descriptor, across


# The dummy batches of vLLM Ascend (model_runner_v1.py _dummy_run, 3139-3214 @182b75ea): a
# zero-token step on the external_launcher branch runs ``_dummy_run(1)`` (1874-1885: not
# uniform), an idle rank ``NPUWorker.execute_dummy_batch`` (worker.py:1048-1051: one uniform
# decode of ``uniform_decode_query_len`` tokens).
ZERO_TOKEN_STEP_DUMMY = Batch((1,), force_uniform_decode=False)
IDLE_RANK_DUMMY = Batch((1,), force_uniform_decode=True)


def graph_key(mode: Any, descriptor: Any) -> str:
    """The key of the graph a mode and descriptor replay (``FULL:4x4``; ascendgraph's spelling)."""
    return f"{mode.name}:{descriptor.num_tokens}" + (f"x{descriptor.num_reqs}" if descriptor.num_reqs else "")


def moe_layer(ranks: Any, config: Any, mode: Any, descriptor: Any, across: Optional[torch.Tensor]) -> str:
    """One MoE layer's EP collectives for this rank's decision (module docstring), replayed
    from the graph of the decision's key unless the mode is NONE; the method's name."""
    from vllm.config import CUDAGraphMode
    from vllm.distributed.parallel_state import get_ep_group, get_tp_group
    from vllm_ascend.ascend_forward_context import get_mc2_tokens_capacity, select_moe_comm_method
    from vllm_ascend.ops.fused_moe.moe_comm_method import MoECommType
    from vllm_ascend.utils import should_skip_allreduce_across_dp_group

    most = int(across.max()) if across is not None else descriptor.num_tokens
    method = select_moe_comm_method(most, config)
    tp = get_tp_group().world_size
    padded = math.ceil(most / tp) * tp
    ep = get_ep_group()
    hidden = torch.zeros(padded, HIDDEN, dtype=torch.bfloat16)
    replay = ranks.world.replaying(graph_key(mode, descriptor)) if mode != CUDAGraphMode.NONE \
        else contextlib.nullcontext()
    with replay:
        if method in (MoECommType.MC2, MoECommType.FUSED_MC2):
            global_bs = (get_mc2_tokens_capacity() // tp) * ep.world_size \
                if should_skip_allreduce_across_dp_group(config) else 0
            routed = ep.device_group.moe_distribute("dispatch", hidden, global_bs)
            ep.device_group.moe_distribute("combine", routed, global_bs)
        else:
            gathered = torch.zeros(padded * ep.world_size, HIDDEN, dtype=torch.bfloat16)
            torch.distributed.all_gather_single(gathered, hidden, group=ep.device_group)
            torch.distributed.reduce_scatter_single(hidden, gathered, group=ep.device_group)
    return method.name


# --------------------------------------------------------------------------- the drafter's loop
# tests/vllm_ascend/test_ranks_draft_steps.py: vLLM Ascend's speculative-decoding proposer on
# fabric ranks. The loop of draft forwards is ``AscendSpecDecodeBaseProposer._run_merged_draft``
# (spec_decode/llm_base_proposer.py:1044-1338 @182b75ea: draft step 0, the early exit for one
# token or parallel drafting at 1188-1193, then ``num_speculative_tokens - 1`` more forwards at
# 1221-1333), called by ``_propose`` (992-1026, ``is_prefill`` = the batch has a prefill) on a
# rank with requests and by ``dummy_run`` (695-704, no ``is_prefill``) on an idle one. Both are
# run unmodified on a proposer made with ``__new__`` holding what they read (`draft_proposer`).
DRAFT_VOCAB = 16


class MoeDraftLayer(torch.nn.Module):
    """The drafter's forward reduced to the one thing in it that meets other ranks: the EP
    collectives of its MoE layer (an MTP layer of a MoE model is a decoder layer with a MoE MLP),
    for the forward context vLLM Ascend's ``set_ascend_forward_context`` set: the method it
    selected and the DP token counts of the drafter's DP sync. The collectives are `moe_layer`'s
    (eager: vLLM Ascend's drafter here runs without a graph). ``forwards`` counts the calls."""

    def __init__(self, ranks: Any, config: Any) -> None:
        super().__init__()
        self.ranks, self.config, self.forwards = ranks, config, 0

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: Any = None,
                hidden_states: Optional[torch.Tensor] = None) -> torch.Tensor:
        from vllm.config import CUDAGraphMode
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
        across = context.dp_metadata.num_tokens_across_dp_cpu if context.dp_metadata is not None else None
        method = moe_layer(self.ranks, self.config, CUDAGraphMode.NONE,
                           SimpleNamespace(num_tokens=context.num_tokens, num_reqs=None), across)
        if method != context.moe_comm_type.name:  # moe_layer re-selects; it must agree with the context's
            raise AssertionError(f"moe_layer chose {method}, the forward context {context.moe_comm_type.name}")
        self.forwards += 1
        return torch.zeros(input_ids.shape[0], HIDDEN, dtype=torch.bfloat16)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.zeros(hidden_states.shape[0], DRAFT_VOCAB)


def draft_runner(config: Any, *, dcp_size: int) -> Any:
    """`batch_runner` plus what the proposer reads from its runner: ``dcp_size`` (the DCP
    group's world size, model_runner_v1.py:404-408; the DCP group itself is not built: its
    collectives are inside attention, which the reduced drafter has none of),
    ``prepare_inputs_event`` (vLLM's ``synchronize_input_prep``, v1/worker/gpu_model_runner.py
    in 0.27.1: None without async scheduling) and ``dynamic_eplb`` (off)."""
    runner = batch_runner(config)
    runner.dcp_size = dcp_size
    runner.prepare_inputs_event = None
    runner.dynamic_eplb = False
    return runner


def draft_proposer(runner: Any, model: MoeDraftLayer, *, num_speculative_tokens: int,
                   proposer_class: Optional[type] = None) -> Any:
    """vLLM Ascend's MTP proposer (``AscendEagleProposer``, which ``get_spec_decode_method``
    returns for ``mtp``: spec_decode/__init__.py:46-50) made with ``__new__``, holding what
    ``dummy_run`` and ``_run_merged_draft`` read for an eager MTP drafter that is not
    multimodal, without M-RoPE and without sequence parallelism; the values are the ones the
    constructors set (llm_base_proposer.py:121-247 @182b75ea; vLLM 0.27.1
    v1/spec_decode/llm_base_proposer.py:69-215). The real constructor loads nothing but
    allocates from the runner's buffers and a draft model config (``SpeculativeConfig`` for
    ``mtp`` needs a checkpoint with MTP layers), which these ranks do not have."""
    from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer

    config = runner.vllm_config
    tokens = config.scheduler_config.max_num_batched_tokens
    proposer = object.__new__(proposer_class or AscendEagleProposer)
    proposer.vllm_config, proposer.runner, proposer.device = config, runner, torch.device("cpu")
    proposer.method, proposer.num_speculative_tokens = "mtp", num_speculative_tokens
    proposer.parallel_drafting, proposer.extra_slots_per_request = False, 1
    proposer.pass_hidden_states_to_model = True  # EagleProposer.__init__ (vLLM v1/spec_decode/eagle.py:17-22)
    proposer.use_cuda_graph = False
    proposer.dcp_size = runner.dcp_size  # llm_base_proposer.py:147
    proposer.use_sequence_parallel_moe = proposer._share_mtp_indices = False
    proposer.supports_mm_inputs = proposer.uses_mrope = proposer.is_multimodal_model = False
    proposer.uses_xdrope_dim = proposer.draft_uses_xdrope_dim = 0
    proposer.input_ids = torch.zeros(tokens, dtype=torch.int32)
    proposer.positions = torch.zeros(tokens, dtype=torch.int32)
    proposer.hidden_states = torch.zeros(tokens, HIDDEN, dtype=torch.bfloat16)
    proposer.arange = torch.arange(tokens + 1, dtype=torch.int32)
    proposer.token_indices_to_sample = torch.zeros(tokens, dtype=torch.int32)
    proposer.model = model
    proposer._runnable = proposer._run_merged_draft  # llm_base_proposer.py:229
    return proposer


# The condition vLLM Ascend PR #12036 changed (commit 15592edd75 on main; the parent fe77ebb94d
# holds it at vllm_ascend/spec_decode/llm_base_proposer.py:1233-1237): right after the early
# exit, a batch with a prefill under context parallelism (PCP x DCP > 1) returned step 0's draft
# tokens repeated for every speculative token, without the remaining draft forwards. #12036
# narrowed it to PCP alone; vLLM Ascend #12592 (69f72c642e) removed PCP from this runner and the
# branch with it, so 182b75ea runs every draft forward. The planted variant re-inserts the
# pre-#12036 condition (PCP is gone at 182b75ea, so PCP x DCP > 1 reads DCP > 1).
PRE_12036_CONDITION = "self.dcp_size > 1 and is_prefill"
_EARLY_EXIT = "self.num_speculative_tokens == 1 or self.parallel_drafting"


def proposer_before_12036() -> type:
    """``AscendEagleProposer`` with ``_run_merged_draft`` as 182b75ea has it plus the
    pre-#12036 branch after the early exit (the comment above): the snapshot's source,
    parsed, one ``if`` added, compiled in the module's namespace."""
    import ast
    import inspect
    import textwrap

    from vllm_ascend.spec_decode import llm_base_proposer
    from vllm_ascend.spec_decode.eagle_proposer import AscendEagleProposer

    function = llm_base_proposer.AscendSpecDecodeBaseProposer._run_merged_draft
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    anchors = [i for i, node in enumerate(body)
               if isinstance(node, ast.If) and ast.unparse(node.test) == _EARLY_EXIT]
    if len(anchors) != 1:
        raise RuntimeError(f"_run_merged_draft in {inspect.getsourcefile(function)} has no single early exit "
                           f"`if {_EARLY_EXIT}:` to plant the pre-#12036 branch after; the test targets 182b75ea")
    planted = ast.parse(f"if {PRE_12036_CONDITION}:\n"
                        "    return draft_token_ids.unsqueeze(1).repeat(1, self.num_speculative_tokens)").body[0]
    body.insert(anchors[0] + 1, planted)
    tree.body[0].decorator_list = []  # type: ignore[attr-defined]
    code = compile(ast.fix_missing_locations(tree), f"<planted before #12036: {inspect.getsourcefile(function)}>",
                   "exec")
    namespace: dict[str, Any] = {}
    exec(code, vars(llm_base_proposer), namespace)
    return type("AscendEagleProposerBefore12036", (AscendEagleProposer,),
                {"_run_merged_draft": namespace["_run_merged_draft"]})


# vLLM's forward context is a module global (vllm/forward_context.py:196 in 0.27.1), one per
# process; rank threads share a process, and a forward context is entered on one rank while its
# peer is inside its own (a collective waits in between). The three functions that read or write
# the global (get_forward_context, is_forward_context_available, override_forward_context:
# forward_context.py:199-257) are given, for the block, code that keeps the value per thread;
# every caller of theirs (set_forward_context, vLLM Ascend's set_ascend_forward_context, the
# proposer, the model) runs unmodified. vLLM's micro-batching writes the global directly
# (v1/worker/ubatching.py:75) and is not used here.
def _rank_get_forward_context() -> Any:
    context = getattr(_RANK_FORWARD_CONTEXT, "value", None)  # noqa: F821  (vllm.forward_context's global)
    assert context is not None, "no forward context on this rank thread: enter set_forward_context first"
    return context


def _rank_is_forward_context_available() -> bool:
    return getattr(_RANK_FORWARD_CONTEXT, "value", None) is not None  # noqa: F821


def _rank_override_forward_context(forward_context: Any) -> Iterator[None]:
    previous = getattr(_RANK_FORWARD_CONTEXT, "value", None)  # noqa: F821
    _RANK_FORWARD_CONTEXT.value = forward_context  # noqa: F821
    try:
        yield
    finally:
        _RANK_FORWARD_CONTEXT.value = previous  # noqa: F821


@contextlib.contextmanager
def rank_forward_contexts() -> Iterator[None]:
    """vLLM's forward context per rank thread for the block (the comment above)."""
    import threading

    from vllm import forward_context as module

    swaps = [(module.get_forward_context, _rank_get_forward_context),
             (module.is_forward_context_available, _rank_is_forward_context_available),
             (module.override_forward_context.__wrapped__, _rank_override_forward_context)]  # type: ignore[attr-defined]
    saved = [function.__code__ for function, _ in swaps]
    module.__dict__["_RANK_FORWARD_CONTEXT"] = threading.local()
    try:
        for function, per_thread in swaps:
            function.__code__ = per_thread.__code__
        yield
    finally:
        for (function, _), code in zip(swaps, saved):
            function.__code__ = code
        del module.__dict__["_RANK_FORWARD_CONTEXT"]
