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
every argument of every kernel here and what the simulator does with it.

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
from sim.kernels import reshape_and_cache_ref

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


def _norm_dims(gamma: Tensor) -> tuple[int, ...]:
    """The dims a norm normalises: gamma's (x's trailing dims, op docs :3448)."""
    return tuple(range(-max(gamma.dim(), 1), 0))


def _rstd(x: Tensor, gamma: Tensor, eps: float) -> Tensor:
    """1 / rms over gamma's dims (kept as size 1: the reverse-rms output, :3455)."""
    return torch.rsqrt(x.float().pow(2).mean(dim=_norm_dims(gamma), keepdim=True) + eps)


def _rms_norm(x: Tensor, gamma: Tensor, eps: float, beta: Optional[Tensor] = None) -> Tensor:
    """RmsNorm over gamma's dims, times gamma (plus the bias beta where the kernel takes one)."""
    if gamma.dim() <= 1 and beta is None:
        return reference.rms_norm(x, gamma, eps)  # the formula ascendgraph's own ops use, bit for bit
    y = x.float() * _rstd(x, gamma, eps) * gamma.float()
    if beta is not None:
        y = y + beta.float()
    return y.to(x.dtype)


def _rstd_shape(x: Tensor, gamma: Tensor) -> tuple[int, ...]:
    dims = max(gamma.dim(), 1)
    return (*x.shape[:-dims], *([1] * dims))


def rms_norm(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    x, gamma, eps = a["input"], a["gamma"], float(a["epsilon"])
    if fake:
        return torch.empty_like(x), x.new_empty(_rstd_shape(x, gamma), dtype=torch.float32)
    return _rms_norm(x, gamma, eps), _rstd(x, gamma, eps)


def add_rms_norm(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor, Tensor]:
    x1, x2, gamma, eps = a["x1"], a["x2"], a["gamma"], float(a["epsilon"])
    if fake:
        return torch.empty_like(x1), x1.new_empty(_rstd_shape(x1, gamma), dtype=torch.float32), torch.empty_like(x1)
    x_sum = x1 + x2
    return _rms_norm(x_sum, gamma, eps), _rstd(x_sum, gamma, eps), x_sum


def _int8_only(kernel: str, name: str, value: Any) -> None:
    """Quantised outputs other than int8 (int4 packed into int32, uint8, fp8) are not modelled."""
    if value is not None and value not in (torch.int8, torch.qint8, 1, 12):
        raise NotImplementedError(
            f"sim.facade models {kernel} with int8 output only, got {name}={value!r} (int4 packing, uint8 and "
            "float8 outputs are not simulated; docs/facade.md, the kernel audit table)"
        )


def _grouped_smooth(x: Tensor, smooth: Tensor, group_index: Optional[Tensor]) -> Tensor:
    """x * smooth_scales in float32; with group_index (MoE, op docs :4676, :4693) the rows up to
    group_index[g] (cumulative, over x's rows) use smooth_scales[g]."""
    if group_index is None:
        return x.float() * smooth.float()
    rows = x.reshape(-1, x.shape[-1]).float()
    ends = [int(v) for v in group_index.reshape(-1).tolist()]
    group_of_row = torch.bucketize(torch.arange(rows.shape[0]), torch.tensor(ends), right=True)
    group_of_row = group_of_row.clamp_(max=smooth.shape[0] - 1)
    return (rows * smooth.float()[group_of_row]).reshape(x.shape)


def dynamic_quant(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor]:
    x = a["input"]
    _int8_only("npu_dynamic_quant", "dst_type", a["dst_type"])
    if a["quant_mode"] != "pertoken" or float(a["dst_type_max"]) != 0.0:
        raise NotImplementedError(
            f"sim.facade models npu_dynamic_quant per token into int8 (op docs :4660-4666), got quant_mode="
            f"{a['quant_mode']!r}, dst_type_max={a['dst_type_max']}"
        )
    if fake:
        return torch.empty(x.shape, dtype=torch.int8, device=x.device), x.new_empty(x.shape[:-1], dtype=torch.float32)
    if a["smooth_scales"] is not None:  # scale = rowMax(|x * s|) / 127, y = round(x * s / scale) (:4662-4666)
        return reference.dynamic_quant(_grouped_smooth(x, a["smooth_scales"], a["group_index"]))
    return reference.dynamic_quant(x)


def _along(values: Optional[Tensor], x: Tensor, axis: int) -> Optional[Tensor]:
    if values is None or values.numel() == 1:
        return values
    shape = [1] * x.dim()
    shape[axis] = values.numel()
    return values.reshape(shape)


def _quantize(x: Tensor, scales: Tensor, zero_points: Optional[Tensor], div_mode: bool) -> Tensor:
    """(x / scales) + zero_points, or (x * scales) + zero_points without div_mode (op docs
    :11350-11352), rounded and clamped to int8."""
    if div_mode:
        return reference.quantize(x, scales, zero_points)
    y = x.float() * scales.float()
    if zero_points is not None:
        y = y + zero_points.float()
    return torch.round(y).clamp_(reference.INT8_MIN, reference.INT8_MAX).to(torch.int8)


def quantize(a: dict[str, Any], fake: bool) -> Tensor:
    x = a["input"]
    _int8_only("npu_quantize", "dtype", a["dtype"])
    if fake:
        return torch.empty(x.shape, dtype=torch.int8, device=x.device)
    axis = int(a["axis"])
    div_mode = bool(a["div_mode"])
    if not div_mode:  # the elementwise axis: -2, or else the last (:11378)
        axis = -2 if axis == -2 else -1
    scales = _along(a["scales"], x, axis)
    assert scales is not None, "npu_quantize takes a scales tensor (its signature has no default for it)"
    return _quantize(x, scales, _along(a["zero_points"], x, axis), div_mode)


def add_rms_norm_quant(a: dict[str, Any], fake: bool) -> tuple[Tensor, Tensor, Tensor]:
    x1 = a["x1"]
    _int8_only("npu_add_rms_norm_quant", "dst_type", a["dst_type"])
    if fake:
        y = torch.empty(x1.shape, dtype=torch.int8, device=x1.device)
        return y, torch.empty_like(y), torch.empty_like(x1)
    x_sum = x1 + a["x2"]
    y = _rms_norm(x_sum, a["gamma"], float(a["epsilon"]), a["beta"])  # beta: the norm's bias (:12305)
    div_mode = bool(a["div_mode"])
    y1 = _quantize(y, a["scales1"], a["zero_points1"], div_mode)
    y2 = (torch.zeros_like(y1) if a["scales2"] is None
          else _quantize(y, a["scales2"], a["zero_points2"], div_mode))
    return y1, y2, x_sum


def add_rms_norm_dynamic_quant(a: dict[str, Any], fake: bool) -> tuple[Tensor, ...]:
    x1 = a["x1"]
    _int8_only("npu_add_rms_norm_dynamic_quant", "y_dtype", a["y_dtype"])
    mask = list(a["output_mask"]) if a["output_mask"] is not None else [True, a["smooth_scale2"] is not None]
    rows = x1.shape[:-1]
    second = mask[1] and a["smooth_scale2"] is not None
    y2_shape = x1.shape if second else (1,)
    scale2_shape = rows if second else (1,)
    if fake:
        return (torch.empty(x1.shape, dtype=torch.int8, device=x1.device),
                torch.empty(y2_shape, dtype=torch.int8, device=x1.device), torch.empty_like(x1),
                x1.new_empty(rows, dtype=torch.float32), x1.new_empty(scale2_shape, dtype=torch.float32))
    x_sum = x1 + a["x2"]
    y = _rms_norm(x_sum, a["gamma"], float(a["epsilon"]), a["beta"])  # beta: the norm's bias (:12204)

    def quant(smooth: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        return reference.dynamic_quant(y if smooth is None else y.float() * smooth.float())

    y1, scale1 = quant(a["smooth_scale1"])
    if second:
        y2, scale2 = quant(a["smooth_scale2"])
    else:
        y2, scale2 = torch.zeros(1, dtype=torch.int8), torch.zeros(1, dtype=torch.float32)
    return y1, y2, x_sum, scale1, scale2


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


def _overload(name: str) -> Any:
    base, _, overload = name.partition(".")
    return getattr(getattr(getattr(torch.ops, NAMESPACE), base), overload or "default")


def _make(name: str, fake: bool) -> Callable[..., Any]:
    implementation = IMPLEMENTATIONS[name]
    kernel = CONTRACT_KERNEL.get(name, name)

    def run(*args: Any, **kwargs: Any) -> Any:
        bound = _bind(_overload(name)._schema, args, kwargs)
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
