"""torch_npu's kernels as ``torch.library`` ops of the ``npu_facade`` namespace.

Theory of operation. Each kernel hw/ (and vLLM Ascend's graph code) calls is defined with
torch-npu 2.13.0's schema (``csrc/aten/npu_native_functions_by_codegen.yaml``, and the
schema strings registered in ``lib/libtorch_npu.so`` where they differ), a CPU
implementation computing with the simulator's reference formulas, and a fake (meta)
implementation. Both implementations first check the call against the kernel-contract
table (`sim.facade.contracts.check`, arguments keyed by the schema's keyword names):
eagerly the CPU implementation runs, while a graph captures or a task update is
collected the simulator computes outputs on the meta device, so the fake one runs.
Either way a call a card would refuse is refused where it is issued.

Two details where the wheel has two answers or none:

* ``npu_fused_infer_attention_score.out`` (and v2's) has two schemas in the wheel: the op
  YAML's ``..., Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) softmax_lse) ->
  (Tensor(a!), Tensor(b!))`` (npu_native_functions_by_codegen.yaml:352, 364) and the string
  libtorch_npu.so registers, ``..., Tensor? workspace=None, Tensor[] out) -> (Tensor, Tensor)``,
  whose ``out=[attention_out, softmax_lse]`` is how vLLM Ascend and hw/ call it. The op here has
  the YAML's schema (it says the kernel writes into its outputs, which the simulator's recorder
  needs); ``torch_npu.npu_fused_infer_attention_score.out(...)`` (a `FacadeOpPacket`) takes
  either spelling and returns ``(attention_out, softmax_lse)``.
* The ATB ops ``_npu_reshape_and_cache`` / ``_npu_rotary_embedding`` have no schema string
  in the wheel (inferred from C++); the names here are descriptive, and like the real
  ones they are meant to be called with positional arguments only.

The fused attention (v1, v2, their ``.out`` and workspace queries) computes every sparse
mode, mask, pre/next-token band, layout and length list the contract table accepts
(`sim.facade.attention_calls` lays a call out, `sim.attention` computes it); what it does
not model (quantisation, position bias, left padding, shared prefixes, MLA rope inputs, the
NTD/NBSD layouts) raises NotImplementedError naming the argument. The workspace queries
return `ascendgraph.workspace_sizes`' model, which the ``.out`` kernels check their
workspace against (``workspace_too_small``). docs/facade.md, the kernel audit table, lists
every argument of every kernel here and what the simulator does with it. The norm and
quantisation kernels are `sim.facade.norm_quant`'s.

The kernels of vLLM Ascend's A2/A3 graph paths (vllm_ascend/attention/attention_v1.py,
vllm_ascend/device/device_op.py at 182b75ea) are here too:

* ``npu_scatter_pa_kv_cache`` (the KV write; ``cache_mode="Norm"``, the ND cache
  ``[blocks, block_size, kv_heads, D]``; the NZ layout and the compressed scene are not modelled);
* ``_npu_paged_attention`` and ``_npu_paged_attention_get_workspace`` (ATB ops, the
  FULL_DECODE_ONLY decode branch: one query token per request); the names are the keywords
  vLLM Ascend passes, the order the C++ signature's in ``lib/libop_plugin_atb.so``;
* ``npu_fused_infer_attention_score_v2`` with ``.out`` and
  ``_npu_fused_infer_attention_score_v2_get_max_workspace`` (the sinks path), with an
  optional ``learnable_sink`` (one logit per query head added to the softmax denominator).
  Its ``.out`` is registered like v1's (``Tensor[] out``) and treated the same.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch import Tensor

import math

from ascendgraph import reference
from ascendgraph.workspace_sizes import fused_attention_workspace_bytes, paged_attention_workspace_bytes
from sim.attention import KVSource, Masking, attend
from sim.facade.attention_calls import FusedAttentionCall, lse_shape, output_shape
from sim.facade.contracts import check
from sim.facade.norm_quant import (add_rms_norm, add_rms_norm_dynamic_quant, add_rms_norm_quant, dynamic_quant,
                                   quantize, rms_norm)
from sim.kernels import reshape_and_cache_ref
from sim.npu_device.fallback import running_on_device

__all__ = ["NAMESPACE", "SCHEMAS", "FacadeOpPacket", "exported_ops"]

NAMESPACE = "npu_facade"
FIA = "npu_fused_infer_attention_score"
FIA_V2 = "npu_fused_infer_attention_score_v2"
PAGED_ATTENTION = "_npu_paged_attention"
SCATTER_PA_KV_CACHE = "npu_scatter_pa_kv_cache"

_FIA_ARGS = (
    "Tensor query, Tensor key, Tensor value, *, Tensor? pse_shift=None, Tensor? atten_mask=None, "
    "SymInt[]? actual_seq_lengths=None, SymInt[]? actual_seq_lengths_kv=None, Tensor? dequant_scale1=None, "
    "Tensor? quant_scale1=None, Tensor? dequant_scale2=None, Tensor? quant_scale2=None, "
    "Tensor? quant_offset2=None, Tensor? antiquant_scale=None, Tensor? antiquant_offset=None, "
    "Tensor? key_antiquant_scale=None, Tensor? key_antiquant_offset=None, Tensor? value_antiquant_scale=None, "
    "Tensor? value_antiquant_offset=None, Tensor? block_table=None, Tensor? query_padding_size=None, "
    "Tensor? kv_padding_size=None, Tensor? key_shared_prefix=None, Tensor? value_shared_prefix=None, "
    "SymInt[]? actual_shared_prefix_len=None, Tensor? query_rope=None, Tensor? key_rope=None, "
    "Tensor? key_rope_antiquant_scale=None, int num_heads=1, float scale=1.0, int pre_tokens=2147483647, "
    "int next_tokens=2147483647, str input_layout=\"BSH\", int num_key_value_heads=0, int sparse_mode=0, "
    "int inner_precise=0, int block_size=0, int antiquant_mode=0, int key_antiquant_mode=0, "
    "int value_antiquant_mode=0, bool softmax_lse_flag=False"
)

# torch-npu 2.13.0 csrc/aten/npu_native_functions_by_codegen.yaml:361-367 (v2 and its workspace query).
_FIA_V2_ARGS = (
    "Tensor query, Tensor key, Tensor value, *, Tensor? query_rope=None, Tensor? key_rope=None, "
    "Tensor? pse_shift=None, Tensor? atten_mask=None, SymInt[]? actual_seq_qlen=None, "
    "SymInt[]? actual_seq_kvlen=None, Tensor? block_table=None, Tensor? dequant_scale_query=None, "
    "Tensor? dequant_scale_key=None, Tensor? dequant_offset_key=None, Tensor? dequant_scale_value=None, "
    "Tensor? dequant_offset_value=None, Tensor? dequant_scale_key_rope=None, Tensor? quant_scale_out=None, "
    "Tensor? quant_offset_out=None, Tensor? quant_scale_p=None, Tensor? learnable_sink=None, "
    "int num_query_heads=1, int num_key_value_heads=0, float softmax_scale=1.0, int pre_tokens=2147483647, "
    "int next_tokens=2147483647, str input_layout=\"BSH\", int sparse_mode=0, int block_size=0, "
    "int query_quant_mode=0, int key_quant_mode=0, int value_quant_mode=0, int inner_precise=0, "
    "bool return_softmax_lse=False, int? query_dtype=None, int? key_dtype=None, int? value_dtype=None, "
    "int? query_rope_dtype=None, int? key_rope_dtype=None, int? key_shared_prefix_dtype=None, "
    "int? value_shared_prefix_dtype=None, int? dequant_scale_query_dtype=None, int? dequant_scale_key_dtype=None, "
    "int? dequant_scale_value_dtype=None, int? dequant_scale_key_rope_dtype=None, int? out_dtype=None"
)
# The ATB paged attention (lib/libop_plugin_atb.so atb::_npu_paged_attention: query, key_cache,
# value_cache, long, long, double, block_table, context_lens, Tensor& out, optional workspace).
_PA_ARGS = (
    "Tensor query, Tensor key_cache, Tensor value_cache, int num_kv_heads, int num_heads, float scale_value, "
    "Tensor block_table, Tensor context_lens"
)

# The .out overloads' tail (npu_native_functions_by_codegen.yaml:352, 364).
_OUT_ARGS = ("Tensor? workspace=None, Tensor(a!) attention_out, Tensor(b!) softmax_lse) "
             "-> (Tensor(a!), Tensor(b!))")

# name (with overload) -> schema after the name; torch-npu 2.13.0 (see the module docstring).
SCHEMAS: dict[str, str] = {
    FIA: f"({_FIA_ARGS}) -> (Tensor, Tensor)",
    f"{FIA}.out": f"({_FIA_ARGS}, {_OUT_ARGS}",
    "_npu_fused_infer_attention_score_get_max_workspace": f"({_FIA_ARGS}) -> Tensor",
    "_npu_fused_infer_attention_score_infer_output": (
        "(Tensor query, Tensor value, *, str input_layout=\"BSH\", Tensor? quant_scale2=None, "
        "Tensor? block_table=None, int num_heads=1, int num_key_value_heads=0, bool softmax_lse_flag=False, "
        "Tensor? query_rope=None) -> (Tensor, Tensor)"
    ),
    "npu_rms_norm": "(Tensor input, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor)",
    "npu_add_rms_norm": "(Tensor x1, Tensor x2, Tensor gamma, float epsilon=1e-06) -> (Tensor, Tensor, Tensor)",
    "npu_dynamic_quant": (
        "(Tensor input, *, Tensor? smooth_scales=None, Tensor? group_index=None, int? dst_type=None, "
        "str quant_mode=\"pertoken\", float dst_type_max=0.0) -> (Tensor, Tensor)"
    ),
    "npu_quantize": (
        "(Tensor input, Tensor scales, Tensor? zero_points, int dtype, int axis=1, bool div_mode=True) -> Tensor"
    ),
    "npu_add_rms_norm_quant": (
        "(Tensor x1, Tensor x2, Tensor gamma, Tensor scales1, Tensor? zero_points1, Tensor? beta=None, "
        "Tensor? scales2=None, Tensor? zero_points2=None, *, int axis=-1, float epsilon=1e-06, "
        "bool div_mode=True, int? dst_type=None) -> (Tensor, Tensor, Tensor)"
    ),
    "npu_add_rms_norm_dynamic_quant": (
        "(Tensor x1, Tensor x2, Tensor gamma, *, Tensor? smooth_scale1=None, Tensor? smooth_scale2=None, "
        "Tensor? beta=None, float epsilon=1e-06, bool[2]? output_mask=None, int? y_dtype=None) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)"
    ),
    "_npu_reshape_and_cache": (
        "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_indices) -> ()"
    ),
    "_npu_rotary_embedding": (
        "(Tensor positions, Tensor(a!) query, Tensor(b!) key, int head_size, Tensor cos_sin_cache, "
        "bool is_neox) -> ()"
    ),
    # npu_native_functions_by_codegen.yaml:775 (the registered schema, verbatim).
    SCATTER_PA_KV_CACHE: (
        "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping, *, "
        "Tensor? compress_lens=None, Tensor? compress_seq_offsets=None, Tensor? seq_lens=None, "
        "str? cache_mode='PA_NZ') -> ()"
    ),
    PAGED_ATTENTION: f"({_PA_ARGS}, Tensor(a!) out, Tensor? workspace=None) -> ()",
    "_npu_paged_attention_get_workspace": f"({_PA_ARGS}, Tensor out) -> Tensor",
    FIA_V2: f"({_FIA_V2_ARGS}) -> (Tensor, Tensor)",
    f"{FIA_V2}.out": f"({_FIA_V2_ARGS}, {_OUT_ARGS}",
    "_npu_fused_infer_attention_score_v2_get_max_workspace": f"({_FIA_V2_ARGS}) -> Tensor",
}


# `int dtype` arguments arrive as c10::ScalarType codes (torch.qint8 -> 12); the contract
# table reads them as torch dtypes, as the caller wrote them.
_SCALAR_TYPES = {1: torch.int8, 2: torch.int16, 3: torch.int32, 12: torch.qint8, 13: torch.quint8,
                 14: torch.qint32, 16: torch.quint4x2}
_DTYPE_ARGUMENTS = ("dtype", "dst_type", "y_dtype")


def _bind(schema: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The call's arguments keyed by the schema's names (defaults filled in)."""
    bound: dict[str, Any] = {}
    positional = list(args)
    for argument in schema.arguments:
        if positional and not argument.kwarg_only:
            bound[argument.name] = positional.pop(0)
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        elif argument.has_default_value():
            bound[argument.name] = argument.default_value
        else:
            bound[argument.name] = None
    for name in _DTYPE_ARGUMENTS:
        value = bound.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value in _SCALAR_TYPES:
            bound[name] = _SCALAR_TYPES[value]
    return bound


# --------------------------------------------------------------------------- implementations
def _fused_call(name: str, a: dict[str, Any]) -> FusedAttentionCall:
    return FusedAttentionCall.from_v2(name, a) if name == FIA_V2 else FusedAttentionCall.from_v1(name, a)


def _fused(name: str, a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    """The functional kernel: attention_out and softmax_lse (op docs :8147-8148; [1] of zeros
    without the lse flag)."""
    call = _fused_call(name, a)
    query = a["query"]
    attn = torch.empty(output_shape(call), dtype=query.dtype, device=query.device)
    lse = torch.zeros(lse_shape(call), dtype=torch.float32, device=query.device)
    if not fake:
        call.run(attn, lse if call.lse_flag else None)
    return attn, lse


def _fused_out(name: str, a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    """The ``.out`` kernel: writes attention_out (and, with the lse flag, softmax_lse) and
    returns both, as the registered overload does."""
    out = (a["attention_out"], a["softmax_lse"])
    call = _fused_call(name, a)
    expected = lse_shape(call)
    if call.lse_flag and int(out[1].numel()) != math.prod(expected):
        raise RuntimeError(
            f"simulator: {name}.out with the softmax_lse flag writes softmax_lse of shape {expected}, but out[1] has "
            f"shape {tuple(out[1].shape)} (the kernel would write past it)"
        )
    if not fake:
        call.run(out[0], out[1] if call.lse_flag else None)
    return out


def fia(a: dict[str, Any], fake: bool) -> Any:
    return _fused(FIA, a, fake)


def fia_out(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    return _fused_out(FIA, a, fake)


def _workspace(a: dict[str, Any], needed: int) -> Tensor:
    """A workspace of ``needed`` elements of the query's dtype, as op-plugin hands the byte
    count back (FusedInferAttentionScoreKernelNpuOpApi.cpp: apply_tensor_without_format({size}, query dtype))."""
    return torch.empty(needed, dtype=a["query"].dtype, device=a["query"].device)


def fia_workspace(a: dict[str, Any], fake: bool) -> Tensor:
    _fused_call(FIA, a)  # what the simulator cannot compute is refused at the query already
    return _workspace(a, fused_attention_workspace_bytes(a))


def fia_v2_workspace(a: dict[str, Any], fake: bool) -> Tensor:
    _fused_call(FIA_V2, a)
    return _workspace(a, fused_attention_workspace_bytes(a, v2=True))


def fia_infer_output(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    query = a["query"]
    flag = bool(a["softmax_lse_flag"])
    if not flag:
        return torch.empty_like(query), torch.zeros(1, dtype=torch.float32, device=query.device)
    layout = a["input_layout"]
    heads = int(a["num_heads"])
    if layout == "TND":
        shape: tuple[int, ...] = (int(query.shape[0]), heads, 1)
    elif layout in ("BNSD", "BNSD_BSND"):
        shape = (int(query.shape[0]), heads, int(query.shape[2]), 1)
    else:
        shape = (int(query.shape[0]), heads, int(query.shape[1]), 1)
    return torch.empty_like(query), torch.zeros(shape, dtype=torch.float32, device=query.device)


def reshape_and_cache(a: dict[str, Any], fake: bool) -> None:
    if not fake:
        reshape_and_cache_ref(a["key"], a["value"], a["key_cache"], a["value_cache"], a["slot_indices"])


def rotary_embedding(a: dict[str, Any], fake: bool) -> None:
    if fake:
        return
    query, key = a["query"], a["key"]
    q, k = reference.rotary_embedding(a["positions"], query, key, a["cos_sin_cache"], int(a["head_size"]),
                                      bool(a["is_neox"]))
    query.copy_(q)
    key.copy_(k)


def scatter_pa_kv_cache(a: dict[str, Any], fake: bool) -> None:
    mode = a["cache_mode"]
    compressed = [name for name in ("compress_lens", "compress_seq_offsets", "seq_lens") if a[name] is not None]
    if compressed:
        raise NotImplementedError(
            f"sim.facade models {SCATTER_PA_KV_CACHE}'s scene 2 (op docs :6988-6994), not the compressed scene: got "
            f"{', '.join(compressed)}"
        )
    if mode not in (None, "Norm") or a["key"].dim() != 3:
        raise NotImplementedError(
            f"sim.facade models {SCATTER_PA_KV_CACHE} with cache_mode='Norm' (ND caches [blocks, block_size, "
            f"kv_heads, D]) and 3-D key/value only, got cache_mode={mode!r}, key of {a['key'].dim()} dims "
            "(the NZ layout and the compressed scene are not modelled)"
        )
    if not fake:
        reshape_and_cache_ref(a["key"], a["value"], a["key_cache"], a["value_cache"], a["slot_mapping"])


def paged_attention(a: dict[str, Any], fake: bool) -> None:
    """ATB's decode attention: query token i attends to positions [0, context_lens[i]) of
    block_table row i (no mask, no sparse mode: one query token per request)."""
    if fake:
        return
    query, out, key_cache = a["query"], a["out"], a["key_cache"]
    lens = [int(v) for v in a["context_lens"].reshape(-1).tolist()]
    kv_heads = int(key_cache.shape[2])
    kv = KVSource(key_cache.reshape(-1, kv_heads, key_cache.shape[-1]),
                  a["value_cache"].reshape(-1, kv_heads, a["value_cache"].shape[-1]),
                  a["block_table"], int(key_cache.shape[1]))
    result = torch.zeros(query.shape, dtype=out.dtype)
    attend(query, list(range(len(lens))), [1] * len(lens), lens, kv, Masking(incremental=True),
           float(a["scale_value"]), result)
    out.copy_(result.reshape(out.shape))


def paged_attention_workspace(a: dict[str, Any], fake: bool) -> Tensor:
    return torch.empty(paged_attention_workspace_bytes(a), dtype=torch.uint8, device=a["query"].device)


def fia_v2(a: dict[str, Any], fake: bool) -> Any:
    return _fused(FIA_V2, a, fake)


def fia_v2_out(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    return _fused_out(FIA_V2, a, fake)


IMPLEMENTATIONS: dict[str, Callable[[dict[str, Any], bool], Any]] = {
    FIA: fia,
    f"{FIA}.out": fia_out,
    "_npu_fused_infer_attention_score_get_max_workspace": fia_workspace,
    "_npu_fused_infer_attention_score_infer_output": fia_infer_output,
    "npu_rms_norm": rms_norm,
    "npu_add_rms_norm": add_rms_norm,
    "npu_dynamic_quant": dynamic_quant,
    "npu_quantize": quantize,
    "npu_add_rms_norm_quant": add_rms_norm_quant,
    "npu_add_rms_norm_dynamic_quant": add_rms_norm_dynamic_quant,
    "_npu_reshape_and_cache": reshape_and_cache,
    "_npu_rotary_embedding": rotary_embedding,
    SCATTER_PA_KV_CACHE: scatter_pa_kv_cache,
    PAGED_ATTENTION: paged_attention,
    "_npu_paged_attention_get_workspace": paged_attention_workspace,
    FIA_V2: fia_v2,
    f"{FIA_V2}.out": fia_v2_out,
    "_npu_fused_infer_attention_score_v2_get_max_workspace": fia_v2_workspace,
}
# Tensor arguments a kernel reads on the host, so they stay CPU tensors beside npu ones: the
# ATB paged attention's context_lens (torch-npu 2.13.0 torch_npu/npu/_npugraph_handlers/
# simple_handler.py:21 re-binds it as the op's host argument 7 at a task update; vLLM Ascend
# passes attn_metadata.seq_lens, built from the host seq_lens, attention_v1.py:1273@182b75ea).
HOST_TENSOR_ARGUMENTS: dict[str, frozenset[str]] = {
    PAGED_ATTENTION: frozenset({"context_lens"}),
    "_npu_paged_attention_get_workspace": frozenset({"context_lens"}),
}
# Which contract-table entry checks each op (the infer-output helper takes a subset of FIA's
# arguments and has no rules of its own).
CONTRACT_KERNEL: dict[str, Optional[str]] = {
    FIA: FIA,
    f"{FIA}.out": FIA,
    "_npu_fused_infer_attention_score_get_max_workspace": FIA,
    "_npu_fused_infer_attention_score_infer_output": None,
    "_npu_paged_attention_get_workspace": PAGED_ATTENTION,
    f"{FIA_V2}.out": FIA_V2,
    "_npu_fused_infer_attention_score_v2_get_max_workspace": FIA_V2,
}
# Kernels exported as a `FacadeOpPacket` (an ``.out`` that returns the out tensors).
_PACKETS_WITH_OUT = (FIA, FIA_V2)


# --------------------------------------------------------------------------- registration
_LIBRARY: Optional[torch.library.Library] = None


def _overload(name: str, namespace: str = NAMESPACE) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, namespace), base), overload or "default")


NOT_ON_THE_HOST = (
    "Could not run 'npu::{name}' with arguments from the 'CPU' backend: torch_npu registers its kernels for the "
    "npu device only. Move the inputs to the device (tensor.to('npu'))"
)


def _make(name: str, fake: bool) -> Callable[..., Any]:
    return kernel_entry(name, IMPLEMENTATIONS[name], CONTRACT_KERNEL.get(name, name), fake)


def kernel_entry(name: str, implementation: Callable[[dict[str, Any], bool], Any], kernel: Optional[str],
                 fake: bool, *, namespace: str = NAMESPACE) -> Callable[..., Any]:
    """The function registered for the ``namespace`` (``npu_facade``) op ``name`` (``op`` or
    ``op.overload``): binds the call to the op's schema, checks it against ``kernel``'s contract
    rules (None: no rules) and runs ``implementation`` (``fake``: the meta version)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        # The implementation is registered for CPU tensors: the npu device runs it on CPU aliases
        # of device memory. Called with host tensors only, torch_npu's dispatcher finds no kernel.
        if not fake and not running_on_device():
            raise NotImplementedError(NOT_ON_THE_HOST.format(name=name.partition(".")[0]))
        bound = _bind(_overload(name, namespace)._schema, args, kwargs)
        if kernel is not None:
            check(kernel, bound)
        return implementation(bound, fake)

    run.__name__ = f"{name.replace('.', '_')}_{'fake' if fake else 'cpu'}"
    return run


def register() -> None:
    """Define the ``npu_facade`` ops once per process (torch.library cannot undefine them)."""
    global _LIBRARY
    if _LIBRARY is not None:
        return
    library = torch.library.Library(NAMESPACE, "DEF")
    for name, schema in SCHEMAS.items():
        library.define(f"{name}{schema}")
    for name in SCHEMAS:
        library.impl(name, _make(name, fake=False), "CPU")
        torch.library.register_fake(f"{NAMESPACE}::{name}", _make(name, fake=True), lib=library)
    _LIBRARY = library


class FacadeOpPacket:
    """``torch_npu.npu_fused_infer_attention_score`` (and ``_v2``): callable, with ``.default``
    and an ``.out`` that returns ``(attention_out, softmax_lse)`` as the registered overload does."""

    def __init__(self, name: str) -> None:
        self.__name__ = name
        self._packet = getattr(getattr(torch.ops, NAMESPACE), name)
        self.default = self._packet.default

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._packet.default(*args, **kwargs)

    def out(self, *args: Any, **kwargs: Any) -> tuple[Tensor, Tensor]:
        """The ``.out`` overload, called as libtorch_npu registers it (``out=[attention_out,
        softmax_lse]``) or with the op YAML's keywords (``attention_out=, softmax_lse=``)."""
        if "out" in kwargs:
            out = kwargs.pop("out")
            if not isinstance(out, (list, tuple)) or len(out) != 2:
                raise RuntimeError(f"{self.__name__}.out takes out=[attention_out, softmax_lse], got {out!r}")
            kwargs["attention_out"], kwargs["softmax_lse"] = out
        return self._packet.out(*args, **kwargs)

    def overloads(self) -> list[str]:
        return self._packet.overloads()


def exported_ops() -> dict[str, Any]:
    """What ``torch_npu.<name>`` is for each kernel (OpOverloadPackets, as torch_npu exports)."""
    register()
    exported: dict[str, Any] = {}
    for name in SCHEMAS:
        base = name.partition(".")[0]
        if base in exported:
            continue
        exported[base] = (FacadeOpPacket(base) if base in _PACKETS_WITH_OUT
                          else getattr(getattr(torch.ops, NAMESPACE), base))
    return exported
