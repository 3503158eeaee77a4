"""A large widened product is computed in two halves of its output columns, one on a helper
thread (sim/matmul.py `split_chunks`): the same bits as the one-piece product, for every
matmul form the simulator widens.

What must hold: every form (mm, addmm with any broadcast bias and alpha/beta, bmm, baddbmm,
their out= overloads), dtype and layout (transposed, strided, inference tensors) gives the
same values, dtype, shape and strides split as in one piece; the split happens only for a
large product while torch has one intra-op thread on a machine with a second core idle
at that instant and autograd records nothing; the caller computes the helper's half itself when the helper has
not started (a busy machine); no thread outlives a product; a forked child and several
Python threads split safely.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import sim.matmul as matmul
from sim.matmul import SPLIT_MIN_WORK, split_chunks, widened_matmul

aten = torch.ops.aten
HALVES = [torch.bfloat16, torch.float16]


def _rand(*shape: int, dtype: torch.dtype, seed: int, spread: float = 0.0, zeros: float = 0.0) -> torch.Tensor:
    """Normal values, times ``2**e`` with ``e`` an integer in ``[-spread, spread]`` (a wide
    dynamic range, where a sum of products is least forgiving), a ``zeros`` fraction of them
    signed zeros (exact zero sums, whose sign is the first thing a kernel change shows)."""
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(shape, generator=gen)
    if spread:
        values = values * torch.exp2(((torch.rand(shape, generator=gen) * 2 - 1) * spread).round())
    if zeros:
        values = torch.where(torch.rand(shape, generator=gen) < zeros, values.sign() * 0.0, values)
    return values.to(dtype)


def _same(split: torch.Tensor, whole: torch.Tensor) -> None:
    """The same bits, but for the sign of an exact zero: BLAS picks it by kernel (the
    unpadded eager reference and a padded batch differ the same way, and compare equal)."""
    assert split.dtype == whole.dtype and split.shape == whole.shape and split.stride() == whole.stride()
    differ = (split.view(torch.int16) != whole.view(torch.int16)) & ~((split == 0) & (whole == 0))
    assert not differ.any(), f"{differ.sum().item()} elements differ"  # bits: NaN (float16 overflow) included


def _both(func, args, kwargs=None):
    kwargs = kwargs or {}
    return widened_matmul(func, args, kwargs, split=True), widened_matmul(func, args, kwargs, split=False)


def _forms(dtype: torch.dtype, m: int = 24, k: int = 96, n: int = 200, b: int = 3):
    """(name, func, args, kwargs) for every widened form, at sizes that fit a unit test."""
    a, w = _rand(m, k, dtype=dtype, seed=1), _rand(n, k, dtype=dtype, seed=2)
    a3, w3 = _rand(b, m, k, dtype=dtype, seed=3), _rand(b, k, n, dtype=dtype, seed=4)
    yield "mm", aten.mm.default, (a, w.t()), {}
    yield "mm contiguous right", aten.mm.default, (a, w.t().contiguous()), {}
    yield "mm transposed left", aten.mm.default, (_rand(k, m, dtype=dtype, seed=5).t(), w.t()), {}
    strided = (_rand(2 * m, k, dtype=dtype, seed=6)[::2], _rand(k, 2 * n, dtype=dtype, seed=7)[:, 1::2])
    yield "mm strided", aten.mm.default, strided, {}
    for bias_shape in [(n,), (m, n), (1, n), (m, 1), (1,), ()]:
        bias = _rand(*bias_shape, dtype=dtype, seed=8)
        yield f"addmm bias {bias_shape}", aten.addmm.default, (bias, a, w.t()), {}
    yield "addmm alpha beta", aten.addmm.default, (_rand(n, dtype=dtype, seed=9), a, w.t()), {"beta": 0.3, "alpha": 1.7}
    yield "bmm", aten.bmm.default, (a3, w3), {}
    yield "bmm transposed", aten.bmm.default, (a3, _rand(b, n, k, dtype=dtype, seed=10).transpose(1, 2)), {}
    for bias_shape in [(b, m, n), (n,), (1, 1, n), (b, 1, n), (m, 1)]:
        bias = _rand(*bias_shape, dtype=dtype, seed=11)
        yield f"baddbmm bias {bias_shape}", aten.baddbmm.default, (bias, a3, w3), {"beta": 0.5, "alpha": 3.0}


@pytest.mark.parametrize("dtype", HALVES)
def test_every_form_splits_to_the_same_bits(dtype):
    for name, func, args, kwargs in _forms(dtype):
        split, whole = _both(func, args, kwargs)
        _same(split, whole)
        assert torch.equal(whole, func._op(*(t.double() for t in args), **kwargs).to(dtype)), name


@pytest.mark.parametrize("dtype", HALVES)
def test_out_overloads_split_into_their_output(dtype):
    for name, func, args, kwargs in _forms(dtype):
        out_func = getattr(func._overloadpacket, "out")
        expected = widened_matmul(func, args, kwargs, split=False)
        target = torch.full_like(expected, float("nan"))
        returned = widened_matmul(out_func, args, {**kwargs, "out": target}, split=True)
        assert returned is target and torch.equal(target, expected), name
        strided = torch.full((*expected.shape[:-1], 2 * expected.shape[-1]), float("nan"), dtype=dtype)[..., ::2]
        widened_matmul(out_func, args, {**kwargs, "out": strided}, split=True)
        assert torch.equal(strided, expected), f"{name}: a non-contiguous out"


def test_inference_tensors_split_to_the_same_bits():
    with torch.inference_mode():
        a, w = _rand(40, 128, dtype=torch.bfloat16, seed=1), _rand(300, 128, dtype=torch.bfloat16, seed=2)
        bias = _rand(300, dtype=torch.bfloat16, seed=3)
        split, whole = _both(aten.addmm.default, (bias, a, w.t()))
    assert split.is_inference() and whole.is_inference()
    _same(split, whole)
    _same(*_both(aten.addmm.default, (bias, a, w.t())))  # inference tensors read outside inference mode


@settings(max_examples=150, deadline=None)
@given(
    dtype=st.sampled_from(HALVES),
    batch=st.sampled_from([0, 1, 2, 5]),
    rows=st.integers(1, 40),
    inner=st.integers(1, 160),
    columns=st.integers(2 * matmul.SPLIT_MIN_CHUNK_COLUMNS, 700),
    spread=st.sampled_from([0.0, 8.0, 24.0]),
    zeros=st.sampled_from([0.0, 0.5, 0.9]),
    bias=st.sampled_from([None, "row", "full"]),
    seed=st.integers(0, 2**16),
)
def test_any_shape_and_dynamic_range_splits_to_the_same_bits(dtype, batch, rows, inner, columns, spread, zeros, bias, seed):
    lead = (batch,) if batch else ()
    left = _rand(*lead, rows, inner, dtype=dtype, seed=seed, spread=spread, zeros=zeros)
    right = _rand(*lead, inner, columns, dtype=dtype, seed=seed + 1, spread=spread, zeros=zeros)
    if bias is None:
        func, args = (aten.bmm.default if batch else aten.mm.default), (left, right)
    else:
        shape = (columns,) if bias == "row" else (*lead, rows, columns)
        func = aten.baddbmm.default if batch else aten.addmm.default
        args = (_rand(*shape, dtype=dtype, seed=seed + 2, spread=spread, zeros=zeros), left, right)
    _same(*_both(func, args))


@pytest.fixture
def one_thread_two_cores(monkeypatch):
    """torch at one intra-op thread (as `ascendgraph run` leaves it) on a two-core machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    monkeypatch.setattr(matmul.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(matmul, "runnable_tasks", lambda: 1)  # this thread alone: a core idles
    yield
    torch.set_num_threads(before)


def _prefill(rows: int = 458, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    return _rand(rows, 512, dtype=dtype, seed=1), _rand(2048, 512, dtype=dtype, seed=2).t()


def test_a_large_product_is_split_and_a_small_one_is_not(one_thread_two_cores, monkeypatch):
    large = _prefill()
    assert matmul.product_work(large[0].shape, large[1].shape) >= SPLIT_MIN_WORK
    assert split_chunks(large) == 8, "2048 columns: eight chunks of 256"
    assert split_chunks(_prefill(rows=1)) == 0, "a decode row: the hand-off costs more than it saves"
    assert split_chunks((large[0], large[1][:, :100])) == 0, "too few columns for two halves"
    assert split_chunks((large[0][:, :500], large[1])) == 0, "ill-formed: the op raises its own error, unsplit"
    assert split_chunks((_rand(3, 458, dtype=torch.bfloat16, seed=1), *large)) == 0, "bias not broadcastable"
    grad = large[1].detach().requires_grad_()
    assert split_chunks((large[0], grad)) == 0, "autograd records the product"
    with torch.no_grad():
        assert split_chunks((large[0], grad)) == 8
    torch.set_num_threads(2)
    assert split_chunks(large) == 0, "torch's own threads already use the cores"
    torch.set_num_threads(1)
    monkeypatch.setattr(matmul, "runnable_tasks", lambda: 2)
    assert split_chunks(large) == 0, "no idle core now (another process runs): the helper would take turns"
    monkeypatch.setattr(matmul, "runnable_tasks", lambda: None)
    assert split_chunks(large) == 8, "where the machine cannot tell, the cores decide"
    monkeypatch.setattr(matmul.os, "sched_getaffinity", lambda pid: {0})
    assert split_chunks(large) == 0, "one core: nothing to gain"


def test_the_default_splits_a_large_product_on_a_helper_thread(one_thread_two_cores, monkeypatch):
    started = []
    real = matmul._thread.start_new_thread

    def spy(function, args):
        started.append(function)
        return real(function, args)

    monkeypatch.setattr(matmul._thread, "start_new_thread", spy)
    large = _prefill()
    _same(widened_matmul(aten.mm.default, large, {}), widened_matmul(aten.mm.default, large, {}, split=False))
    assert len(started) == 1
    widened_matmul(aten.mm.default, _prefill(rows=1), {})
    assert len(started) == 1, "a small product runs in one piece on the calling thread"


def test_the_caller_computes_every_chunk_when_the_helper_has_not_started(monkeypatch):
    late = []
    monkeypatch.setattr(matmul._thread, "start_new_thread", lambda function, args: late.append(args[0]))
    large = _prefill(rows=64)
    _same(widened_matmul(aten.mm.default, large, {}, split=True), widened_matmul(aten.mm.default, large, {}, split=False))
    assert len(late) == 1
    late[0].run_helper()  # the helper, starting late, finds nothing left
    assert late[0]._back == len(late[0]._parts), "it claimed no chunk"


def test_the_caller_and_the_helper_share_the_chunks():
    large = _prefill(rows=128)
    parts = [slice(start, start + 256) for start in range(0, 2048, 256)]
    by: dict[int, str] = {}
    wide = large[0].double()

    def compute(part: slice) -> torch.Tensor:
        by[part.start] = threading.current_thread().name
        time.sleep(0.002)  # long enough for the other side to take chunks of its own
        return (wide @ large[1][:, part].double()).bfloat16()

    work = matmul._Chunks(compute, parts)
    helper = threading.Thread(target=work.run_helper, name="helper")
    helper.start()
    values = work.run_here()
    helper.join()
    _same(torch.cat(values, dim=-1), widened_matmul(aten.mm.default, large, {}, split=False))
    assert sorted(by) == [p.start for p in parts]
    front = [start for start, name in sorted(by.items()) if name != "helper"]
    back = [start for start, name in sorted(by.items()) if name == "helper"]
    assert front and back and max(front) < min(back), "the caller from the front, the helper from the back"


def test_an_error_on_the_helper_thread_is_raised_on_the_caller():
    def fail(part):
        if threading.current_thread().name == "helper":
            raise MemoryError("simulated: the helper's chunk could not be allocated")
        return torch.zeros(1)

    work = matmul._Chunks(fail, [slice(0, 1), slice(1, 2)])
    helper = threading.Thread(target=work.run_helper, name="helper")
    helper.start()
    helper.join()
    with pytest.raises(MemoryError, match="helper's chunk"):
        work.run_here()


def _os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_no_thread_outlives_a_split_product():
    before_python, before_os = set(threading.enumerate()), _os_threads()
    for _ in range(5):
        widened_matmul(aten.mm.default, _prefill(rows=64), {}, split=True)
    assert set(threading.enumerate()) == before_python
    deadline = time.monotonic() + 5.0
    while _os_threads() > before_os and time.monotonic() < deadline:  # a helper returns right after its half
        time.sleep(0.01)
    assert _os_threads() <= before_os


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads through /proc")
def test_the_helpers_kernels_run_on_the_helper_alone(one_thread_two_cores):
    # MKL's default is a thread team per core for a thread torch has not initialised: the
    # helper would then run threads of its own beside the caller (seen once it is done).
    large = _prefill(rows=256)
    wide, right = large[0].double(), large[1].double()  # the helper's first torch call is a float64 mm
    work = matmul._Chunks(lambda part: torch.mm(wide, right[:, part]), [slice(0, 1024), slice(1024, 2048)])
    seen = []

    def helper() -> None:
        matmul._helper(work)
        seen.append(_os_threads())

    before = _os_threads()
    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert work._back == 0, "the helper computed every chunk"
    assert seen == [before + 1], "the caller's threads and the helper, no thread team of the helper's"


@pytest.mark.skipif(not os.path.isfile("/proc/loadavg"), reason="reads /proc/loadavg")
def test_the_runnable_tasks_count_this_thread_and_a_busy_process():
    import subprocess
    import sys

    assert matmul.runnable_tasks() >= 1, "the calling thread runs"
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        seen, deadline = 0, time.monotonic() + 10.0
        while seen < 2 and time.monotonic() < deadline:  # the busy process is runnable once started
            seen = max(seen, matmul.runnable_tasks() or 0)
        assert seen >= 2
    finally:
        busy.kill()
        busy.wait()


def test_several_python_threads_split_at_once():
    products = [_prefill(rows=rows) for rows in (40, 64, 96, 128)]
    expected = [widened_matmul(aten.mm.default, p, {}, split=False) for p in products]
    results: dict[int, list[bool]] = {}

    def serve(index: int) -> None:
        results[index] = [torch.equal(widened_matmul(aten.mm.default, products[index], {}, split=True), expected[index])
                          for _ in range(5)]

    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(products))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {i: [True] * 5 for i in range(len(products))}


def _child_product(queue) -> None:
    a, b = _prefill(rows=64)
    queue.put(torch.equal(widened_matmul(aten.mm.default, (a, b), {}, split=True),
                          widened_matmul(aten.mm.default, (a, b), {}, split=False)))


@pytest.mark.skipif("fork" not in multiprocessing.get_all_start_methods(), reason="needs fork")
def test_a_child_forked_after_split_products_splits_too(one_thread_two_cores):
    # Forked at one intra-op thread, as `ascendgraph run` leaves torch (a child forked after
    # torch's OpenMP pool ran with more threads can hang in torch itself, split or not).
    widened_matmul(aten.mm.default, _prefill(rows=64), {}, split=True)
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child_product, args=(queue,))
    child.start()
    child.join(timeout=60)
    assert child.exitcode == 0 and queue.get(timeout=5) is True


def test_without_an_affinity_mask_the_machines_core_count_decides(one_thread_two_cores, monkeypatch):
    """macOS has no os.sched_getaffinity: the split asks os.cpu_count() instead of failing."""
    large = _prefill()
    monkeypatch.delattr(matmul.os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(matmul, "runnable_tasks", lambda: None)
    monkeypatch.setattr(matmul.os, "cpu_count", lambda: 2)
    assert split_chunks(large) == 8
    monkeypatch.setattr(matmul.os, "cpu_count", lambda: 1)
    assert split_chunks(large) == 0


def test_only_host_tensors_are_split(one_thread_two_cores):
    """Device tensors (the facade's npu, here meta) keep the issuing thread's device state: one piece."""
    large = _prefill()
    assert split_chunks(large) == 8
    assert split_chunks(tuple(value.to("meta") for value in large)) == 0
    assert split_chunks((large[0].to("meta"), large[1])) == 0


def test_tensor_subclasses_are_not_split(one_thread_two_cores):
    """A subclass with a dispatch of its own (the graph pool's weak references) may read per-thread
    state: one piece. Parameters have none and still split."""

    class Traced(torch.Tensor):
        pass

    left, right = _prefill()
    assert split_chunks((left.as_subclass(Traced), right)) == 0
    assert split_chunks((left, torch.nn.Parameter(right, requires_grad=False))) == 8


def test_an_error_on_the_callers_chunk_stops_the_helper_and_awaits_its_chunk():
    """The caller fails (an error, Ctrl-C) while the helper computes: the helper claims nothing
    more, and the error leaves only once the helper's chunk in progress is done."""
    helper_started, release = threading.Event(), threading.Event()
    computed: list[str] = []

    def compute(part):
        who = threading.current_thread().name
        if who == "helper":
            helper_started.set()
            release.wait(5)
            computed.append(f"helper {part.start}")
            return torch.zeros(1)
        helper_started.wait(5)
        threading.Timer(0.05, release.set).start()
        raise KeyboardInterrupt

    work = matmul._Chunks(compute, [slice(i, i + 1) for i in range(6)])
    helper = threading.Thread(target=work.run_helper, name="helper")
    helper.start()
    with pytest.raises(KeyboardInterrupt):
        work.run_here()
    assert computed == ["helper 5"], "the chunk in progress finished before the error left; no other was claimed"
    helper.join(5)
    assert not helper.is_alive() and computed == ["helper 5"]


def test_a_helper_that_cannot_start_leaves_the_caller_the_whole_product(monkeypatch):
    def refuse(*args):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(matmul._thread, "start_new_thread", refuse)
    args = _prefill(rows=64)
    _same(widened_matmul(aten.mm.default, args, {}, split=True), widened_matmul(aten.mm.default, args, {}, split=False))
