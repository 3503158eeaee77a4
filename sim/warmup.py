"""Warm-ups on the simulator: every kernel launched at its shapes, nothing computed.

Theory of operation. Before capturing a size the engine runs warm-up forwards (vLLM's
``_dummy_run`` with ``CUDAGraphMode.NONE``, ``cudagraph_num_of_warmups`` times per size) and
throws their results away. What a warm-up must do on the simulator is issue every kernel
at the size's shapes: the custom kernels check their contracts and initialise lazily
(`sim.kernels`), so a capture of a shape never warmed up is refused as on an NPU (see
docs/simulator.md, "lazy kernel initialisation"). None of that depends on the values computed, and computing
them was most of a run's CPU time (70 eager forwards of the default run, bfloat16 matrix
products on CPUs without native bfloat16).

So a warm-up *marks* instead of computing. Inside `WarmupMode` each op goes through the
same dispatch as an eager launch and is handled by its capture class (`sim.recorder`):

=====================  ==============================================================
op                     what the warm-up does
=====================  ==============================================================
wrapper op             re-enters its Python implementation (the kernels it issues are
                       what the mode sees, as in a capture)
alias / host work /    runs as issued (no kernel; an allocation is the allocator's
allocation             state a warm-up exists to set up)
checked custom kernel  its contract is checked and its shape marked initialised on
                       every live device (`sim.kernels.on_eager_launch`, what the CPU
                       kernel does first when it runs; once per call signature in a
                       warm-up) — then handled as below
factory kernel         (no tensor argument: ``zeros``, ``full``, ``arange``) runs for real:
                       a constant that code may read as a value, and cheap
kernel                 *shape-only*: its outputs are computed on the meta device
                       (`sim.recorder.meta_outputs`, memoised) and handed back as
                       uninitialised tensors of those sizes, strides and dtypes; an
                       in-place or out= kernel writing only into such tensors is skipped
kernel writing into    runs for real (``executed``): the tensor existed before the
a tensor from before   warm-up (an input buffer, a KV cache), so what it holds after
the warm-up            the warm-up stays what an eager warm-up leaves there
host sync, RNG,        runs for real (they need values); none is issued by a model
dynamic shape, no      forward the engine warms up
meta kernel
=====================  ==============================================================

A shape-only tensor holds garbage: only the sizes are meaningful, which is all a warm-up's
results are used for (they are discarded). What the engine writes into persistent tensors
during a warm-up is padding (slot -1: no KV-cache write), so the state after a warm-up is
the state after an eager one, and a run's report is unchanged but for timings.

When another dispatch mode is active below this one (the simulator's `EagerTracker`
pricing the warm-ups on the virtual clock, as the planner's measurement does, or a test's
mode) the op runs as issued, so what such a mode sees — the op, its outputs, its kernel
record — is what an eager warm-up shows it.

Only warm-ups use it (`SimDevice.warmup_scope`), and the engine's first forward at the
largest size, which triggers the Dynamo compile and whose results are discarded too (the
compiled graph is the same under the mode: the mode declares ``ignore_compile_internals``).
Eager serving, the eager reference and replays compute as before.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, Optional

import torch
from torch import Tensor
from torch.utils._python_dispatch import _len_torch_dispatch_stack

from sim import kernels
from sim.capture import materialize
from sim.recorder import ALIAS, ALLOC, HOST, OP, OpInfo, _Mode, call_signature, classify

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["WarmupMode", "warmup_scope"]


def _storage_key(tensor: Tensor) -> Optional[int]:
    """The address of a tensor's storage (None for storage-less tensors: meta, empty)."""
    if tensor.is_meta:
        return None
    try:
        pointer = tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return pointer or None


def _tensors(value: Any) -> Iterator[Tensor]:
    if isinstance(value, Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


_NO_TENSOR, _ON_CPU, _ELSEWHERE = range(3)


def _placement(args: tuple, kwargs: dict) -> int:
    """Whether a call has tensor arguments, and whether they are all on the CPU (one flat
    pass over the arguments: this runs for every kernel of every warm-up)."""
    found = _NO_TENSOR
    stack: list[Any] = [args]
    if kwargs:
        stack.append(tuple(kwargs.values()))
    while stack:
        for item in stack.pop():
            if isinstance(item, Tensor):
                if not item.is_cpu:
                    return _ELSEWHERE
                found = _ON_CPU
            elif isinstance(item, (list, tuple)):
                stack.append(item)
    return found


class WarmupMode(_Mode):
    """Warm-up dispatch: kernels marked and shaped, not computed (see the module table).

    Counters (per mode object): ``shape_only`` kernels whose outputs were only shaped,
    ``skipped`` in-place kernels writing only into shape-only tensors, ``executed`` ops run
    for real, ``marked`` checked-kernel launches marked initialised."""

    def __init__(self, device: Optional["SimDevice"] = None) -> None:
        super().__init__()
        self.device = device
        self.shape_only = 0
        self.skipped = 0
        self.executed = 0
        self.marked = 0
        self._ops: dict[Any, OpInfo] = {}
        self._launched: dict[tuple, bool] = {}  # (policy, call signature) -> a checked kernel (`_launch`)
        # Storages made inside this warm-up (shape-only outputs, allocations): writes into
        # them may be skipped. A storage alive before the warm-up never has one of these
        # addresses (an address is not reused while its storage lives).
        self._fresh: set[int] = set()

    def _info(self, func: Any) -> OpInfo:
        if self.device is not None:
            return self.device.op_info(func)
        info = self._ops.get(func)
        if info is None:
            info = self._ops[func] = classify(func)
        return info

    def _note_fresh(self, value: Any) -> None:
        for tensor in _tensors(value):
            key = _storage_key(tensor)
            if key is not None:
                self._fresh.add(key)

    def _allocate(self, meta: Tensor) -> Tensor:
        real = torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device="cpu")
        pointer = real.untyped_storage().data_ptr()  # `_note_fresh` for one CPU tensor
        if pointer:
            self._fresh.add(pointer)
        return real

    def _writes_outside(self, info: OpInfo, args: tuple, kwargs: dict) -> bool:
        """Whether a mutating op writes into a tensor that existed before the warm-up."""
        for index in info.written:
            for tensor in _tensors(info.argument(index, args, kwargs)):
                key = _storage_key(tensor)
                if key is not None and key not in self._fresh:
                    return True
        return False

    def _launch(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """`sim.kernels.on_eager_launch`, once per call signature and contract policy in this
        warm-up: the contract is a function of the arguments' sizes, strides, dtypes and host
        values (`sim.recorder.call_signature`), and marking a shape initialised again changes
        nothing (the layers of a forward issue the same kernels at the same shapes)."""
        key = call_signature(func, args, kwargs)
        if key is not None:
            key = (id(kernels.current_policy()), key)
            try:
                known = self._launched.get(key)
            except TypeError:  # a symbolic size
                key, known = None, None
            if known is not None:
                return known
        checked = kernels.on_eager_launch(func, args, kwargs)
        if key is not None:
            self._launched[key] = checked
        return checked

    def _run(self, func: Any, args: tuple, kwargs: dict) -> Any:
        self.executed += 1
        return func(*args, **kwargs)

    def handle(self, func: Any, args: Any, kwargs: dict) -> Any:
        if _len_torch_dispatch_stack() != 0:  # a mode below sees every op as issued
            return func(*args, **kwargs)
        info = self._info(func)
        kind = info.kind
        if kind == ALIAS or kind == HOST:
            return func(*args, **kwargs)
        if kind == ALLOC:
            out = func(*args, **kwargs)
            self._note_fresh(out)
            return out
        if kind != OP:
            return self._run(func, args, kwargs)
        placement = _placement(args, kwargs)
        if placement is not _ON_CPU:
            # NO_TENSOR: a factory (zeros, full, arange): a constant code may read, cheap to make.
            # ELSEWHERE: meta tensors (the planner): nothing to save.
            return self._run(func, args, kwargs)
        if self._launch(func, args, kwargs):
            self.marked += 1
        if info.mutating and self._writes_outside(info, args, kwargs):
            return self._run(func, args, kwargs)
        made = materialize(info, args, kwargs, self._allocate)
        if made is None:
            return self._run(func, args, kwargs)
        if info.mutating and not any(d is not None for d in made[1]):
            self.skipped += 1
        else:
            self.shape_only += 1
        return made[0]


@contextlib.contextmanager
def warmup_scope(device: Optional["SimDevice"] = None) -> Iterator[WarmupMode]:
    """Run the block's ops under a `WarmupMode` (for work whose results are discarded)."""
    with WarmupMode(device) as mode:
        yield mode
