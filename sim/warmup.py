"""Warm-ups on the simulator: the same kernels, their half-precision matmuls computed in float32.

Theory of operation. Before capturing a size the engine runs warm-up forwards (vLLM's
``_dummy_run`` with ``CUDAGraphMode.NONE``, ``cudagraph_num_of_warmups`` times per size) and
throws their results away. What a warm-up must do on the simulator is issue every kernel
at the size's shapes: the custom kernels check their contracts and initialise lazily
(`sim.kernels`), so a capture without a warm-up is refused as on an NPU (docs/decisions.md "Warm-ups and lazy initialisation").
None of that depends on the values computed.

On a CPU without native bfloat16 matrix units (AVX2: most laptops and CI runners) torch's
bfloat16 and float16 ``mm`` are 5-80x slower than float32 (measured on the reference machine,
torch 2.13: a 256 x 512 x 2048 ``mm`` takes 78 ms in bfloat16, 13 ms in float32), and the
warm-ups' matmuls were half of ``ascendgraph run``'s CPU time. Inside `WarmupMode` the
matrix products on half-precision CPU tensors are computed from float32 copies of their
operands and rounded back to the operand dtype: the same op, the same shapes, dtypes and
output, a few ulps' difference in values that nobody reads. Every other op (the custom
kernels with their contract checks and lazy initialisation, the aliases, the allocations)
runs exactly as without the mode. When another dispatch mode sits below this one (the
simulator's `EagerTracker` pricing the warm-ups on the virtual clock, as the planner's
measurement does, or a test's mode), the op is left alone, so what such a mode sees —
the op, its dtypes, its kernel record — is what it saw before.

Only warm-ups use it (`SimDevice.warmup_scope`), and the engine's first forward at the
largest size, which triggers the Dynamo compile and whose results are discarded too (the
compiled graph is the same under the mode: the mode declares ``ignore_compile_internals``).
Eager serving, the eager reference and replays compute as before, so every figure and
verdict of a run is unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _len_torch_dispatch_stack

__all__ = ["UPCAST_OPS", "WarmupMode", "warmup_scope"]

aten = torch.ops.aten

# Matrix products computed in float32 during warm-ups (their tensor arguments are upcast,
# host scalars such as addmm's beta / alpha are passed through).
UPCAST_OPS = frozenset({aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default})
_HALF = (torch.bfloat16, torch.float16)


def _upcast(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) else value


class WarmupMode(TorchDispatchMode):
    """Runs every op as issued, except half-precision CPU matrix products (float32 copies).

    ``upcast`` counts the products computed in float32 by this mode object."""

    def __init__(self) -> None:
        super().__init__()
        self.upcast = 0

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # The compiled model runs (and would compile) under the mode; its ops still reach us.
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        if func in UPCAST_OPS:
            first = args[0] if args else None
            if (
                isinstance(first, torch.Tensor)
                and first.dtype in _HALF
                and first.device.type == "cpu"
                and "out" not in kwargs
                and _len_torch_dispatch_stack() == 0
            ):
                self.upcast += 1
                result = func(*[_upcast(a) for a in args], **{k: _upcast(v) for k, v in kwargs.items()})
                return result.to(first.dtype)
        return func(*args, **kwargs)


@contextlib.contextmanager
def warmup_scope() -> Iterator[WarmupMode]:
    """Run the block's ops under a `WarmupMode` (for work whose results are discarded)."""
    with WarmupMode() as mode:
        yield mode
