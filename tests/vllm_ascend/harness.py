"""What the vLLM Ascend tests share: the availability check, a VllmConfig built the way
vLLM Ascend's worker sees it, the forward context its model runner sets, a fresh facade
NPU per test, and a recorder of every kernel call vLLM Ascend's code issues.

Nothing of vLLM Ascend is copied here: its modules are imported from the source the
environment points at (scripts/vllm-ascend-env.sh). Where a test re-states what vLLM
Ascend's model runner does around the code under test (the forward-context fields it sets,
the order replay -> update), the file and line are cited at the place.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

SELECTED = False  # set by conftest: the run selects -m vllm_ascend
TARGET_VLLM = "0.27.1"
HOW = "build and run it with `make vllm-ascend` (docs/vllm-ascend.md)"


def _unavailable() -> Optional[str]:
    try:
        import vllm
    except ImportError as exc:
        return f"vLLM is not importable ({exc}); {HOW}"
    try:
        spec = importlib.util.find_spec("vllm_ascend")
    except (ImportError, ValueError) as exc:
        return f"vllm_ascend cannot be found ({exc}); {HOW}"
    if spec is None:
        return f"vllm_ascend is not on sys.path; {HOW}"
    from sim.facade.modules import is_facade

    import sys

    module = sys.modules.get("torch_npu")
    if module is None:
        import torch_npu as module  # noqa: F811  (the shim of python -m sim.facade installs the facade)
    if not is_facade(module):
        return f"torch_npu is not the simulator facade: run the session under `python -m sim.facade --`; {HOW}"
    return None


def require() -> None:
    """Skip the calling module (or fail it, in CI when the run selects -m vllm_ascend)."""
    reason = _unavailable()
    if reason is None:
        return
    if SELECTED and os.environ.get("ASCENDGRAPH_CI") == "1":
        pytest.fail(f"{reason} (ASCENDGRAPH_CI=1: the vLLM Ascend suite must run in CI)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def source_dir() -> Path:
    import vllm_ascend

    return Path(vllm_ascend.__file__).resolve().parents[1]


# --------------------------------------------------------------------------- vLLM Ascend objects
HEADS, KV_HEADS, HEAD_DIM, BLOCKS, BLOCK_SIZE = 8, 2, 128, 16, 128
LAYER_NAMES = ("model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn")


# A tiny llama-like model for a real ModelConfig, offline (no download): the config.json a
# test writes. vLLM inspects the model class in a subprocess that loads vLLM Ascend's general
# plugins; its model-loader plugin imports uvicorn (model_loader/rfork/seed_server.py:24),
# which the environment does not install, so the subprocess is told to load the other three
# (VLLM_PLUGINS): the loader plays no part in what the inspection reports.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256, "intermediate_size": 512,
    "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 32, "num_hidden_layers": 2,
    "vocab_size": 1000, "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}
MAX_MODEL_LEN = 4096
INSPECTION_PLUGINS = "ascend,ascend_model,ascend_kv_connector,ascend_service_profiling"


@contextlib.contextmanager
def environment(**values: Optional[str]) -> Iterator[None]:
    """Set (a value) or unset (None) environment variables for the block."""
    saved = {key: os.environ.get(key) for key in values}
    try:
        for key, value in values.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_MODEL_CONFIGS: dict[tuple[str, bool], Any] = {}


def tiny_model_dir(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(TINY_LLAMA))
    return directory


def model_config(directory: Path, *, enforce_eager: bool = False) -> Any:
    """vLLM's ModelConfig of the tiny model in ``directory`` (built once per process and setting)."""
    key = (str(directory), enforce_eager)
    if key not in _MODEL_CONFIGS:
        from vllm.config import ModelConfig

        with environment(VLLM_PLUGINS=INSPECTION_PLUGINS, HF_HUB_OFFLINE="1"):
            _MODEL_CONFIGS[key] = ModelConfig(model=str(directory), skip_tokenizer_init=True, dtype="bfloat16",
                                              max_model_len=MAX_MODEL_LEN, enforce_eager=enforce_eager)
    return _MODEL_CONFIGS[key]


def vllm_config(mode: str = "FULL", **additional: Any) -> Any:
    """A VllmConfig as vLLM Ascend's worker sees it (NPUPlatform.check_and_update_config runs
    in its constructor) with the graph mode given; no model (no download)."""
    from vllm.config import CompilationConfig, VllmConfig
    from vllm_ascend.ascend_config import init_ascend_config

    config = VllmConfig(compilation_config=CompilationConfig(cudagraph_mode=mode), additional_config=additional)
    init_ascend_config(config)  # the worker's set-up reads additional_config (pa_shape_list ...) from here
    return config


_TINY_DIR: list[Path] = []


def builder_config(mode: str = "FULL", **additional: Any) -> Any:
    """A VllmConfig with the tiny model's ModelConfig (so NPUPlatform.check_and_update_config
    runs all of its graph logic), for vLLM Ascend's metadata builder, which reads the model
    config (max_model_len, the mask's runner type)."""
    from vllm.config import CompilationConfig, VllmConfig
    from vllm_ascend.ascend_config import init_ascend_config

    if not _TINY_DIR:
        _TINY_DIR.append(tiny_model_dir(Path(tempfile.mkdtemp(prefix="vllm-ascend-tiny-llama-"))))
    with environment(PYTORCH_NPU_ALLOC_CONF=os.environ.get("PYTORCH_NPU_ALLOC_CONF")):  # platform.py:1208-1227 sets it
        config = VllmConfig(model_config=model_config(_TINY_DIR[0]),
                            compilation_config=CompilationConfig(cudagraph_mode=mode), additional_config=additional)
    init_ascend_config(config)
    return config


DEVICE = "npu"  # the model runner's device: the facade's simulated NPU (sim.npu_device)


def metadata_builder(config: Any) -> Any:
    """vLLM Ascend's AscendAttentionMetadataBuilder for the layers' KV-cache group (one full-
    attention group: 2 KV heads of 128, bf16, blocks of 128), on the npu device as the model
    runner makes it; its host-to-device copy of query_start_loc pins host memory first
    (attention_v1.py:347)."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm_ascend.attention.attention_v1 import AscendAttentionMetadataBuilder

    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=KV_HEADS, head_size=HEAD_DIM, dtype=torch.bfloat16)
    return AscendAttentionMetadataBuilder(spec, list(LAYER_NAMES), config, torch.device(DEVICE))


def update_config(config: Any) -> Any:
    """What update_full_graph_params reads of the VllmConfig, with a model config stand-in:
    ``hf_text_config`` without ``sliding_window`` (attention_v1.py:874 refreshes the block
    table then), the compilation and speculative configs of ``config``."""
    from types import SimpleNamespace

    return SimpleNamespace(model_config=SimpleNamespace(hf_text_config=SimpleNamespace()),
                           compilation_config=config.compilation_config, speculative_config=None)


def reset_vllm_ascend_state() -> None:
    """vLLM Ascend keeps graph parameters in module globals (acl_graph.py:311 _graph_params,
    attention_v1.py _ATTN_KEYS_BUFFER): a fresh process-like start per test."""
    from vllm_ascend.attention import attention_v1
    from vllm_ascend.compilation import acl_graph

    from vllm.platforms import current_platform

    type(current_platform)._global_graph_pool = None  # vLLM's Platform caches one pool per process
    # AttentionMaskBuilder is a process-wide singleton (attention_mask.py:33-34, utils.py:1296-1304)
    # that keeps its masks on the device it was first built for: a fresh worker builds it anew.
    from vllm_ascend.attention import attention_mask

    for cell in attention_mask.AttentionMaskBuilder.__closure__ or ():
        if isinstance(cell.cell_contents, dict):
            cell.cell_contents.clear()
    acl_graph._graph_params = None
    acl_graph._draft_graph_params = None
    acl_graph._draft_graph_prefill_params = None
    attention_v1._ATTN_KEYS_BUFFER = None  # its initial value (attention_v1.py:70)


class Layer:
    """One attention layer: vLLM Ascend's AscendAttentionBackendImpl, its KV cache in the
    layout of AscendAttentionBackend.get_kv_cache_shape ([2, blocks, block_size, kv_heads, D]),
    and the attention-layer attributes its forward reads."""

    def __init__(self, name: str, config: Any, seed: int, *, sinks: Any = None, sliding_window: Optional[int] = None) -> None:
        import math
        from types import SimpleNamespace

        import torch
        from vllm.config import set_current_vllm_config
        from vllm_ascend.attention.attention_v1 import AscendAttentionBackendImpl

        with set_current_vllm_config(config):
            self.impl = AscendAttentionBackendImpl(HEADS, HEAD_DIM, 1 / math.sqrt(HEAD_DIM), KV_HEADS, None,
                                                   sliding_window, "auto", None, "decoder", None, sinks=sinks)
        self.module = SimpleNamespace(layer_name=name, _k_scale_float=1.0, _v_scale_float=1.0)
        generator = torch.Generator().manual_seed(seed)
        cache = (torch.randn(2, BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM, generator=generator) / 4).to(torch.bfloat16)
        self.kv_cache = cache.to(DEVICE)  # the runner allocates KV caches on the device
        self.name = name

    def clone_cache(self) -> Any:
        return self.kv_cache.clone()


@contextlib.contextmanager
def forward_context(config: Any, attn_metadata: Any, mode: str, num_tokens: int, *, uniform: bool = False,
                    sinks: bool = False) -> Iterator[Any]:
    """vLLM's forward context with the extra fields vLLM Ascend's set_ascend_forward_context
    (ascend_forward_context.py:59-171) sets that the graph code reads: capturing False,
    sinks, is_draft_model False (the rest needs a distributed group and MoE state)."""
    from vllm.config import CUDAGraphMode, set_current_vllm_config
    from vllm.forward_context import BatchDescriptor, set_forward_context

    runtime_mode = getattr(CUDAGraphMode, mode)
    descriptor = BatchDescriptor(num_tokens=num_tokens, uniform=uniform) if runtime_mode != CUDAGraphMode.NONE else None
    with set_current_vllm_config(config), set_forward_context(attn_metadata, config, num_tokens=num_tokens,
                                                              cudagraph_runtime_mode=runtime_mode,
                                                              batch_descriptor=descriptor):
        from vllm.forward_context import get_forward_context

        context = get_forward_context()
        context.capturing = False
        context.sinks = sinks
        context.is_draft_model = False
        context.is_draft_model_prefill = False
        yield context


class KernelLog:
    """Every facade kernel call vLLM Ascend's code issues (name, bound arguments), checked
    again against the contract table independently of the kernels' own check."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    @contextlib.contextmanager
    def recording(self) -> Iterator["KernelLog"]:
        from sim.facade import contracts

        original = contracts.check

        def check(kernel: str, arguments: Any) -> None:
            self.calls.append((kernel, dict(arguments)))
            original(kernel, arguments)

        contracts.check = check
        kernels_module = importlib.import_module("sim.facade.kernels")
        saved = kernels_module.check
        kernels_module.check = check
        try:
            yield self
        finally:
            contracts.check = original
            kernels_module.check = saved

    def kernels(self) -> list[str]:
        return [name for name, _ in self.calls]

    def violations(self) -> list[str]:
        from ascendgraph import kernel_contracts

        return [f"{name}: {[r.name for r in kernel_contracts.violations(name, args)]}"
                for name, args in self.calls if kernel_contracts.violations(name, args)]


PAD_SLOT_ID = -1  # vLLM's slot id for padding tokens (the KV write skips them)


class Step:
    """One scheduler step's batch. What the model runner does is re-stated (not copied): the
    batch in its order (decodes first: the runner reorders to AscendAttentionMetadataBuilder.
    reorder_batch_threshold, attention_v1.py:231), then AscendCommonAttentionMetadata as
    NPUModelRunner builds it (worker/model_runner_v1.py:2933-2960):

    * query_start_loc of the real requests; in a FULL graph of ``num_tokens`` tokens a mixed
      batch gets ONE dummy request ending at ``num_tokens`` (NPUModelRunner.
      _pad_query_start_loc_for_fia, model_runner_v1.py:801-857), a uniform one padded
      requests of one token; their seq_lens are the runner's zero fill (model_runner_v1.py:
      1028, 2927) and their block-table rows zeros (2903);
    * num_reqs = the padded request count, num_actual_tokens the real tokens, the slot mapping
      of the padded tokens (-1 past the real ones, 2902).

    The AscendMetadata itself comes from vLLM Ascend's AscendAttentionMetadataBuilder.build
    (attention_v1.py:308-412), called with that common metadata.

    Request r owns blocks 2r and 2r+1; its new tokens sit at the end of its KV length.
    """

    def __init__(self, q_lens: list[int], kv_lens: list[int], *, padded_to: Optional[int] = None,
                 state: str = "ChunkedPrefill", uniform: bool = False) -> None:
        self.q_lens, self.kv_lens, self.state, self.uniform = list(q_lens), list(kv_lens), state, uniform
        self.num_actual_tokens = sum(q_lens)
        self.padded_to = padded_to

    @property
    def num_tokens(self) -> int:
        return self.padded_to if self.padded_to is not None else self.num_actual_tokens

    def slots(self) -> list[int]:
        slots = []
        for request, (q, kv) in enumerate(zip(self.q_lens, self.kv_lens)):
            for position in range(kv - q, kv):
                slots.append((2 * request + position // BLOCK_SIZE) * BLOCK_SIZE + position % BLOCK_SIZE)
        return slots

    def padded_requests(self) -> tuple[list[int], list[int]]:
        """(query ends, KV lengths) of the requests the kernels see, padding included."""
        ends, total = [], 0
        for q in self.q_lens:
            total += q
            ends.append(total)
        lens = list(self.kv_lens)
        if self.padded_to is not None and total < self.padded_to:
            if self.uniform:  # uniform decode: padded requests of one token each, KV length 0
                ends += list(range(total + 1, self.padded_to + 1))
                lens += [0] * (self.padded_to - total)
            else:  # mixed: one dummy request ending at the graph size
                ends.append(self.padded_to)
                lens.append(0)
        return ends, lens

    def common_metadata(self, slot_buffer: Any, table_buffer: Any = None) -> Any:
        import torch
        from vllm_ascend.attention.attention_v1 import AscendAttentionState
        from vllm_ascend.attention.utils import AscendCommonAttentionMetadata

        ends, lens = self.padded_requests()
        requests = len(ends)
        # The runner's block table and slot mapping are persistent device buffers sliced per
        # step (captured graphs keep pointing at them: the paged-attention update re-uses the
        # captured table), filled from host values (model_runner_v1.py:2899-2905).
        if table_buffer is None:
            table_buffer = torch.zeros(requests, 2, dtype=torch.int32, device=DEVICE)
        rows = torch.zeros(requests, 2, dtype=torch.int32)
        for request in range(len(self.q_lens)):
            rows[request] = torch.tensor([2 * request, 2 * request + 1], dtype=torch.int32)
        table_buffer.zero_()
        table = table_buffer[:requests]
        table.copy_(rows)
        slots = torch.full((slot_buffer.shape[0],), PAD_SLOT_ID, dtype=slot_buffer.dtype)
        slots[: self.num_actual_tokens] = torch.tensor(self.slots(), dtype=slot_buffer.dtype)
        slot_buffer.copy_(slots)
        # query_start_loc and seq_lens on the device, their host twins in pinned memory (vLLM's
        # CpuGpuBuffer and GPUModelRunner.optimistic_seq_lens_cpu, pin_memory=PIN_MEMORY, True on
        # NPUPlatform: platform.py:121-123), handed to the builder as query_start_loc_cpu and
        # _seq_lens_cpu / seq_lens_cpu (model_runner_v1.py:2927-2941).
        query_start_loc_cpu = torch.tensor([0, *ends], dtype=torch.int32).pin_memory()
        seq_lens_cpu = torch.tensor(lens, dtype=torch.int32).pin_memory()
        query_start_loc = query_start_loc_cpu.to(DEVICE, non_blocking=True)
        seq_lens = seq_lens_cpu.to(DEVICE, non_blocking=True)
        q_lens = [b - a for a, b in zip([0, *ends], ends)]
        computed = torch.tensor([max(kv - q, 0) for kv, q in zip(lens, q_lens)], dtype=torch.int32)
        return AscendCommonAttentionMetadata(
            query_start_loc=query_start_loc, query_start_loc_cpu=query_start_loc_cpu, seq_lens=seq_lens,
            _seq_lens_cpu=seq_lens_cpu, seq_lens_cpu_upper_bound=seq_lens_cpu, seq_lens_cpu=seq_lens_cpu,
            num_computed_tokens_cpu=computed, num_reqs=requests, num_actual_tokens=self.num_actual_tokens,
            max_query_len=max(self.q_lens), max_seq_len=max(lens), block_table_tensor=table,
            slot_mapping=slot_buffer[: self.num_tokens], causal=True,
            is_prefilling=torch.tensor([q > 1 for q in q_lens]), num_input_tokens=self.num_tokens,
            actual_seq_lengths_q=ends, attn_state=getattr(AscendAttentionState, self.state), decode_token_per_req=1,
        )

    def metadata(self, builder: Any, slot_buffer: Any, table_buffer: Any = None) -> Any:
        """vLLM Ascend's AscendAttentionMetadataBuilder.build on this step's common metadata."""
        return builder.build(0, self.common_metadata(slot_buffer, table_buffer))


def split_fuse_mask() -> Any:
    """AttentionMaskBuilder.get_splitfuse_attn_mask (attention/attention_mask.py:50-55): vLLM
    Ascend's own mask object."""
    import torch
    from vllm_ascend.attention.attention_mask import AttentionMaskBuilder

    return AttentionMaskBuilder(torch.device(DEVICE)).get_splitfuse_attn_mask()


class TwoLayers:
    """The attention part of a two-layer model as the FULL graph sees it: static query/key/
    value input buffers of the graph size, one output buffer per layer, each layer's
    AscendAttentionBackendImpl.forward reading its metadata from the forward context (as
    vLLM's Attention layer does). ``with_kv=False`` passes key/value None (the decode-only
    path that skips the KV write)."""

    def __init__(self, config: Any, size: int, *, seed: int = 0, with_kv: bool = True, **layer_options: Any) -> None:
        import torch

        self.layers = [Layer(name, config, seed + 10 * i, **layer_options) for i, name in enumerate(LAYER_NAMES)]
        self.size = size
        self.with_kv = with_kv
        self.query = torch.zeros(size, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
        self.key = torch.zeros(size, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
        self.value = torch.zeros(size, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE)
        self.outputs = [torch.zeros(size, HEADS, HEAD_DIM, dtype=torch.bfloat16, device=DEVICE) for _ in self.layers]
        self.slot_buffer = torch.full((size,), PAD_SLOT_ID, dtype=torch.int32, device=DEVICE)
        self.table_buffer = torch.zeros(size + 1, 2, dtype=torch.int32, device=DEVICE)
        self.tokens = size  # what the forward passes: the graph size, or an eager batch's real tokens

    def __call__(self) -> list[Any]:
        from vllm.forward_context import get_forward_context

        metadata = get_forward_context().attn_metadata
        n = self.tokens
        for layer, output in zip(self.layers, self.outputs):
            layer.impl.forward(layer.module, self.query[:n], self.key[:n] if self.with_kv else None,
                               self.value[:n] if self.with_kv else None, layer.kv_cache, metadata[layer.name],
                               output=output[:n])
        return self.outputs

    def load_inputs(self, step: Step, seed: int) -> None:
        import torch

        generator = torch.Generator().manual_seed(seed)
        n = step.num_actual_tokens
        for buffer, heads in ((self.query, HEADS), (self.key, KV_HEADS), (self.value, KV_HEADS)):
            host = torch.zeros(buffer.shape, dtype=torch.bfloat16)
            host[:n] = torch.randn(n, heads, HEAD_DIM, generator=generator).to(torch.bfloat16)
            buffer.copy_(host)  # the step's inputs, copied to the device

    def metadata(self, step: Step, builder: Any) -> dict[str, Any]:
        shared = step.metadata(builder, self.slot_buffer, self.table_buffer)  # one KV-cache group: one metadata
        return {layer.name: shared for layer in self.layers}
