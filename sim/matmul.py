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

Two cores for one product. `ascendgraph run` leaves torch one intra-op thread
(ascendgraph/runtime/threads.py: the simulator's many small ops are faster that way), so on
a two-core machine one core idles while a large widened product runs. `split_chunks` picks
the products worth splitting: torch at one intra-op thread (with more, torch's own threads
already use the cores), at least two cores for this process and fewer tasks runnable at this
instant than it has cores (`runnable_tasks`: on a busy machine, a pytest-xdist worker per
core, the helper would only take turns with the caller, and the hand-off measured 2-9 %
slower than one piece), nothing for autograd to record, host tensors (a simulated npu's ops depend on the issuing
thread's device state), and at least `SPLIT_MIN_WORK`
float64 multiply-adds (`product_work`: the product plus the
widening of its right operand, the larger cost of a decode batch). Such a product's output
columns are cut into chunks (`SPLIT_CHUNK_COLUMNS` wide, two to `SPLIT_MAX_CHUNKS`); the
calling thread computes chunks from the front while a helper thread computes chunks from the
back, each widening its chunk of the right operand (torch releases the GIL inside its kernels
and conversions), until none is left; the rounded chunks are concatenated. Each output
element is the same float64 sum of the same exact products whichever columns share its call,
so a split product has the one-piece product's values, bit for bit but for the sign of an
exact zero, which BLAS picks by kernel (the unpadded eager reference and a padded batch
differ the same way, and compare equal); no chunk is narrower than `SPLIT_MIN_CHUNK_COLUMNS`.
tests/sim/test_matmul_split.py checks every form, dtype and layout, and random shapes over a
wide dynamic range. Below the threshold the hand-off (about 60 us to start a thread) costs
more than the second core saves (bench/bench_matmul.py measures both sides).

The helper is a plain OS thread started for the one product (`_thread`, so it never appears
in `threading.enumerate()`) that returns as soon as no chunk is left: nothing lives between
products, so there is no pool to re-create after ``fork``, nothing to shut down, and engines
on several Python threads each split their own products. It never changes torch's thread
count (the engine's `ThreadLease` owns it): it asks torch for it first, which sets the new
thread's OpenMP / MKL count to torch's one (`_helper`). On a busy machine the helper may
start late or lose its core for a while, when another process woke after the check: the
caller takes the chunks it has not claimed
(`_Chunks`), so a split product waits for the helper's one chunk in progress at most, and a
helper that never got a core leaves the caller to compute the product alone, as does a thread
that cannot be started (a thread limit). When the caller's own chunk fails (an error, Ctrl-C),
the helper claims nothing more and its chunk in progress is awaited before the error goes on,
so no helper computes after the call. The idle-core check reads the host's run queue and the
affinity mask: a container's CPU quota is not seen there, and a split under a one-core quota
gives the same values, only no faster.
"""

from __future__ import annotations

import _thread
import os
import threading
from typing import Any, Callable, Optional, Sequence

import torch
from torch import Tensor

from ascendgraph.kernel_contracts import HALF

__all__ = [
    "WIDENED_MATMULS", "HALF_DTYPES", "SPLIT_MIN_WORK", "widens", "widened_matmul", "widened_call", "split_chunks",
    "product_work", "runnable_tasks",
]

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

# Splitting a product across two threads (`split_chunks`; measured in bench/bench_matmul.py):
CONVERSION_MULTIPLY_ADDS = 12  # widening one half-precision element costs about 12 float64 multiply-adds
SPLIT_MIN_WORK = 16 * 512 * 2048  # below this a thread hand-off costs more than it saves
SPLIT_MIN_CHUNK_COLUMNS = 64  # each chunk this many output columns or more (see the theory of operation)
SPLIT_CHUNK_COLUMNS = 256  # the chunk width aimed at
SPLIT_MAX_CHUNKS = 8


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


def widened_matmul(func: Any, args: Sequence[Any], kwargs: dict[str, Any], *, split: Optional[bool] = None) -> Any:
    """``func(*args, **kwargs)`` computed in float64 and rounded once (call only when `widens`).

    ``split``: None computes a large product's output columns in chunks on two threads when
    `split_chunks` says so; True splits any well-formed product of two chunks' columns or
    more, whatever its size and the machine; False computes in one piece. All three give the
    same values (tests/sim/test_matmul_split.py).
    """
    base = WIDENED_MATMULS[func]
    dtype = _half_dtype(args, kwargs)
    assert dtype is not None, "widened_matmul: call it only for a product `widens` accepts"
    out = kwargs.get("out")
    rest = {key: value for key, value in kwargs.items() if key != "out"} if kwargs else {}
    chunks = split_chunks(args) if split is None else _chunks(args) if split else 0
    if chunks:
        result = _split_product(base, args, rest, dtype, chunks)
        if out is not None:
            out.copy_(result)
            return out
        return result
    wide = [value.double() if isinstance(value, Tensor) else value for value in args]
    result = base._op(*wide, **rest)
    if out is not None:
        out.copy_(result)
        return out
    return result.to(dtype)


def split_chunks(args: Sequence[Any]) -> int:
    """Into how many column chunks a product is split across two threads (0: one piece).

    Split host tensors (not the simulated npu's: `_chunks`) when the process leaves torch one intra-op thread (`ascendgraph run`: the second
    core idles otherwise), this process may run on two cores or more and one of them is idle
    now (`runnable_tasks`), autograd records nothing, the operands are a well-formed product
    (`_chunks`) and its work (`product_work`) is at least `SPLIT_MIN_WORK`.
    """
    chunks = _chunks(args)
    if not chunks or product_work(args[-2].shape, args[-1].shape) < SPLIT_MIN_WORK:
        return 0
    if torch.is_grad_enabled() and any(value.requires_grad for value in args):
        return 0
    cores = _usable_cores()
    if torch.get_num_threads() != 1 or cores < 2:
        return 0
    runnable = runnable_tasks()
    if runnable is not None and runnable >= cores:
        return 0  # no idle core now: a helper would only take turns with this thread
    return chunks


def _usable_cores() -> int:
    """The cores this process may run on: its affinity mask on Linux, the machine's count
    where the OS has no such mask (macOS)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def runnable_tasks() -> Optional[int]:
    """How many tasks the machine could run at this instant, the calling thread included
    (Linux: the fourth field of /proc/loadavg, ``running/total``); None where unknown."""
    try:
        with open("/proc/loadavg", "rb") as handle:
            return int(handle.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        return None


_PLAIN_TENSOR_TYPES = (Tensor, torch.nn.Parameter)  # no dispatch of their own: safe on any thread


def _chunks(args: Sequence[Any]) -> int:
    """How many column chunks (`SPLIT_CHUNK_COLUMNS` wide, two to `SPLIT_MAX_CHUNKS`) when
    ``args`` are a well-formed ``mm`` / ``bmm`` (``addmm`` / ``baddbmm``: a bias broadcastable
    to the output first) of host tensors of two `SPLIT_MIN_CHUNK_COLUMNS` or more; else 0 (an
    ill-formed call runs in one piece and raises the op's own error)."""
    if len(args) not in (2, 3) or not all(isinstance(value, Tensor) for value in args):
        return 0
    if any(type(value) not in _PLAIN_TENSOR_TYPES or value.device.type != "cpu" for value in args):
        # Host tensors only. A graph replay on the simulated npu (the facade) computes its
        # products on npu tensors, whose ops consult the issuing thread's device state (context
        # variables such as the replay in progress, the current stream and pool), which a helper
        # thread does not share: split there, FULL-graph replays differed from eager
        # (tests/npu/test_engine_npu.py under `--npu-facade`). Tensor subclasses the same (the
        # graph pool's weak references read the replay in progress from a context variable).
        return 0
    left, right = args[-2], args[-1]
    if left.dim() != right.dim() or left.dim() not in (2, 3) or left.shape[-1] != right.shape[-2]:
        return 0
    if left.dim() == 3 and left.shape[0] != right.shape[0]:
        return 0
    columns = right.shape[-1]
    if columns < 2 * SPLIT_MIN_CHUNK_COLUMNS:
        return 0
    if len(args) == 3 and not _broadcasts_to(args[0].shape, (*left.shape[:-1], columns)):
        return 0
    return max(2, min(SPLIT_MAX_CHUNKS, columns // SPLIT_CHUNK_COLUMNS))


def product_work(left_shape: Sequence[int], right_shape: Sequence[int]) -> int:
    """A widened product's cost in float64 multiply-adds: the product itself plus the
    conversion of the right operand (`CONVERSION_MULTIPLY_ADDS` per element)."""
    batch = left_shape[0] if len(left_shape) == 3 else 1
    rows, inner, columns = left_shape[-2], left_shape[-1], right_shape[-1]
    return batch * inner * columns * (rows + CONVERSION_MULTIPLY_ADDS)


def _broadcasts_to(shape: Sequence[int], target: Sequence[int]) -> bool:
    try:
        return tuple(torch.broadcast_shapes(tuple(shape), tuple(target))) == tuple(target)
    except RuntimeError:
        return False


def _split_product(base: Any, args: Sequence[Any], rest: dict[str, Any], dtype: torch.dtype, chunks: int) -> Tensor:
    """The product rounded to ``dtype``, its output columns in ``chunks`` chunks that this
    thread takes from the front and a helper thread from the back (`_Chunks`)."""
    *bias, left, right = args
    columns = right.shape[-1]
    left_wide = left.double()  # shared by every chunk (read only)
    width = max(SPLIT_MIN_CHUNK_COLUMNS, columns // chunks // SPLIT_MIN_CHUNK_COLUMNS * SPLIT_MIN_CHUNK_COLUMNS)
    starts = list(range(0, columns - SPLIT_MIN_CHUNK_COLUMNS + 1, width))  # the last chunk takes the rest
    parts = [slice(start, end) for start, end in zip(starts, [*starts[1:], columns])]

    def compute(part: slice) -> Tensor:
        wide = [b[..., part].double() if b.dim() and b.shape[-1] == columns and columns > 1 else b.double() for b in bias]
        return base._op(*wide, left_wide, right[..., part].double(), **rest).to(dtype)

    work = _Chunks(compute, parts)
    try:
        _thread.start_new_thread(_helper, (work,))
    except RuntimeError:  # "can't start new thread" (a thread or pid limit): the caller computes every chunk
        pass
    return torch.cat(work.run_here(), dim=-1)


def _helper(work: "_Chunks") -> None:
    """A helper thread's body. Asking torch its thread count first initialises the new thread's
    OpenMP / MKL count from torch's (one): MKL would otherwise start a thread team of its own
    for the helper's products (its default is one thread per core)."""
    torch.get_num_threads()
    work.run_helper()


class _Chunks:
    """A split product's column chunks: the calling thread claims them from the front, the
    helper from the back, one at a time, until none is left; so on a busy machine, where the
    helper may start late or lose its core for a while, the caller waits for one chunk at most."""

    def __init__(self, compute: Callable[[slice], Tensor], parts: list[slice]) -> None:
        self._compute = compute
        self._parts = parts
        self._values: list[Optional[Tensor]] = [None] * len(parts)
        self._front, self._back = 0, len(parts)  # the unclaimed chunks: [front, back)
        self._helper_busy = False
        self._error: Optional[BaseException] = None
        self._cancelled = False  # the caller failed: the helper claims nothing more
        self._changed = threading.Condition(threading.Lock())

    def _claim(self, front: bool) -> Optional[int]:
        with self._changed:
            if self._front >= self._back or self._error is not None or self._cancelled:
                return None
            if front:
                self._front += 1
                return self._front - 1
            self._back -= 1
            self._helper_busy = True
            return self._back

    def run_helper(self) -> None:
        """The helper's loop: compute chunks from the back until none is left."""
        try:
            with torch.no_grad():
                while (index := self._claim(front=False)) is not None:
                    value = self._compute(self._parts[index])
                    with self._changed:
                        self._values[index] = value
                        self._helper_busy = False
                        self._changed.notify_all()
        except BaseException as error:  # re-raised on the calling thread
            with self._changed:
                self._error = error
                self._helper_busy = False
                self._changed.notify_all()

    def run_here(self) -> list[Tensor]:
        """The caller's loop: chunks from the front, then the helper's last one awaited. When the
        caller's own chunk fails (an error, Ctrl-C), the helper is told to stop and its chunk in
        progress awaited before the error goes on: no helper computes after the call returned."""
        try:
            while (index := self._claim(front=True)) is not None:
                self._values[index] = self._compute(self._parts[index])
        except BaseException:
            with self._changed:
                self._cancelled = True
                while self._helper_busy:
                    self._changed.wait()
            raise
        with self._changed:
            while self._helper_busy:
                self._changed.wait()
            if self._error is not None:
                raise self._error
        values = [value for value in self._values if value is not None]
        assert len(values) == len(self._values)
        return values


def widened_call(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Optional[Callable[..., Any]]:
    """A replay entry's callable for ``func`` when the simulator computes it widened, else None."""
    if not widens(func, args, kwargs):
        return None

    def call(*call_args: Any, **call_kwargs: Any) -> Any:
        return widened_matmul(func, call_args, call_kwargs)

    call.__name__ = f"widened_{func.__name__.replace('.', '_')}"
    return call
