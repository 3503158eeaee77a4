"""Half-precision matrix products on the simulator: widened, summed, rounded once.

Theory of operation. An NPU's cube unit multiplies bfloat16 / float16 matrices with a wide
accumulator and rounds the result to the output dtype once. A CPU computes a half-precision
matrix product the same way in principle, but on CPUs without native bfloat16 instructions
(no AVX-512 BF16 / AMX) torch's bfloat16 ``mm`` is slow: single-threaded torch 2.13 on the
AVX2 machine the figures of docs/bench.md come from, a 256 x 512 x 2048 product takes 72 ms in bfloat16, 23 ms
widened to float64 and 12 ms widened to float32, casts included. The graph path and the
eager reference both compute every matmul of every served step, so that was the largest
single item of serving a run.

So the simulator computes a half-precision matrix product widened to **float64**: the inputs
converted, the product (and ``addmm``'s bias) summed in float64, one rounding to the input
dtype. float64, not float32: a product of two bfloat16 / float16 numbers is exact in float64
and a sum of them loses nothing at these sizes, so the rounded result does not depend on the
order of the sum. A float32 BLAS picks another kernel for a batch of 1-3 rows than for a
padded batch of 8 (measured: rows of a 512 x 1536 product differ by one unit in the last
place), which would make a padded graph replay differ from the unpadded eager reference by
the arithmetic alone. With float64 the graph path and eager stay bit-identical where they
compute the same thing, so the comparison with eager still measures what the graph path
changes (padding, fused passes, captured parameters). Against torch's own CPU bfloat16
kernel the results differ by at most one unit in the last place in a few elements.

It applies to the ops of `WIDENED_MATMULS` whose tensor arguments all share one
half-precision dtype; everything else runs as issued. Where:

* eager ops the simulator tracks (`sim.recorder.EagerTracker`: eager serving, the eager
  reference of every step, the planner's measurements);
* graph replays (`sim.capture` builds a replay entry with `widened_call`).

Warm-ups compute nothing (`sim.warmup`) and captures record the op as issued (its meta
outputs are the same).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ascendgraph.kernel_contracts import HALF

__all__ = ["WIDENED_MATMULS", "HALF_DTYPES", "widens", "widened_matmul", "widened_call"]

aten = torch.ops.aten

HALF_DTYPES = frozenset(HALF)  # the contract table's half-precision dtypes

# The matmul overloads computed widened -> the overload that computes their value (an out=
# overload computes with its functional one and copies into ``out``).
WIDENED_MATMULS: dict[Any, Any] = {
    aten.mm.default: aten.mm.default,
    aten.mm.out: aten.mm.default,
    aten.addmm.default: aten.addmm.default,
    aten.addmm.out: aten.addmm.default,
    aten.bmm.default: aten.bmm.default,
    aten.bmm.out: aten.bmm.default,
    aten.baddbmm.default: aten.baddbmm.default,
    aten.baddbmm.out: aten.baddbmm.default,
}


def _half_dtype(args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[torch.dtype]:
    """The one half-precision dtype every tensor argument (and ``out``) has, else None."""
    dtype: Optional[torch.dtype] = None
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            if value.dtype not in HALF_DTYPES or (dtype is not None and value.dtype != dtype):
                return None
            dtype = value.dtype
    return dtype


def widens(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether the simulator computes this call widened (a half-precision matmul of the table)."""
    return func in WIDENED_MATMULS and _half_dtype(args, kwargs) is not None


def widened_matmul(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``func(*args, **kwargs)`` computed in float64 and rounded once (call only when `widens`)."""
    base = WIDENED_MATMULS[func]
    dtype = _half_dtype(args, kwargs)
    wide = [value.double() if isinstance(value, Tensor) else value for value in args]
    out = kwargs.get("out")
    rest = {key: value for key, value in kwargs.items() if key != "out"} if kwargs else {}
    result = base._op(*wide, **rest)
    if out is not None:
        out.copy_(result)
        return out
    return result.to(dtype)


def widened_call(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[Callable[..., Any]]:
    """A replay entry's callable for ``func`` when the simulator computes it widened, else None."""
    if not widens(func, args, kwargs):
        return None

    def call(*call_args: Any, **call_kwargs: Any) -> Any:
        return widened_matmul(func, call_args, call_kwargs)

    call.__name__ = f"widened_{func.__name__.replace('.', '_')}"
    return call
