"""The rules of the quantisation kernels: `npu_dynamic_quant`, `npu_quantize` and the fused
norm-and-quantise kernels `npu_add_rms_norm_quant` and `npu_add_rms_norm_dynamic_quant`."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch

from ascendgraph.kernel_contracts.common import (
    ADD_RMS_NORM_DYNAMIC_QUANT,
    ADD_RMS_NORM_QUANT,
    DOCS,
    DYNAMIC_QUANT,
    HALF,
    NORM,
    QUANTIZE,
    QUANT_OFFSET_DTYPES,
    QUANT_SCALE_DTYPES,
    KernelRule,
    _contiguous,
    _dt,
    _present,
    _shape,
    _trailing,
)

_DYN_LIKE_GAMMA = ("smooth_scale1", "smooth_scale2", "beta")


def _quant_axis_width(a: Mapping[str, Any]) -> Optional[int]:
    """The size of npu_quantize's elementwise axis (:11377, schema default 1; without div_mode
    -2, or else the last axis: :11378); None when the axis is outside the input's dims."""
    axis, dims = int(a.get("axis", 1)), a["input"].dim()
    if not a.get("div_mode", True):
        axis = -2 if axis == -2 else -1
    return int(a["input"].shape[axis]) if -dims <= axis < dims else None


def _quant_per_channel_ok(a: Mapping[str, Any]) -> bool:
    """scales and zero_points hold one value for the whole input, or one per element of its
    elementwise axis (the other axes broadcast)."""
    width = _quant_axis_width(a)
    return width is not None and all(
        a.get(name) is None or int(a[name].numel()) in (1, width) for name in ("scales", "zero_points"))


# npu_quantize's dtypes depend on div_mode (default True, :11379): True divides by the scales
# (:11359-11361, 11366-11368, 11373-11375), False multiplies (:11362-11364, 11369-11371, 11376;
# vLLM Ascend's calls, ops/register_custom_ops.py@182b75ea:146,152, pass div_mode=False).
_MUL_SCALE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DIV_OUT_DTYPES = (torch.qint8, torch.quint8, torch.int32)
_MUL_OUT_DTYPES = (torch.qint8, torch.quint4x2)


def _divides(a: Mapping[str, Any]) -> bool:
    return bool(a.get("div_mode", True))


def _quant_scales_ok(a: Mapping[str, Any]) -> bool:
    """npu_quantize's scales: float32/bfloat16 (div_mode) or float32/float16/bfloat16, contiguous, at most 1-D."""
    scales = a["scales"]
    dtypes = QUANT_SCALE_DTYPES if _divides(a) else _MUL_SCALE_DTYPES
    return scales.dtype in dtypes and _contiguous(scales) and scales.dim() <= 1


def _quant_zero_points_ok(a: Mapping[str, Any]) -> bool:
    """npu_quantize's zero_points: int8/uint8/int32/bfloat16 (div_mode), or the scales' own
    float dtype; contiguous."""
    zero_points = a["zero_points"]
    if _divides(a):
        dtype_ok = zero_points.dtype in QUANT_OFFSET_DTYPES
    else:
        dtype_ok = zero_points.dtype in _MUL_SCALE_DTYPES and zero_points.dtype == a["scales"].dtype
    return dtype_ok and _contiguous(zero_points)


def _quant_out_dtype_ok(a: Mapping[str, Any]) -> bool:
    """npu_quantize's output dtype: qint8/quint8/int32 (div_mode) or qint8/quint4x2."""
    return a["dtype"] in (_DIV_OUT_DTYPES if _divides(a) else _MUL_OUT_DTYPES)


def _scales1_like_gamma(a: Mapping[str, Any]) -> bool:
    """scales1 has gamma's shape, a float32/bfloat16 dtype and is contiguous."""
    scales = a["scales1"]
    return _shape(scales) == _shape(a["gamma"]) and scales.dtype in QUANT_SCALE_DTYPES and _contiguous(scales)


def _zero_points1_like_gamma(a: Mapping[str, Any]) -> bool:
    """zero_points1 has gamma's shape and an int32/bfloat16 dtype."""
    return _shape(a["zero_points1"]) == _shape(a["gamma"]) and a["zero_points1"].dtype in (torch.int32, torch.bfloat16)


def _gamma_shape_ok(a: Mapping[str, Any]) -> bool:
    """gamma has 1-8 dims, no more than x1, and they are x1's trailing dims."""
    return 1 <= a["gamma"].dim() <= min(8, a["x1"].dim()) and _trailing(a["gamma"], a["x1"])


def _dynamic_quant_inputs_ok(a: Mapping[str, Any]) -> bool:
    """x1 and x2 share one float16/bfloat16 dtype; x1 has 2-8 dims."""
    return a["x1"].dtype in HALF and a["x2"].dtype == a["x1"].dtype and 2 <= a["x1"].dim() <= 8


def _smooth_scales_and_beta_like_gamma(a: Mapping[str, Any]) -> bool:
    """smooth_scale1, smooth_scale2 and beta, where given, have gamma's shape and dtype."""
    gamma = a["gamma"]
    return all(_shape(a[n]) == _shape(gamma) and a[n].dtype == gamma.dtype
               for n in _DYN_LIKE_GAMMA if a.get(n) is not None)


def _gamma_vector_ok(a: Mapping[str, Any]) -> bool:
    """gamma is 1-D, as long as x1's last dim, in x1's dtype."""
    gamma, x1 = a["gamma"], a["x1"]
    return gamma.dim() == 1 and int(gamma.shape[0]) == int(x1.shape[-1]) and gamma.dtype == x1.dtype


def _output_mask_ok(a: Mapping[str, Any]) -> bool:
    """Two bools, not both False; a smooth scale given needs its bit set."""
    mask = a["output_mask"]
    return (len(mask) == 2 and any(mask) and (a.get("smooth_scale1") is None or bool(mask[0]))
            and (a.get("smooth_scale2") is None or bool(mask[1])))


def _x_shapes_rule(kernel: str, min_dims: int, source: str) -> KernelRule:
    """The fused add-norm-quant kernels' ``x_shapes``: x1 and x2 share one shape of
    ``min_dims``-8 dims (the sum x1 + x2 has it)."""
    return KernelRule(kernel, "x_shapes", source, _present("x1", "x2"),
                      lambda a: min_dims <= a["x1"].dim() <= 8 and _shape(a["x2"]) == _shape(a["x1"]),
                      lambda a: f"x1 {_shape(a['x1'])}, x2 {_shape(a['x2'])}: need one shape of {min_dims}-8 dims")


_QUANT_RULES = (
    KernelRule(DYNAMIC_QUANT, "input_dtype_half", f"{DOCS}:4673 (float16, bfloat16)",
               _present("input"), lambda a: a["input"].dtype in HALF, lambda a: f"input dtype is {_dt(a['input'])}"),
    KernelRule(DYNAMIC_QUANT, "input_rank", f"{DOCS}:4673 (input needs more than 1 dim)",
               _present("input"), lambda a: a["input"].dim() > 1, lambda a: f"input has shape {_shape(a['input'])}"),
    KernelRule(QUANTIZE, "input_dtype", f"{DOCS}:11357 (float, float16, bfloat16)",
               _present("input"), lambda a: a["input"].dtype in NORM, lambda a: f"input dtype is {_dt(a['input'])}"),
    KernelRule(QUANTIZE, "scales", f"{DOCS}:11359-11361 (div_mode True: scales float32/bfloat16), :11362-11364 "
               "(div_mode False: float32/float16/bfloat16); issue #15 (contiguous per-tensor or per-channel scales)",
               _present("scales"), _quant_scales_ok,
               lambda a: f"scales {_shape(a['scales'])} {_dt(a['scales'])} contiguous={_contiguous(a['scales'])} "
                         f"div_mode={_divides(a)}"),
    KernelRule(QUANTIZE, "zero_points", f"{DOCS}:11366-11368 (div_mode True: int8, uint8, int32, bfloat16), "
               ":11369-11371 (div_mode False: float32/float16/bfloat16, the scales' dtype)",
               _present("zero_points", "scales"), _quant_zero_points_ok,
               lambda a: f"zero_points dtype is {_dt(a['zero_points'])} (scales {_dt(a['scales'])}, "
                         f"div_mode={_divides(a)})"),
    KernelRule(QUANTIZE, "scales_per_channel", f"{DOCS}:11377 (axis: the elementwise axis, the other axes "
               "broadcast); :11362, 11369 (a 1-D scales / zero_points holds input.shape[axis] values or 1)",
               _present("input", "scales"), _quant_per_channel_ok,
               lambda a: f"scales of {int(a['scales'].numel())} and zero_points of "
                         f"{None if a.get('zero_points') is None else int(a['zero_points'].numel())} values for input "
                         f"{_shape(a['input'])} along axis {a.get('axis', 1)} ({_quant_axis_width(a)} wide): need 1 or "
                         "one per element of the axis"),
    KernelRule(QUANTIZE, "out_dtype", f"{DOCS}:11373-11375 (div_mode True: qint8, quint8, int32), :11376 "
               "(div_mode False: qint8, quint4x2)",
               lambda a: "dtype" in a, _quant_out_dtype_ok, lambda a: f"dtype={a['dtype']} div_mode={_divides(a)}"),
    KernelRule(ADD_RMS_NORM_QUANT, "x_dtype_half", f"{DOCS}:12300-12301 (x1, x2 bfloat16/float16, equal dtypes)",
               _present("x1", "x2"), lambda a: a["x1"].dtype in HALF and a["x2"].dtype == a["x1"].dtype,
               lambda a: f"x1 {_dt(a['x1'])}, x2 {_dt(a['x2'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "gamma_like_x", f"{DOCS}:12302 (gamma dtype equals x1's)",
               _present("x1", "gamma"), lambda a: a["gamma"].dtype == a["x1"].dtype,
               lambda a: f"gamma {_dt(a['gamma'])} vs x1 {_dt(a['x1'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "scales_like_gamma", f"{DOCS}:12303 (scales1 shape equals gamma's, float32/bfloat16); "
               "issue #15 (contiguous scales)",
               _present("scales1", "gamma"), _scales1_like_gamma,
               lambda a: f"scales1 {_shape(a['scales1'])} {_dt(a['scales1'])} vs gamma {_shape(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "zero_points_like_gamma", f"{DOCS}:12304 (zero_points1 shape equals gamma's, int32/bfloat16)",
               _present("zero_points1", "gamma"), _zero_points1_like_gamma,
               lambda a: f"zero_points1 {_shape(a['zero_points1'])} {_dt(a['zero_points1'])} vs gamma {_shape(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_QUANT, "axis_minus_one", f"{DOCS}:12308 (axis: only -1)",
               lambda a: "axis" in a, lambda a: int(a["axis"]) == -1, lambda a: f"axis={a['axis']}"),
    _x_shapes_rule(ADD_RMS_NORM_QUANT, 1, f"{DOCS}:12300-12301 (x1, x2 1-8 dims); :12312, 12314 (y1 and x_out "
                   "have x1's and x2's shape: the two agree)"),
    KernelRule(ADD_RMS_NORM_QUANT, "gamma_shape", f"{DOCS}:12302 (gamma 1-8 dims, the dims of x1 being normalised: "
               "its trailing dims)",
               _present("x1", "gamma"),
               _gamma_shape_ok,
               lambda a: f"gamma {_shape(a['gamma'])} vs x1 {_shape(a['x1'])}: gamma must be x1's trailing dims"),
    KernelRule(ADD_RMS_NORM_QUANT, "beta_like_gamma", f"{DOCS}:12305 (beta: gamma's shape and dtype)",
               _present("beta", "gamma"),
               lambda a: _shape(a["beta"]) == _shape(a["gamma"]) and a["beta"].dtype == a["gamma"].dtype,
               lambda a: f"beta {_shape(a['beta'])} {_dt(a['beta'])} vs gamma {_shape(a['gamma'])} {_dt(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "x_dtype_half", f"{DOCS}:12199-12200 (x1, x2 float16/bfloat16, 2-8 dims)",
               _present("x1", "x2"), _dynamic_quant_inputs_ok,
               lambda a: f"x1 {_shape(a['x1'])} {_dt(a['x1'])}, x2 {_dt(a['x2'])}"),
    _x_shapes_rule(ADD_RMS_NORM_DYNAMIC_QUANT, 2, f"{DOCS}:12199-12200 (x1, x2 2-8 dims); :12212 (x_out = x1 "
                   "+ x2 has x1's shape: the two agree)"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "smooth_scales_and_beta_like_gamma", f"{DOCS}:12202-12204 (smooth_scale1, "
               "smooth_scale2 and beta: gamma's shape and dtype)",
               lambda a: a.get("gamma") is not None and any(a.get(n) is not None for n in _DYN_LIKE_GAMMA),
               _smooth_scales_and_beta_like_gamma,
               lambda a: ", ".join(f"{n} {_shape(a[n])} {_dt(a[n])}" for n in _DYN_LIKE_GAMMA if a.get(n) is not None)
               + f" vs gamma {_shape(a['gamma'])} {_dt(a['gamma'])}"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "gamma_vector", f"{DOCS}:12201 (gamma 1-D, x1's last dim, x1's dtype)",
               _present("x1", "gamma"), _gamma_vector_ok,
               lambda a: f"gamma {_shape(a['gamma'])} {_dt(a['gamma'])} vs x1 {_shape(a['x1'])} {_dt(a['x1'])}"),
    KernelRule(ADD_RMS_NORM_DYNAMIC_QUANT, "output_mask", f"{DOCS}:12206, 12218-12220 (None or 2 bools, not both "
               "False; a smooth scale needs its mask bit)",
               _present("output_mask"),
               _output_mask_ok,
               lambda a: f"output_mask={list(a['output_mask'])!r} (smooth_scale1 given: {a.get('smooth_scale1') is not None}, "
                         f"smooth_scale2 given: {a.get('smooth_scale2') is not None})"),
)
