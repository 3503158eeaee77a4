"""Small decoder models built from a `ModelSpec`, with random weights from a seed.

`build_model(spec, backend=..., seed=...)` returns a `DecoderModel`:
* ``Qwen3ForCausalLM``-like (``tiny``, ``qwen3-0.6b``): GQA attention with per-head q/k
  RMSNorm before rope; ``LlamaForCausalLM``-like (``tiny-llama``): the same without q/k norm;
* ``DeepseekV3ForCausalLM``-like (``tiny-mla``): multi-head latent attention — the KV
  cache holds one compressed latent (+ the shared rope key) per token, queries are
  absorbed into the latent space, attention runs as MQA over the latent;
* MoE specs (``tiny-moe``): the MLP is a dense-computed top-k expert block.

`DecoderModel.forward(input_ids, positions)` returns the final hidden states
[num_tokens, hidden]; `compute_logits` applies the LM head (outside any graph, as vLLM
does). KV caches are not part of the module: `make_kv_caches` allocates one set per engine
path, and the forward context says which set a forward uses.
"""

from __future__ import annotations

import math
import mmap
import os
from dataclasses import dataclass
from typing import Any, Optional, Union, cast

import torch
from torch import Tensor, nn

from ascendgraph.errors import ConfigError
from ascendgraph.forward_context import KVCache
from ascendgraph.models.attention import AttentionImpl, attention_impl_for
from ascendgraph.models.layers import (
    QUANTIZATION_METHODS,
    Attention,
    DenseMoE,
    GatedMLP,
    RMSNorm,
    RotaryEmbedding,
    W8A8Linear,
    make_linear,
    tp_all_reduce,
)
from ascendgraph.models.presets import ModelSpec

__all__ = [
    "ModelOptions",
    "DecoderModel",
    "build_model",
    "DTYPES",
    "parse_dtype",
    "moe_expert_size",
    "available_host_memory",
    "estimate_build_bytes",
]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def parse_dtype(name: str | torch.dtype) -> torch.dtype:
    if isinstance(name, torch.dtype):
        if name in DTYPES.values():
            return name
        name = str(name).replace("torch.", "")
    key = str(name).strip().lower()
    if key not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}", key="dtype")
    return DTYPES[key]


def moe_expert_size(spec: ModelSpec) -> int:
    """Width of one expert: a quarter of intermediate_size (tiny-moe stays CPU-cheap)."""
    return max(64, spec.intermediate_size // 4)


@dataclass(frozen=True)
class ModelOptions:
    """How to build a model beyond its spec."""

    attention_backend: str = "ascend"
    dtype: torch.dtype = torch.float32
    seed: int = 0
    quantization: Optional[str] = None  # None, "w8a8" or "w8a8_dynamic" (layers.QUANTIZATION_METHODS)
    # tp > 1: the model issues the tensor-parallel all-reduces (identity on this one rank) after
    # the embedding, each attention and each MLP, as vLLM's parallel layers do.
    tensor_parallel_size: int = 1


# --------------------------------------------------------------------------- attention blocks


def _layer_name(index: int) -> str:
    return f"model.layers.{index}.self_attn.attn"


class MHABlock(nn.Module):
    """Grouped-query attention (optionally with q/k RMSNorm before rope)."""

    def __init__(self, spec: ModelSpec, index: int, impl: AttentionImpl, quantization: Optional[str]) -> None:
        super().__init__()
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.qkv_proj = make_linear(spec.hidden_size, self.q_size + 2 * self.kv_size, quantization=quantization)
        self.o_proj = make_linear(self.q_size, spec.hidden_size, quantization=quantization)
        self.q_norm = RMSNorm(self.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.rotary = RotaryEmbedding(self.head_dim, self.head_dim, spec.max_position_embeddings, spec.rope_theta)
        self.attn = Attention(
            _layer_name(index),
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            scale=1.0 / math.sqrt(self.head_dim),
            impl=impl,
        )

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        return (num_blocks, block_size, self.num_kv_heads, self.head_dim)

    def forward(self, positions: Tensor, hidden: Tensor) -> Tensor:
        # `view`, not `reshape`: reshape of a split output would make Dynamo specialise num_tokens == 1.
        tokens = hidden.shape[0]
        q, k, v = self.qkv_proj(hidden).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:
            q = self.q_norm(q.view(tokens, self.num_heads, self.head_dim)).view(tokens, self.q_size)
            k = self.k_norm(k.view(tokens, self.num_kv_heads, self.head_dim)).view(tokens, self.kv_size)
        q, k = self.rotary(positions, q, k)
        out = self.attn(
            q.view(tokens, self.num_heads, self.head_dim),
            k.view(tokens, self.num_kv_heads, self.head_dim),
            v.view(tokens, self.num_kv_heads, self.head_dim),
        )
        return self.o_proj(out.view(tokens, self.q_size))


class MLABlock(nn.Module):
    """Multi-head latent attention with absorbed projections (DeepSeek-V3 shaped, small).

    Cache per token: [c_kv (kv_lora_rank) | k_pe (rope dim)] as the key and
    [c_kv | 0] as the value, one "kv head"; queries are [q_nope @ W_uk | q_pe] per head,
    so q·k = q_nope·k_nope + q_pe·k_pe and the value read is c_kv, projected by W_uv.
    """

    def __init__(self, spec: ModelSpec, index: int, impl: AttentionImpl, quantization: Optional[str]) -> None:
        super().__init__()
        if spec.kv_lora_rank < 1 or spec.qk_rope_head_dim < 2:
            raise ConfigError(
                f"model {spec.name}: MLA needs kv_lora_rank >= 1 and qk_rope_head_dim >= 2, got "
                f"{spec.kv_lora_rank} and {spec.qk_rope_head_dim}",
                key="model",
            )
        self.num_heads = spec.num_attention_heads
        self.nope_dim = spec.head_dim
        self.rope_dim = spec.qk_rope_head_dim
        self.v_dim = spec.head_dim
        self.lora_rank = spec.kv_lora_rank
        self.latent_dim = self.lora_rank + self.rope_dim
        self.q_proj = make_linear(
            spec.hidden_size, self.num_heads * (self.nope_dim + self.rope_dim), quantization=quantization
        )
        self.kv_a_proj = make_linear(spec.hidden_size, self.lora_rank + self.rope_dim, quantization=quantization)
        self.kv_a_norm = RMSNorm(self.lora_rank, spec.rms_norm_eps)
        self.w_uk = nn.Parameter(torch.empty(self.num_heads, self.nope_dim, self.lora_rank))
        self.w_uv = nn.Parameter(torch.empty(self.num_heads, self.lora_rank, self.v_dim))
        self.o_proj = make_linear(self.num_heads * self.v_dim, spec.hidden_size, quantization=quantization)
        self.rotary = RotaryEmbedding(self.rope_dim, self.rope_dim, spec.max_position_embeddings, spec.rope_theta)
        self.attn = Attention(
            _layer_name(index),
            num_heads=self.num_heads,
            num_kv_heads=1,
            head_dim=self.latent_dim,
            scale=1.0 / math.sqrt(self.nope_dim + self.rope_dim),
            impl=impl,
        )

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        return (num_blocks, block_size, 1, self.latent_dim)

    def forward(self, positions: Tensor, hidden: Tensor) -> Tensor:
        tokens = hidden.shape[0]
        q = self.q_proj(hidden).view(tokens, self.num_heads, self.nope_dim + self.rope_dim)
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)
        c_kv, k_pe = self.kv_a_proj(hidden).split([self.lora_rank, self.rope_dim], dim=-1)
        c_kv = self.kv_a_norm(c_kv)
        q_pe, k_pe = self.rotary(positions, q_pe, k_pe)  # the kernel takes [T, heads, rope] as is
        q_latent = torch.einsum("thd,hdl->thl", q_nope, self.w_uk)
        query = torch.cat((q_latent, q_pe), dim=-1)
        key = torch.cat((c_kv, k_pe), dim=-1).unsqueeze(1)
        value = torch.cat((c_kv, torch.zeros_like(k_pe)), dim=-1).unsqueeze(1)
        out = self.attn(query, key, value)
        per_head = torch.einsum("thl,hlv->thv", out[..., : self.lora_rank], self.w_uv)
        return self.o_proj(per_head.flatten(1))


# --------------------------------------------------------------------------- decoder


class DecoderLayer(nn.Module):
    self_attn: Union["MHABlock", "MLABlock"]

    def __init__(self, spec: ModelSpec, index: int, impl: AttentionImpl, quantization: Optional[str],
                 tensor_parallel_size: int = 1) -> None:
        super().__init__()
        self.tensor_parallel_size = tensor_parallel_size
        block = MLABlock if spec.attention == "mla" else MHABlock
        self.self_attn = block(spec, index, impl, quantization)
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        if spec.is_moe:
            experts = max(spec.num_experts, 1)
            top_k = min(max(spec.num_experts_per_tok, 1), experts)
            self.mlp: nn.Module = DenseMoE(spec.hidden_size, moe_expert_size(spec), experts, top_k)
        else:
            self.mlp = GatedMLP(spec.hidden_size, spec.intermediate_size, quantization=quantization)

    def forward(self, positions: Tensor, hidden: Tensor, residual: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        # The residual add sits right before each norm (the add + rms_norm fusion site).
        if residual is None:
            residual = hidden
        else:
            residual = hidden + residual
        # o_proj and down_proj are row-parallel: each ends with the group's all-reduce (tp > 1)
        hidden = tp_all_reduce(self.self_attn(positions, self.input_layernorm(residual)), self.tensor_parallel_size)
        residual = hidden + residual
        hidden = tp_all_reduce(self.mlp(self.post_attention_layernorm(residual)), self.tensor_parallel_size)
        return hidden, residual


class DecoderModel(nn.Module):
    """A causal decoder: embed -> layers -> final norm; the LM head is applied separately."""

    def __init__(self, spec: ModelSpec, options: ModelOptions) -> None:
        super().__init__()
        if options.quantization not in QUANTIZATION_METHODS:
            raise ConfigError(
                f"quantization {options.quantization!r} is not supported; choose one of {QUANTIZATION_METHODS}",
                key="quantization",
            )
        self.spec = spec
        self.options = options
        self.impl = attention_impl_for(options.attention_backend)
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(spec, index, self.impl, options.quantization, options.tensor_parallel_size)
            for index in range(spec.num_hidden_layers)
        )
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    @property
    def decoder_layers(self) -> list[DecoderLayer]:
        """The layers, typed (an nn.ModuleList yields plain Modules)."""
        return cast("list[DecoderLayer]", list(self.layers))

    @property
    def attention_layers(self) -> dict[str, Attention]:
        """Layer name -> Attention module (the forward context's ``attention_layers``)."""
        return {layer.self_attn.attn.layer_name: layer.self_attn.attn for layer in self.decoder_layers}

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def forward(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        # a vocab-parallel embedding sums the ranks' partial lookups (tp > 1)
        hidden = tp_all_reduce(self.embed_tokens(input_ids), self.options.tensor_parallel_size)
        residual: Optional[Tensor] = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, residual)
        assert residual is not None
        return self.norm(hidden + residual)

    def compute_logits(self, hidden: Tensor) -> Tensor:
        return self.lm_head(hidden)

    def kv_cache_bytes(self, num_blocks: int, block_size: int) -> int:
        """Bytes `make_kv_caches` allocates (keys and values of every layer)."""
        element = self.embed_tokens.weight.element_size()
        shapes = [layer.self_attn.kv_cache_shape(num_blocks, block_size) for layer in self.decoder_layers]
        return sum(2 * math.prod(shape) * element for shape in shapes)

    def make_kv_caches(self, num_blocks: int, block_size: int) -> dict[str, KVCache]:
        """Zeroed paged KV caches for every attention layer, on the model's device and dtype."""
        if num_blocks < 1 or block_size < 1:
            raise ConfigError(f"KV cache needs num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        weight = self.embed_tokens.weight
        if weight.device.type == "cpu":
            _check_host_memory(
                self.kv_cache_bytes(num_blocks, block_size),
                f"the KV cache of model {self.spec.name!r} ({num_blocks} blocks of {block_size} tokens, "
                f"{self.num_layers} layer{'s' if self.num_layers != 1 else ''})",
                "use --num-layers N to shorten the model, fewer requests or a smaller --max-num-seqs (the cache "
                "holds the longest request for each concurrent sequence), or `ascendgraph plan`, which measures "
                "with meta tensors",
            )
        caches = {}
        for layer in self.decoder_layers:
            shape = layer.self_attn.kv_cache_shape(num_blocks, block_size)
            caches[layer.self_attn.attn.layer_name] = KVCache(
                key=zeros_on_first_touch(shape, weight.dtype, weight.device),
                value=zeros_on_first_touch(shape, weight.dtype, weight.device),
            )
        return caches


# Below this size a host tensor is zeroed the ordinary way (a memory map per tensor would
# cost more than it saves).
LAZY_ZEROS_MIN_BYTES = 1 << 20


def zeros_on_first_touch(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``torch.zeros(shape, dtype=dtype, device=device)``; on the host, a large one is backed
    by an anonymous memory map, whose pages the OS hands out zero-filled on first touch.

    ``torch.zeros`` writes every page up front, so a paged KV cache sized for the longest
    requests held its whole size in resident memory (320 MiB for the default run's two
    caches) although requests write a few of its blocks. The values are the same zeros; only
    the pages nobody writes stay unmapped. The tensor keeps the map alive."""
    element = torch.empty((), dtype=dtype).element_size()
    nbytes = math.prod(shape) * element
    if torch.device(device).type != "cpu" or nbytes < LAZY_ZEROS_MIN_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    buffer = mmap.mmap(-1, nbytes)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)


# --------------------------------------------------------------------------- host memory
# A model too large for this host would die in the allocator ("DefaultCPUAllocator: can't
# allocate memory") after minutes of work; the estimate below refuses it up front instead.

BUILD_MEMORY_FIX = (
    "use --num-layers N to shorten it, a smaller config, or `ascendgraph plan`, which measures with meta tensors"
)


def _meminfo_available() -> Optional[int]:
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _sysconf_available() -> Optional[int]:
    try:
        pages, size = os.sysconf("SC_AVPHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as handle:
            text = handle.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # cgroup v2 writes "max" for no limit


def _cgroup_available() -> Optional[int]:
    """What a cgroup memory limit (v2, else v1) still allows, or None without a limit."""
    for limit_path, usage_path in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        limit, usage = _read_int(limit_path), _read_int(usage_path)
        if limit is not None and usage is not None and limit < (1 << 60):  # v1 "no limit" is ~2**63
            return max(0, limit - usage)
    return None


def available_host_memory() -> Optional[int]:
    """Bytes of host memory this process can still allocate, or None when that is unknown.

    MemAvailable (page cache counts as free), else free pages from sysconf; capped by a
    cgroup memory limit (containers) and by the address-space limit (``ulimit -v``) when there
    is one.
    """
    system = _meminfo_available()
    if system is None:
        system = _sysconf_available()
    known = [value for value in (system, _cgroup_available(), _address_space_available()) if value is not None]
    return min(known) if known else None


def _address_space_available() -> Optional[int]:
    """What ``ulimit -v`` (RLIMIT_AS) still allows this process to map: the soft limit minus the
    virtual size it has now (/proc/self/statm); None without a limit. Without this, a run under
    ``ulimit -v`` passed the pre-check and then failed inside an allocation with an OSError."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (ImportError, OSError, ValueError, AttributeError):
        return None
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return None
    try:
        with open("/proc/self/statm", encoding="ascii") as handle:
            virtual = int(handle.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None
    return max(0, soft - virtual)


def _human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.1f} {unit}" if unit != "B" else f"{count} B"
        value /= 1024
    return f"{count} B"  # pragma: no cover


def _check_host_memory(needed: int, what: str, fix: str) -> None:
    available = available_host_memory()
    if available is not None and needed > available:
        raise ConfigError(
            f"{what} needs about {_human_bytes(needed)} ({needed} bytes) of host memory but only "
            f"{_human_bytes(available)} is available: {fix}",
            key="model",
        )


# Random initialisers (nn.init's and the Tensor methods they call): each only fills values.
_RANDOM_INITIALISERS = frozenset({
    "normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_",
    "xavier_uniform_", "xavier_normal_",
})


class _SkipRandomInitialisers(torch.overrides.TorchFunctionMode):
    """Skips random initialisers: a meta tensor has no values to draw, and `build_model`
    overwrites every parameter (`_initialise`). Besides, torch's meta
    path for ``normal_`` runs through ``torch._refs``, whose first call imports ``torch._dynamo``
    (about 1.3 s) in a run that otherwise never needs it (ascendgraph/dynamo_gate.py)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Optional[dict] = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__name__", None) in _RANDOM_INITIALISERS:
            return args[0] if args else kwargs["tensor"]
        return func(*args, **kwargs)


def estimate_build_bytes(spec: ModelSpec, options: ModelOptions) -> int:
    """Peak host bytes of `build_model` on the CPU: every parameter and buffer as constructed
    (float32), plus the initialiser's temporaries for the largest tensor (measured on a
    meta-device replica, so nothing is allocated)."""
    with torch.device("meta"), _SkipRandomInitialisers():
        replica = DecoderModel(spec, options)
    tensors = [*replica.parameters(), *replica.buffers()]
    total = sum(t.numel() * t.element_size() for t in tensors)
    largest = max((t.numel() * 4 for t in replica.parameters()), default=0)  # float32 draws in _initialise
    return total + 2 * largest


def _builds_in_host_memory(device: torch.device | str) -> bool:
    """True when build_model materialises the weights in host memory (not on meta, e.g. for `plan`)."""
    return torch.device(device).type != "meta" and torch.get_default_device().type == "cpu"


# --------------------------------------------------------------------------- weights


def _initialise(model: DecoderModel, seed: int) -> None:
    """Deterministic weights: N(0, 1/fan_in) projections, N(0, 1) embeddings, norms near 1."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or "_norm." in name or name.endswith("layernorm.weight"):
                values = 1.0 + 0.05 * torch.randn(param.shape, generator=generator)
            elif "embed_tokens" in name:
                values = torch.randn(param.shape, generator=generator)
            else:
                fan_in = param.shape[-1] if param.dim() > 1 else param.shape[0]
                values = torch.randn(param.shape, generator=generator) / math.sqrt(fan_in)
            param.copy_(values.to(param.dtype))


def build_model(
    spec: ModelSpec,
    *,
    attention_backend: Optional[str] = None,
    dtype: str | torch.dtype = "float32",
    seed: int = 0,
    device: torch.device | str = "cpu",
    quantization: Optional[str] = None,
    tensor_parallel_size: int = 1,
) -> DecoderModel:
    """A model of ``spec`` with seeded random weights, in eval mode, on ``device``.

    ``tensor_parallel_size`` > 1 makes the model issue its tensor-parallel all-reduces
    (`layers.tp_all_reduce`); the weights are the whole model's either way (one rank plays
    the group)."""
    if isinstance(tensor_parallel_size, bool) or not isinstance(tensor_parallel_size, int) or tensor_parallel_size < 1:
        raise ConfigError(f"tensor_parallel_size must be an integer >= 1, got {tensor_parallel_size!r}",
                          key="tensor_parallel_size")
    spec.require_dimensions()
    options = ModelOptions(
        attention_backend=attention_backend or spec.natural_attention_backend,
        dtype=parse_dtype(dtype),
        seed=seed,
        quantization=quantization,
        tensor_parallel_size=tensor_parallel_size,
    )
    if _builds_in_host_memory(device):
        _check_host_memory(
            estimate_build_bytes(spec, options),
            f"model {spec.name!r} ({spec.num_hidden_layers} layers, hidden_size {spec.hidden_size}, "
            f"intermediate_size {spec.intermediate_size}, vocab_size {spec.vocab_size})",
            BUILD_MEMORY_FIX,
        )
    # torch's own initialisers (nn.Linear's kaiming_uniform_, ...) are skipped: _initialise
    # overwrites every parameter, and they cost a quarter of a small model's build.
    with _SkipRandomInitialisers():
        model = DecoderModel(spec, options)
    _initialise(model, seed)
    for module in model.modules():
        if isinstance(module, W8A8Linear):  # quantised variants: int8-valued weights + scales
            module.quantize_weights_()
    model = model.to(device=device, dtype=options.dtype)
    # rope caches stay float32 (the kernel computes in float32), and so do quantisation scales
    for module in model.modules():
        if isinstance(module, RotaryEmbedding):
            module.cos_sin_cache = module.cos_sin_cache.float()
        if isinstance(module, W8A8Linear):
            for name, buffer in list(module.named_buffers(recurse=False)):
                setattr(module, name, buffer.float())
    model.eval()
    model.requires_grad_(False)
    return model
