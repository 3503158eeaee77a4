"""The rules of the RMS norms: `npu_rms_norm` and `npu_add_rms_norm`."""

from __future__ import annotations

from typing import Any, Mapping

from ascendgraph.kernel_contracts.common import (
    ADD_RMS_NORM,
    DOCS,
    NORM,
    RMS_NORM,
    SRC_ADD_RMS_NORM,
    KernelRule,
    _dt,
    _present,
    _shape,
    _trailing,
)


def _gamma_like_input(a: Mapping[str, Any]) -> bool:
    """npu_rms_norm's gamma has the input's dtype and its trailing dims."""
    return a["gamma"].dtype == a["input"].dtype and _trailing(a["gamma"], a["input"])


def _add_norm_inputs_ok(a: Mapping[str, Any]) -> bool:
    """x1 and x2 have one shape and one float16/bfloat16/float32 dtype."""
    return a["x1"].dtype in NORM and a["x2"].dtype == a["x1"].dtype and _shape(a["x1"]) == _shape(a["x2"])


def _gamma_like_x1(a: Mapping[str, Any]) -> bool:
    """gamma has x1's dtype and its trailing dims."""
    return a["gamma"].dtype == a["x1"].dtype and _trailing(a["gamma"], a["x1"])


_NORM_RULES = (
    KernelRule(RMS_NORM, "input_dtype", f"{DOCS}:3447, 3458 (float16, bfloat16, float32)",
               _present("input"), lambda a: a["input"].dtype in NORM,
               lambda a: f"input dtype is {_dt(a['input'])}"),
    KernelRule(RMS_NORM, "input_rank", f"{DOCS}:3447 (input has 2-8 dims)",
               _present("input"), lambda a: 2 <= a["input"].dim() <= 8,
               lambda a: f"input has {a['input'].dim()} dims (shape {_shape(a['input'])}); npu_rms_norm takes 2-8"),
    KernelRule(RMS_NORM, "gamma_like_input", f"{DOCS}:3448 (gamma dtype equals input's; the normalised last dims)",
               _present("input", "gamma"), _gamma_like_input,
               lambda a: f"gamma {_shape(a['gamma'])} {_dt(a['gamma'])} vs input {_shape(a['input'])} {_dt(a['input'])}"),
    KernelRule(ADD_RMS_NORM, "x_dtype", SRC_ADD_RMS_NORM,
               _present("x1", "x2"), _add_norm_inputs_ok,
               lambda a: f"x1 {_shape(a['x1'])} {_dt(a['x1'])}, x2 {_shape(a['x2'])} {_dt(a['x2'])}: need equal "
                         "shapes and one float16/bfloat16/float32 dtype"),
    KernelRule(ADD_RMS_NORM, "gamma_like_x", SRC_ADD_RMS_NORM,
               _present("x1", "gamma"), _gamma_like_x1,
               lambda a: f"gamma {_shape(a['gamma'])} {_dt(a['gamma'])} vs x1 {_shape(a['x1'])} {_dt(a['x1'])}"),
)
