"""The norm and quantisation kernels of the facade (``npu_rms_norm``, ``npu_add_rms_norm``,
``npu_dynamic_quant``, ``npu_quantize``, ``npu_add_rms_norm_quant``,
``npu_add_rms_norm_dynamic_quant``): CPU implementations of the op docs' formulas (torch-npu
2.13.0 ``torch_npu/_op_plugin_docs.py``; line numbers below are that file's), registered by
`sim.facade.kernels` with the wheel's schemas.

Each takes the call's arguments keyed by the schema's names and ``fake`` (meta outputs only).
RmsNorm normalises over gamma's dims, with the bias ``beta`` of the fused norms; quantised
outputs are int8 only (others raise NotImplementedError, docs/facade.md's kernel audit table).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from ascendgraph import reference

__all__ = ["rms_norm", "add_rms_norm", "dynamic_quant", "quantize", "add_rms_norm_quant", "add_rms_norm_dynamic_quant"]


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
