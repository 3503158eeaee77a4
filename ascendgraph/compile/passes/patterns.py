"""The npugraph_ex fusion patterns: what each fused op replaces, written as plain functions.

Each family below returns the `Pattern` variants of one fusion (one per eps, and per
structural variant such as "the residual sum is used later" or not). Search functions
are written the way the models compute (`ascendgraph.models.layers` is unfused on
purpose); replacements call the fused ``ascendgraph`` op. Checks reject matches the fused
kernel cannot take (shapes, dtypes) — mirroring the constraints vLLM Ascend's passes and
torch_npu's kernels impose:

==========================  ==============================================================
fusion                      replaces
==========================  ==============================================================
rms_norm                    a decomposed RMSNorm: (cast to float32,) pow 2, mean over the
                            last dim, + eps, rsqrt, mul, mul by the weight (cast back)
add_rms_norm                ``s = x + r; rms_norm(s, w, eps)`` (both s and the norm used)
add_rms_norm_dynamic_quant  ``add_rms_norm`` whose normed output feeds ``dynamic_quant``
add_rms_norm_quant          ``add_rms_norm`` whose normed output feeds ``quantize``
                            (the scale has the weight's shape, like npu_add_rms_norm_quant)
split_qkv_rmsnorm_rope      a qkv split, per-head q/k ``rms_norm`` and ``rotary_embedding``;
                            head_dim 128 and bfloat16 only (vLLM Ascend's kernel limits)
muls_add                    ``x * scale + y`` (and ``y + x * scale``), scale a Python number,
                            x and y of one shape and dtype
==========================  ==============================================================
"""

from __future__ import annotations

import functools
from typing import Any, Iterable, Sequence

import torch

from ascendgraph import ops as _ops  # noqa: F401  (defines torch.ops.ascendgraph.*)
from ascendgraph.compile.passes.fusion import Pattern, PatternFamily, match_value, meta_tensor

__all__ = [
    "DEFAULT_EPS",
    "QKNORM_ROPE_HEAD_DIM",
    "QKNORM_ROPE_DTYPES",
    "rms_norm_family",
    "add_rms_norm_family",
    "add_rms_norm_dynamic_quant_family",
    "add_rms_norm_quant_family",
    "split_qkv_rmsnorm_rope_family",
    "muls_add_family",
    "registered_eps",
]

ag = torch.ops.ascendgraph
aten = torch.ops.aten

# The eps values vLLM Ascend registers its norm patterns for; the model's own is added.
DEFAULT_EPS: tuple[float, ...] = (1e-6, 1e-5)
QKNORM_ROPE_HEAD_DIM = 128
QKNORM_ROPE_DTYPES = (torch.bfloat16,)
_T, _H = 8, 16  # example sizes for tracing (any values: shapes are wildcards or re-checked)
_SCALE_EXAMPLE = 0.375  # traced stand-in for muls_add's scale (a value no pattern uses otherwise)


def _eps_name(eps: float) -> str:
    return f"eps={eps!r}"


def _shape(value: Any) -> tuple[Any, ...]:
    return tuple(value.shape) if isinstance(value, torch.Tensor) else ()


def _same_shape_and_dtype(*values: Any) -> bool:
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if len(tensors) != len(values):
        return False
    first = tensors[0]
    return all(_shape(t) == _shape(first) and t.dtype == first.dtype for t in tensors[1:])


def _weight_fits(weight: Any, x: Any) -> bool:
    return isinstance(weight, torch.Tensor) and isinstance(x, torch.Tensor) and _shape(weight) == _shape(x)[-1:]


# --------------------------------------------------------------------------- rms_norm (decomposed)


def _decomposed_forms(eps: float) -> dict[str, tuple[Any, Any]]:
    """(search, replace) per way of writing RMSNorm out in aten ops."""

    def weight_last(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        return (xf * torch.rsqrt(variance + eps) * weight.float()).to(x.dtype)

    def weight_first(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:  # Hugging Face's LlamaRMSNorm
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        return weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)

    def replace(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return ag.rms_norm.default(x, weight, eps)

    return {"weight_last": (weight_last, replace), "weight_first": (weight_first, replace)}


def _rms_norm_check(match: Any) -> bool:
    x, weight = match_value(match, "x"), match_value(match, "weight")
    output = match.output_node().meta.get("val")
    return (
        _weight_fits(weight, x)
        and x.dtype.is_floating_point
        and isinstance(output, torch.Tensor)
        and output.dtype == x.dtype
        and _shape(output) == _shape(x)
    )


def _rms_norm_examples(dtype: torch.dtype) -> list[torch.Tensor]:
    return [meta_tensor(_T, _H, dtype=dtype), meta_tensor(_H, dtype=dtype)]


def rms_norm_family(eps_values: Iterable[float]) -> PatternFamily:
    """Decomposed RMSNorm -> ``rms_norm``. Traced once in float32 (no casts in the graph) and
    once in bfloat16 (casts to float32 and back; the cast dtypes are wildcards, so float16
    matches too and the check keeps output dtype == input dtype)."""

    def patterns() -> list[Pattern]:
        found = []
        for eps in eps_values:
            for form, (search, replace) in _decomposed_forms(eps).items():
                for dtype, tag in ((torch.float32, "fp32"), (torch.bfloat16, "cast")):
                    found.append(
                        Pattern(
                            name=f"rms_norm[{form},{tag},{_eps_name(eps)}]",
                            search=search,
                            replace=replace,
                            example_inputs=functools.partial(_rms_norm_examples, dtype),
                            check=_rms_norm_check,
                            ignore_types=(torch.dtype,),
                        )
                    )
        return found

    return PatternFamily("rms_norm", (aten.rsqrt.default,), patterns)


# --------------------------------------------------------------------------- add + rms_norm


def _add_rms_norm_fns(eps: float) -> tuple[Any, Any]:
    def search(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> Any:
        total = x + residual
        return ag.rms_norm.default(total, weight, eps), total

    def replace(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor) -> Any:
        out = ag.add_rms_norm.default(x, residual, weight, eps)
        return out[0], out[1]

    return search, replace


def add_rms_norm_family(eps_values: Iterable[float]) -> PatternFamily:
    """``x + r`` then ``rms_norm`` -> ``add_rms_norm`` (outputs: the norm and the sum)."""

    def patterns() -> list[Pattern]:
        found = []
        for eps in eps_values:
            search, replace = _add_rms_norm_fns(eps)
            found.append(
                Pattern(
                    name=f"add_rms_norm[{_eps_name(eps)}]",
                    search=search,
                    replace=replace,
                    example_inputs=lambda: [meta_tensor(_T, _H), meta_tensor(_T, _H), meta_tensor(_H)],
                    check=_add_norm_check,
                )
            )
        return found

    return PatternFamily("add_rms_norm", (ag.rms_norm.default,), patterns)


def _add_norm_check(match: Any) -> bool:
    x, residual, weight = (match_value(match, n) for n in ("x", "residual", "weight"))
    return _same_shape_and_dtype(x, residual) and _weight_fits(weight, x)


# --------------------------------------------------------------------------- add_rms_norm + quant


def _dynamic_quant_fns(eps: float) -> dict[str, tuple[Any, Any]]:
    def search_sum(x: Any, residual: Any, weight: Any) -> Any:
        normed = ag.add_rms_norm.default(x, residual, weight, eps)
        quant = ag.dynamic_quant.default(normed[0])
        return quant[0], normed[1], quant[1]

    def replace_sum(x: Any, residual: Any, weight: Any) -> Any:
        out = ag.add_rms_norm_dynamic_quant.default(x, residual, weight, eps)
        return out[0], out[1], out[2]

    def search_nosum(x: Any, residual: Any, weight: Any) -> Any:
        normed = ag.add_rms_norm.default(x, residual, weight, eps)
        quant = ag.dynamic_quant.default(normed[0])
        return quant[0], quant[1]

    def replace_nosum(x: Any, residual: Any, weight: Any) -> Any:
        out = ag.add_rms_norm_dynamic_quant.default(x, residual, weight, eps)
        return out[0], out[2]

    return {"sum": (search_sum, replace_sum), "nosum": (search_nosum, replace_nosum)}


def add_rms_norm_dynamic_quant_family(eps_values: Iterable[float]) -> PatternFamily:
    """``add_rms_norm`` -> ``dynamic_quant`` of the normed output -> ``add_rms_norm_dynamic_quant``;
    one variant keeps the residual sum (used later), one drops it (unused)."""

    def patterns() -> list[Pattern]:
        found = []
        for eps in eps_values:
            for variant, (search, replace) in _dynamic_quant_fns(eps).items():
                found.append(
                    Pattern(
                        name=f"add_rms_norm_dynamic_quant[{variant},{_eps_name(eps)}]",
                        search=search,
                        replace=replace,
                        example_inputs=lambda: [meta_tensor(_T, _H), meta_tensor(_T, _H), meta_tensor(_H)],
                        check=_add_norm_check,
                    )
                )
        return found

    return PatternFamily("add_rms_norm_dynamic_quant", (ag.dynamic_quant.default,), patterns)


def _quant_check(match: Any) -> bool:
    scale = match_value(match, "scale")
    return _add_norm_check(match) and isinstance(scale, torch.Tensor) and _shape(scale) == _shape(match_value(match, "weight"))


def _static_quant_fns(eps: float) -> dict[str, tuple[Any, Any, int]]:
    def search_sum(x: Any, residual: Any, weight: Any, scale: Any) -> Any:
        normed = ag.add_rms_norm.default(x, residual, weight, eps)
        return ag.quantize.default(normed[0], scale, None), normed[1]

    def replace_sum(x: Any, residual: Any, weight: Any, scale: Any) -> Any:
        out = ag.add_rms_norm_quant.default(x, residual, weight, scale, None, eps)
        return out[0], out[1]

    def search_nosum(x: Any, residual: Any, weight: Any, scale: Any) -> Any:
        normed = ag.add_rms_norm.default(x, residual, weight, eps)
        return ag.quantize.default(normed[0], scale, None)

    def replace_nosum(x: Any, residual: Any, weight: Any, scale: Any) -> Any:
        return ag.add_rms_norm_quant.default(x, residual, weight, scale, None, eps)[0]

    def search_offset_sum(x: Any, residual: Any, weight: Any, scale: Any, offset: Any) -> Any:
        normed = ag.add_rms_norm.default(x, residual, weight, eps)
        return ag.quantize.default(normed[0], scale, offset), normed[1]

    def replace_offset_sum(x: Any, residual: Any, weight: Any, scale: Any, offset: Any) -> Any:
        out = ag.add_rms_norm_quant.default(x, residual, weight, scale, offset, eps)
        return out[0], out[1]

    def search_offset_nosum(x: Any, residual: Any, weight: Any, scale: Any, offset: Any) -> Any:
        normed = ag.add_rms_norm.default(x, residual, weight, eps)
        return ag.quantize.default(normed[0], scale, offset)

    def replace_offset_nosum(x: Any, residual: Any, weight: Any, scale: Any, offset: Any) -> Any:
        return ag.add_rms_norm_quant.default(x, residual, weight, scale, offset, eps)[0]

    return {
        "sum": (search_sum, replace_sum, 4),
        "nosum": (search_nosum, replace_nosum, 4),
        "offset,sum": (search_offset_sum, replace_offset_sum, 5),
        "offset,nosum": (search_offset_nosum, replace_offset_nosum, 5),
    }


def add_rms_norm_quant_family(eps_values: Iterable[float]) -> PatternFamily:
    """``add_rms_norm`` -> ``quantize`` (static scale, optional offset) -> ``add_rms_norm_quant``;
    variants: offset None or a tensor, residual sum kept or dropped."""

    def examples(arity: int) -> list[Any]:
        inputs = [meta_tensor(_T, _H), meta_tensor(_T, _H), meta_tensor(_H), meta_tensor(_H),
                  meta_tensor(_H, dtype=torch.int8)]
        return inputs[:arity]

    def patterns() -> list[Pattern]:
        found = []
        for eps in eps_values:
            for variant, (search, replace, arity) in _static_quant_fns(eps).items():
                found.append(
                    Pattern(
                        name=f"add_rms_norm_quant[{variant},{_eps_name(eps)}]",
                        search=search,
                        replace=replace,
                        example_inputs=functools.partial(examples, arity),
                        check=_quant_check,
                    )
                )
        return found

    return PatternFamily("add_rms_norm_quant", (ag.quantize.default,), patterns)


# --------------------------------------------------------------------------- q/k norm + rope


def _qknorm_rope_fns(
    eps: float, num_heads: int, num_kv_heads: int, head_dim: int, is_neox: bool
) -> tuple[Any, Any]:
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim

    def search(qkv: Any, q_weight: Any, k_weight: Any, positions: Any, cos_sin_cache: Any) -> Any:
        tokens = qkv.shape[0]
        q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
        q = ag.rms_norm.default(q.view(tokens, num_heads, head_dim), q_weight, eps).view(tokens, q_size)
        k = ag.rms_norm.default(k.view(tokens, num_kv_heads, head_dim), k_weight, eps).view(tokens, kv_size)
        q, k = ag.rotary_embedding.default(positions, q, k, cos_sin_cache, head_dim, is_neox)
        return q, k, v

    def replace(qkv: Any, q_weight: Any, k_weight: Any, positions: Any, cos_sin_cache: Any) -> Any:
        out = ag.split_qkv_rmsnorm_rope.default(
            qkv, q_weight, k_weight, positions, cos_sin_cache, q_size, kv_size, head_dim, eps, is_neox
        )
        return out[0], out[1], out[2]

    return search, replace


def split_qkv_rmsnorm_rope_family(
    eps_values: Iterable[float], *, num_heads: int, num_kv_heads: int, head_dim: int, is_neox: bool = True
) -> PatternFamily:
    """qkv split, per-head q/k ``rms_norm``, ``rotary_embedding`` -> ``split_qkv_rmsnorm_rope``.

    The split and view sizes contain num_tokens (symbolic in the graph), so ints are
    wildcards while matching and the check compares every shape with the model's.
    """
    q_size, kv_size = num_heads * head_dim, num_kv_heads * head_dim

    def patterns() -> list[Pattern]:
        found = []
        for eps in eps_values:
            search, replace = _qknorm_rope_fns(eps, num_heads, num_kv_heads, head_dim, is_neox)
            found.append(
                Pattern(
                    name=f"split_qkv_rmsnorm_rope[q={q_size},kv={kv_size},head_dim={head_dim},{_eps_name(eps)}]",
                    search=search,
                    replace=replace,
                    example_inputs=lambda: [
                        meta_tensor(_T, q_size + 2 * kv_size, dtype=torch.bfloat16),
                        meta_tensor(head_dim, dtype=torch.bfloat16),
                        meta_tensor(head_dim, dtype=torch.bfloat16),
                        meta_tensor(_T, dtype=torch.long),
                        meta_tensor(64, head_dim),
                    ],
                    check=_qknorm_check(q_size, kv_size, head_dim),
                    ignore_types=(int, list),
                )
            )
        return found

    return PatternFamily("split_qkv_rmsnorm_rope", (ag.rotary_embedding.default,), patterns)


def _qknorm_check(q_size: int, kv_size: int, head_dim: int) -> Any:
    def check(match: Any) -> bool:
        qkv = match_value(match, "qkv")
        if not isinstance(qkv, torch.Tensor) or qkv.dtype not in QKNORM_ROPE_DTYPES or qkv.dim() != 2:
            return False
        if head_dim != QKNORM_ROPE_HEAD_DIM:
            return False
        tokens = qkv.shape[0]
        for node in match.nodes:
            if node.target is aten.split_with_sizes.default and list(node.args[1]) != [q_size, kv_size, kv_size]:
                return False
            if node.target is ag.rotary_embedding.default and node.args[4] != head_dim:
                return False
            if node.target is ag.rms_norm.default:
                value = node.meta.get("val")
                if not isinstance(value, torch.Tensor) or _shape(value)[-1:] != (head_dim,):
                    return False
            if node.target is aten.view.default:
                value = node.meta.get("val")
                if not isinstance(value, torch.Tensor) or _shape(value)[0] != tokens:
                    return False
        weights = (match_value(match, "q_weight"), match_value(match, "k_weight"))
        return all(isinstance(w, torch.Tensor) and _shape(w) == (head_dim,) for w in weights)

    return check


# --------------------------------------------------------------------------- x * scale + y


def muls_add_family() -> PatternFamily:
    """``x * scale + y`` / ``y + x * scale`` -> ``muls_add(x, y, scale)``; one registration
    serves every scale (the scale is a pattern argument, not a baked-in literal)."""

    def search_mul_first(x: Any, y: Any, scale: float) -> Any:
        return x * scale + y

    def search_mul_last(x: Any, y: Any, scale: float) -> Any:
        return y + x * scale

    def replace(x: Any, y: Any, scale: float) -> Any:
        return ag.muls_add.default(x, y, scale)

    def check(match: Any) -> bool:
        scale = match.kwargs.get("scale")
        x, y = match_value(match, "x"), match_value(match, "y")
        return (
            isinstance(scale, (int, float))
            and not isinstance(scale, bool)
            and _same_shape_and_dtype(x, y)
            and x.dtype.is_floating_point
        )

    def patterns() -> list[Pattern]:
        return [
            Pattern(
                name=f"muls_add[{order}]",
                search=search,
                replace=replace,
                example_inputs=lambda: [meta_tensor(_T, _H), meta_tensor(_T, _H)],
                check=check,
                scalar_workaround={"scale": _SCALE_EXAMPLE},
            )
            for order, search in (("x*scale+y", search_mul_first), ("y+x*scale", search_mul_last))
        ]

    return PatternFamily("muls_add", (aten.mul.Tensor,), patterns)


# --------------------------------------------------------------------------- helpers


def registered_eps(model_eps: float, extra: Sequence[float] = DEFAULT_EPS) -> tuple[float, ...]:
    """The eps values to register patterns for: the model's and vLLM Ascend's defaults, once each."""
    seen: list[float] = []
    for eps in (model_eps, *extra):
        if eps not in seen:
            seen.append(float(eps))
    return tuple(seen)
