"""The xlite runtime on an NPU: a thin adapter over the ``xlite`` package (``NpuDevice.xlite_runtime``).

Theory of operation. xlite (``pip install xlite``) runs a whole decoder forward on the NPU
from a description of the model (``xlite._C.ModelConfig``), the model's weight tensors
(``xlite._C.Model``), the paged KV caches and per-batch attention metadata
(``xlite._C.AttnMeta``: query lengths, cached lengths, block tables, positions), writing
the final hidden states into a tensor the caller owns. The adapter:

1. imports ``xlite._C`` lazily — importing this module never imports xlite; a missing or
   broken package is `DeviceUnavailable` with the reason and the fix (`xlite_unavailable_reason`);
2. describes the ascendgraph model to xlite (`_describe_model`) and hands it the weights
   of the model the engine built (`_hand_over_weights`); MHA models only (the Llama /
   Qwen dense and Qwen-MoE adapters of vLLM Ascend); MLA models are refused by name;
3. allocates the hidden-state buffer once, ``budget`` rows (docs/semantics.md §11);
4. per batch: refuses more tokens than the budget (`XliteBudgetExceeded`), translates the
   forward context's metadata and runs ``Model.forward`` on the current stream.

The xlite API is used as vLLM Ascend uses it (not verified against a wheel here: this
module cannot run without an NPU; tests on CPU cover the import guard only).
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch import nn

from ascendgraph.errors import ConfigError, DeviceUnavailable
from ascendgraph.forward_context import ForwardContext
from ascendgraph.xlite import XliteRuntimeSpec, check_within_budget

if TYPE_CHECKING:  # pragma: no cover
    from hw.device import NpuDevice

__all__ = ["XLITE_MODULE", "INSTALL_HINT", "TURN_OFF_HINT", "xlite_unavailable_reason", "load_xlite", "NpuXliteRuntime"]

XLITE_MODULE = "xlite._C"
TURN_OFF_HINT = "turn XliteGraph off (remove xlite_graph_config from --additional-config)"
INSTALL_HINT = f"install it on the NPU host with `pip install xlite`, or {TURN_OFF_HINT}"


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())}"


def _import_xlite() -> ModuleType:
    return importlib.import_module(XLITE_MODULE)


def xlite_unavailable_reason() -> Optional[str]:
    """None when ``xlite._C`` imports, else a one-line reason with the fix. Never raises."""
    try:
        _import_xlite()
    except ImportError as exc:
        return f"XliteGraph needs the xlite package, which cannot be imported ({_one_line(exc)}); {INSTALL_HINT}"
    except Exception as exc:  # a broken installation (missing CANN library, ABI mismatch, ...)
        return f"importing xlite failed ({_one_line(exc)}); reinstall it for this CANN / torch_npu, or {TURN_OFF_HINT}"
    return None


def load_xlite() -> ModuleType:
    """``xlite._C``, or DeviceUnavailable naming why and what to do."""
    reason = xlite_unavailable_reason()
    if reason is not None:
        raise DeviceUnavailable(reason)
    return _import_xlite()


def _rank() -> int:
    distributed = torch.distributed
    if distributed.is_available() and distributed.is_initialized():
        return int(distributed.get_rank())
    return 0  # `ascendgraph run` is one process


class NpuXliteRuntime:
    """The xlite runtime bound to one ascendgraph model on one NPU."""

    def __init__(self, device: "NpuDevice", model: nn.Module, spec: XliteRuntimeSpec,
                 *, xlite: Optional[ModuleType] = None) -> None:
        if spec.budget < 1:
            raise ConfigError(f"the xlite token budget must be >= 1, got {spec.budget}", key="xlite_graph_config")
        model_spec = getattr(model, "spec", None)
        if model_spec is None or getattr(model_spec, "attention", "mha") != "mha":
            name = getattr(model_spec, "name", type(model).__name__)
            raise ConfigError(
                f"the xlite adapter supports MHA decoder models only; {name} uses "
                f"{getattr(model_spec, 'attention', 'an unknown')} attention — use --device sim for it",
                key="xlite_graph_config",
            )
        self._xlite = xlite if xlite is not None else load_xlite()
        self.device = device
        self.model = model
        self.spec = spec
        rank = _rank()
        self._runtime = self._xlite.Runtime(device.index, 0, rank, spec.tensor_parallel_size, spec.data_parallel_size)
        self._model_config = _describe_model(self._xlite, model, spec)
        self._xmodel = self._xlite.Model()
        _hand_over_weights(self._xmodel, model)
        self._xmodel.init(self._model_config, rank)
        pool_mb = self._xmodel.get_tensor_pool_size()
        if self._runtime.init_tensor_pool(pool_mb) != 0:
            raise RuntimeError(
                f"xlite could not allocate its tensor pool of {pool_mb} MB on npu:{device.index}; free device "
                "memory (lower --max-num-seqs / --max-num-batched-tokens) or turn XliteGraph off"
            )
        self._rope = _rope_cache(model)
        self.hidden_states = torch.empty((spec.budget, spec.hidden_size), dtype=spec.dtype, device=device.torch_device)

    @property
    def budget(self) -> int:
        return self.spec.budget

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, context: ForwardContext) -> torch.Tensor:
        num_tokens = int(input_ids.shape[0])
        check_within_budget(num_tokens, self.spec.budget)
        metadata = context.attn_metadata
        if metadata is None:
            raise ValueError("the xlite runtime needs attention metadata in the forward context")
        ends = list(metadata.query_start_loc)
        query_lens = [end - start for start, end in zip([0] + ends[:-1], ends)]
        meta = self._xlite.AttnMeta()
        meta.lens = query_lens
        meta.cached_lens = [max(0, seq - q) for seq, q in zip(metadata.seq_lens, query_lens)]
        meta.block_tables_cpu = metadata.block_table[: metadata.num_reqs].tolist()
        meta.positions = positions
        kv_caches = [(cache.key, cache.value) for cache in context.kv_caches.values()]  # layer order
        view = self.hidden_states[:num_tokens]
        stream = getattr(self.device.current_stream(), "npu_stream", None)
        self._xmodel.forward(self._runtime, input_ids, meta, kv_caches, self._rope, view, stream)
        return view

    def profile_run(self) -> torch.Tensor:
        return self.hidden_states


def _describe_model(xlite: ModuleType, model: Any, spec: XliteRuntimeSpec) -> Any:
    """``xlite._C.ModelConfig`` for an ascendgraph model spec (dense or MoE, MHA)."""
    m = model.spec
    config = xlite.ModelConfig()
    config.vocab_size = m.vocab_size
    config.hidden_size = m.hidden_size
    config.n_layers = m.num_hidden_layers
    config.n_heads = m.num_attention_heads
    config.n_kv_heads = m.num_key_value_heads
    config.head_dim = m.head_dim
    config.rope_head_dim = m.head_dim
    config.norm_eps = m.rms_norm_eps
    config.rope_theta = m.rope_theta
    config.softmax_scale = m.head_dim ** -0.5
    config.intermediate_size = m.intermediate_size
    config.qk_norm = bool(m.qk_norm)
    config.attn_type = xlite.AttnMHA
    config.scoring_func = xlite.ScoringFuncSoftmax
    config.def_tp_size = spec.tensor_parallel_size
    config.def_dp_size = spec.data_parallel_size
    config.moe_ep_size = spec.tensor_parallel_size if spec.enable_expert_parallel else 1
    config.moe_tp_size = 1 if spec.enable_expert_parallel else spec.tensor_parallel_size
    config.max_m = spec.budget
    config.max_batch_size = spec.max_num_seqs
    config.max_seq_len = spec.max_model_len
    config.block_size = spec.block_size
    if m.is_moe:
        first = model.layers[0].mlp
        config.n_dense_layers = 0
        config.n_routed_experts = first.num_experts
        config.n_act_experts = first.top_k
        config.moe_intermediate_size = first.expert_size
        config.norm_topk_prob = True
    else:
        config.n_dense_layers = m.num_hidden_layers
    return config


def _hand_over_weights(xmodel: Any, model: Any) -> None:
    """Give xlite the weight tensors of the model (per-layer lists, in layer order)."""
    layers = list(model.layers)
    xmodel.embed = model.embed_tokens.weight
    xmodel.norm = model.norm.weight
    xmodel.head = model.lm_head.weight
    xmodel.attn_norm = [layer.input_layernorm.weight for layer in layers]
    xmodel.mlp_norm = [layer.post_attention_layernorm.weight for layer in layers]
    xmodel.mha_qkv = [layer.self_attn.qkv_proj.weight for layer in layers]
    xmodel.attn_out = [layer.self_attn.o_proj.weight for layer in layers]
    if layers and layers[0].self_attn.q_norm is not None:
        xmodel.mha_q_norm = [layer.self_attn.q_norm.weight for layer in layers]
        xmodel.mha_k_norm = [layer.self_attn.k_norm.weight for layer in layers]
    if layers and hasattr(layers[0].mlp, "w13"):  # DenseMoE
        xmodel.gate = [layer.mlp.router.weight for layer in layers]
        xmodel.re_up_gate = [layer.mlp.w13 for layer in layers]
        xmodel.re_down = [layer.mlp.w2 for layer in layers]
    else:
        xmodel.mlp_up_gate = [layer.mlp.gate_up_proj.weight for layer in layers]
        xmodel.mlp_down = [layer.mlp.down_proj.weight for layer in layers]


def _rope_cache(model: Any) -> torch.Tensor:
    """The rotary cos/sin cache of the first layer (every layer shares its geometry)."""
    return model.layers[0].self_attn.rotary.cos_sin_cache
