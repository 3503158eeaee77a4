"""The device conformance suite: behaviours every ascendgraph device must show.

Each case is a test function taking a ``device`` fixture and tagged ``ALL`` (run on every
backend) or ``sim_only(reason)`` (the simulator only; the reason says why hardware
cannot run it — INTERFACES.md "Conformance cases on hardware"). `case` parametrises the
``device`` fixture over ``sim`` and ``npu`` (the npu parameter carries the ``npu`` marker,
so the default run keeps sim and ``-m npu`` keeps npu). Collect the suite by importing
its cases into a test module::

    from ascendgraph.testing.conformance import *  # noqa: F401,F403

Cases use only the `ascendgraph.device.Device` protocol, plus ``device.stats()`` and,
in sim-only cases, the simulator's options (``set_fault_plan``, ``env``...). Texts are
asserted where the device owns them (torch_npu's §12 texts) and, for conditions the
ACL runtime reports in CANN-dependent words, only on the simulator.
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import pytest
import torch

from ascendgraph import errors, ops
from ascendgraph.errors import (
    CAPTURE_END_BEFORE_BEGIN,
    CAPTURE_END_OTHER_STREAM,
    DEFAULT_STREAM_CAPTURE,
    GRAPH_ALREADY_CAPTURED,
    POOL_BEFORE_CAPTURE,
    REPLAY_BEFORE_CAPTURE,
    TASK_QUEUE_2_DURING_CAPTURE,
    DeviceLost,
    GraphHang,
    OldHdkStack,
    StreamResourceExhausted,
    rewrite_capture_error,
)
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget

__all__ = ["ALL", "SimOnly", "sim_only", "case", "CASES", "BACKEND_NAMES"]

BACKEND_NAMES = ("sim", "npu")


@dataclass(frozen=True)
class SimOnly:
    reason: str


ALL = "all"


def sim_only(reason: str) -> SimOnly:
    return SimOnly(reason)


CASES: dict[str, Any] = {}


def case(tag: Any) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a conformance case and parametrise its ``device`` over the backends."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        npu_marks: list[Any] = [pytest.mark.npu]
        if isinstance(tag, SimOnly):
            npu_marks.append(pytest.mark.skip(reason=f"sim only: {tag.reason}"))
        elif tag != ALL:
            raise ValueError(f"conformance tag must be ALL or sim_only(reason), got {tag!r}")
        params = [pytest.param("sim", id="sim"), pytest.param("npu", id="npu", marks=npu_marks)]
        fn.conformance_tag = tag  # type: ignore[attr-defined]
        wrapped = pytest.mark.parametrize("device", params, indirect=True)(fn)
        CASES[fn.__name__] = wrapped
        return wrapped

    return decorate


# --------------------------------------------------------------------------- helpers


def _is_sim(device: Any) -> bool:
    return getattr(device, "name", "") == "sim"


def _tensor(device: Any, *shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device=device.torch_device, dtype=dtype)


def _capture(device: Any, fn: Callable[[], Any], **graph_options: Any) -> tuple[Any, Any]:
    graph = device.new_graph()
    with device.graph(graph, **graph_options):
        out = fn()
    return graph, out


def _raises_text(device: Any, exc: pytest.ExceptionInfo, text: str) -> None:
    """Hardware appends codes and context to torch_npu's texts: check containment."""
    assert text in str(exc.value), f"expected {text!r} in {str(exc.value)!r}"


def _assert_clean(device: Any, before: Any) -> None:
    after = device.stats()
    assert after.streams_in_use == before.streams_in_use, (before, after)
    assert after.pool_bytes == before.pool_bytes, (before, after)
    assert after.graphs_alive == before.graphs_alive, (before, after)
    assert not device.is_current_stream_capturing()


class _Attention:
    """A tiny paged-attention setup: 2 requests, 4 heads over 2 KV heads.

    On hardware the fused attention kernel takes fp16/bf16 only (and head_dim 128 is its
    well-trodden shape), so non-simulated devices use bfloat16 and head_dim 128.
    """

    def __init__(self, device: Any) -> None:
        on_sim = _is_sim(device)
        dtype = torch.float32 if on_sim else torch.bfloat16
        self.heads, self.kv_heads, self.block_size = 4, 2, 4
        self.head_dim = 8 if on_sim else 128
        self.tokens = 2
        self.query = _tensor(device, self.tokens, self.heads, self.head_dim, seed=1, dtype=dtype)
        self.key_cache = _tensor(device, 8, self.block_size, self.kv_heads, self.head_dim, seed=2, dtype=dtype)
        self.value_cache = _tensor(device, 8, self.block_size, self.kv_heads, self.head_dim, seed=3, dtype=dtype)
        self.block_table = torch.arange(8, dtype=torch.int32, device=device.torch_device).view(2, 4)
        self.out = torch.zeros(self.tokens, self.heads, self.head_dim, device=device.torch_device, dtype=dtype)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def launch(self, seq_lens: list[int], out: Optional[torch.Tensor] = None) -> None:
        ops.paged_attention(
            self.query, self.key_cache, self.value_cache, self.block_table,
            list(range(1, self.tokens + 1)), seq_lens, self.scale, self.out if out is None else out,
        )

    def eager(self, seq_lens: list[int]) -> torch.Tensor:
        expected = torch.empty_like(self.out)
        self.launch(seq_lens, out=expected)
        return expected


def _capture_updatable_attention(device: Any, attention: _Attention, seq_lens: list[int]) -> tuple[Any, Any, Any]:
    """The docs/semantics.md §7 capture protocol around one attention call."""
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        event = device.new_external_event()
        event.wait(stream)
        event.reset(stream)
        device.task_group_begin(stream)
        attention.launch(seq_lens)
        handle = device.task_group_end(stream)
    return graph, handle, event


def _update(device: Any, attention: _Attention, handle: Any, event: Any, seq_lens: list[int], stream: Any) -> None:
    with device.stream(stream):
        device.task_update_begin(stream, handle)
        attention.launch(seq_lens)
        device.task_update_end(stream)
        event.record(stream)


# --------------------------------------------------------------------------- capture and replay


@case(ALL)
def test_replay_equals_eager(device):
    x, w = _tensor(device, 4, 16), _tensor(device, 16, 16, seed=1)

    def step():
        return torch.relu(x @ w).softmax(-1) * 2 + 1

    graph, out = _capture(device, step)
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, step())


@case(ALL)
def test_replay_reads_new_values_copied_into_the_captured_input(device):
    x, w = _tensor(device, 4, 16), _tensor(device, 16, 8, seed=1)
    graph, out = _capture(device, lambda: x @ w)
    fresh = _tensor(device, 4, 16, seed=5)
    x.copy_(fresh)
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, fresh @ w)


@case(ALL)
def test_a_new_tensor_not_copied_into_the_captured_input_is_ignored(device):
    w = _tensor(device, 16, 8, seed=1)
    inputs = {"x": _tensor(device, 4, 16)}
    captured = inputs["x"].clone()
    graph, out = _capture(device, lambda: inputs["x"] @ w)
    inputs["x"] = _tensor(device, 4, 16, seed=9)  # rebinding is invisible to the graph
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, captured @ w)
    assert not torch.allclose(out, inputs["x"] @ w)


@case(ALL)
def test_outputs_keep_their_address_across_replays(device):
    x = _tensor(device, 8)
    graph, out = _capture(device, lambda: x * 3)
    address = out.data_ptr()
    for _ in range(3):
        graph.replay()
    device.synchronize()
    assert out.data_ptr() == address
    torch.testing.assert_close(out, x * 3)


@case(ALL)
def test_python_scalars_are_frozen_at_capture(device):
    x = _tensor(device, 8)
    settings = {"scale": 2.0}
    graph, out = _capture(device, lambda: x * settings["scale"])
    settings["scale"] = 5.0
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x * 2.0)


@case(ALL)
def test_in_place_work_runs_once_per_replay_and_not_at_capture(device):
    counter = torch.zeros(4, device=device.torch_device)
    graph, _ = _capture(device, lambda: counter.add_(1))
    device.synchronize()
    assert torch.equal(counter, torch.zeros(4, device=device.torch_device))
    for _ in range(3):
        graph.replay()
    device.synchronize()
    assert torch.equal(counter, torch.full((4,), 3.0, device=device.torch_device))


@case(ALL)
def test_replay_runs_on_the_default_stream_and_on_side_streams(device):
    x = _tensor(device, 8)
    graph, out = _capture(device, lambda: x + 1)
    with device.stream(device.default_stream()):
        graph.replay()
    x.add_(10)
    with device.stream(device.new_stream()):
        graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x + 1)


@case(ALL)
def test_views_of_captured_outputs_see_replayed_values(device):
    x = _tensor(device, 4, 4)
    graph, out = _capture(device, lambda: x * 2)
    row = out[1]
    x.copy_(_tensor(device, 4, 4, seed=3))
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(row, x[1] * 2)


@case(ALL)
def test_multi_output_custom_ops_replay(device):
    x, residual, weight = _tensor(device, 3, 16), _tensor(device, 3, 16, seed=1), _tensor(device, 16, seed=2)
    graph, (y, x_sum) = _capture(device, lambda: ops.add_rms_norm(x, residual, weight, 1e-6))
    graph.replay()
    device.synchronize()
    ey, es = ops.add_rms_norm(x, residual, weight, 1e-6)
    torch.testing.assert_close(y, ey)
    torch.testing.assert_close(x_sum, es)


@case(ALL)
def test_graphs_sharing_a_pool_both_replay_correctly(device):
    pool = device.graph_pool_handle()
    x = _tensor(device, 8, 8)
    big, big_out = _capture(device, lambda: (x @ x).relu(), pool=pool)
    small, small_out = _capture(device, lambda: x[:2] * 4, pool=big.pool())
    big.replay()
    small.replay()
    device.synchronize()
    torch.testing.assert_close(big_out, (x @ x).relu())
    torch.testing.assert_close(small_out, x[:2] * 4)


@case(ALL)
def test_is_current_stream_capturing_only_inside_capture(device):
    graph = device.new_graph()
    seen = []
    assert not device.is_current_stream_capturing()
    with device.graph(graph):
        seen.append(device.is_current_stream_capturing())
        torch.ones(1, device=device.torch_device).add_(1)
    assert seen == [True]
    assert not device.is_current_stream_capturing()


@case(sim_only("capture outputs are uninitialised memory on hardware: arbitrary, not reliably NaN"))
def test_capture_outputs_are_garbage_until_the_first_replay(device):
    x = _tensor(device, 8)
    graph, out = _capture(device, lambda: x + 1)
    assert torch.isnan(out).all()
    graph.replay()
    torch.testing.assert_close(out, x + 1)


# --------------------------------------------------------------------------- constraints (§12)


@case(ALL)
def test_capture_on_the_default_stream_is_refused(device):
    graph = device.new_graph()
    with pytest.raises(RuntimeError) as exc:
        with device.graph(graph, stream=device.default_stream()):
            pass
    _raises_text(device, exc, DEFAULT_STREAM_CAPTURE)


@case(ALL)
def test_a_second_capture_on_one_graph_is_refused(device):
    graph, _ = _capture(device, lambda: torch.ones(2, device=device.torch_device) * 2)
    with pytest.raises(RuntimeError) as exc:
        with device.graph(graph):
            pass
    _raises_text(device, exc, GRAPH_ALREADY_CAPTURED)


@case(ALL)
def test_capture_end_before_begin_is_refused(device):
    graph = device.new_graph()
    with device.stream(device.new_stream()):
        with pytest.raises(RuntimeError) as exc:
            graph.capture_end()
    _raises_text(device, exc, CAPTURE_END_BEFORE_BEGIN)


@case(ALL)
def test_capture_end_on_another_stream_is_refused(device):
    graph = device.new_graph()
    capture_stream, other = device.new_stream(), device.new_stream()
    with device.stream(capture_stream):
        graph.capture_begin()
    try:
        with device.stream(other):
            with pytest.raises(RuntimeError) as exc:
                graph.capture_end()
        _raises_text(device, exc, CAPTURE_END_OTHER_STREAM)
    finally:
        with device.stream(capture_stream):
            graph.capture_end()
    graph.reset()


@case(ALL)
def test_replay_before_capture_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        device.new_graph().replay()
    _raises_text(device, exc, REPLAY_BEFORE_CAPTURE)


@case(ALL)
def test_pool_before_capture_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        device.new_graph().pool()
    _raises_text(device, exc, POOL_BEFORE_CAPTURE)


@case(ALL)
def test_an_unknown_capture_error_mode_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        with device.graph(device.new_graph(), capture_error_mode="loose"):
            pass
    assert "Unknown capture error mode" in str(exc.value)


@case(ALL)
def test_only_one_capture_at_a_time(device):
    first, second = device.new_graph(), device.new_graph()
    before = device.stats()
    with pytest.raises(RuntimeError) as exc:
        with device.graph(first):
            with device.graph(second, stream=device.new_stream()):
                pass
    if _is_sim(device):
        assert "already in progress" in str(exc.value)
    _assert_clean(device, before)


HOST_SYNCS = {
    "item": lambda t: t.sum().item(),
    "bool": lambda t: bool(t.sum() > 0),
    "tolist": lambda t: t.tolist(),
    "cpu": lambda t: t.cpu(),
    "equal": lambda t: torch.equal(t, t),
    "nonzero": lambda t: t.nonzero(),
    "masked_select": lambda t: t[t > 0],
}


@case(ALL)
@pytest.mark.parametrize("sync", sorted(HOST_SYNCS))
def test_host_synchronisation_during_capture_is_refused(device, sync):
    x = _tensor(device, 8)
    before = device.stats()
    with pytest.raises(RuntimeError) as exc:
        with device.graph(device.new_graph()):
            HOST_SYNCS[sync](x)
    if _is_sim(device):
        assert isinstance(exc.value, errors.CaptureConstraintError)
        assert "host" in str(exc.value) or "data-dependent" in str(exc.value)
    _assert_clean(device, before)


@case(ALL)
def test_device_synchronize_during_capture_is_refused(device):
    with pytest.raises(RuntimeError) as exc:
        with device.graph(device.new_graph()):
            device.synchronize()
    if _is_sim(device):
        assert "device.synchronize()" in str(exc.value)


@case(sim_only("torch_npu 2.13 captures RNG ops; rejecting them is a simulator default"))
def test_rng_during_capture_is_refused_by_default(device):
    with pytest.raises(errors.CaptureConstraintError, match="random"):
        with device.graph(device.new_graph()):
            torch.rand(4, device=device.torch_device)


@case(sim_only("the allow_rng_in_capture option belongs to the simulator"))
def test_rng_in_capture_is_allowed_when_the_device_allows_it(device):
    from ascendgraph.device import get_device

    permissive = get_device("sim", allow_rng_in_capture=True)
    graph, out = _capture(permissive, lambda: torch.rand(1000, device=permissive.torch_device))
    graph.replay()
    first = out.clone()
    graph.replay()
    assert not torch.equal(first, out)  # each replay draws new numbers


@case(sim_only("the environment is injected into the simulator; torch_npu reads the process's"))
def test_task_queue_enable_2_is_refused(device):
    from ascendgraph.device import get_device

    strict = get_device("sim", env={"TASK_QUEUE_ENABLE": "2"})
    with pytest.raises(errors.CaptureConstraintError) as exc:
        with strict.graph(strict.new_graph()):
            pass
    assert str(exc.value) == TASK_QUEUE_2_DURING_CAPTURE
    relaxed = get_device("sim", env={"TASK_QUEUE_ENABLE": "1"})
    _capture(relaxed, lambda: torch.ones(1) + 1)


@case(sim_only("the device does not check in-place metadata changes; the simulator refuses them"))
def test_in_place_metadata_changes_during_capture_are_refused(device):
    x = _tensor(device, 4, 4)
    with pytest.raises(errors.CaptureConstraintError, match="metadata|shape, strides"):
        with device.graph(device.new_graph()):
            x.t_()


# --------------------------------------------------------------------------- failed captures, reset


@case(ALL)
def test_a_failed_capture_leaves_nothing_behind(device):
    x = _tensor(device, 64, 64)
    graph = device.new_graph()
    before = device.stats()
    with pytest.raises(ValueError, match="boom"):
        with device.graph(graph):
            (x @ x).relu()
            raise ValueError("boom")
    _assert_clean(device, before)
    with pytest.raises(RuntimeError):
        graph.replay()
    with device.graph(graph):  # the same object captures again
        out = x + 1
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x + 1)


@case(ALL)
def test_reset_releases_streams_and_pool_memory(device):
    before = device.stats()
    x = _tensor(device, 32, 32)
    graph, _ = _capture(device, lambda: (x @ x) * 2)
    during = device.stats()
    assert during.graphs_alive == before.graphs_alive + 1
    assert during.streams_in_use > before.streams_in_use
    assert during.pool_bytes > before.pool_bytes
    graph.reset()
    _assert_clean(device, before)
    with pytest.raises(RuntimeError):
        graph.replay()


@case(ALL)
def test_a_reset_graph_captures_again(device):
    x = _tensor(device, 8)
    graph, _ = _capture(device, lambda: x + 1)
    graph.reset()
    with device.graph(graph):
        out = x * 7
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x * 7)


@case(sim_only("hardware statistics do not follow garbage-collected graph objects"))
def test_a_dropped_graph_gives_its_resources_back(device):
    before = device.stats()
    x = _tensor(device, 16, 16)
    graph, out = _capture(device, lambda: x @ x)
    del graph, out
    gc.collect()
    _assert_clean(device, before)


# --------------------------------------------------------------------------- stream budget


def _plan(device: Any, *, layers: int, sizes: list[int], mode: GraphMode, max_streams: int) -> Any:
    return plan_stream_budget(
        num_hidden_layers=layers, capture_sizes=sizes, mode=mode, tensor_parallel_size=2,
        max_streams=max_streams,
    )


@case(sim_only("real stacks run out of streams at a stack-dependent count (the calibration test measures it)"))
def test_streams_run_out_at_the_size_the_planner_predicts(device):
    # each graph holds the tensor-parallel all-reduce, as a tp=2 model's pieces do; the device
    # charges what the graphs hold (docs/semantics.md "Streams"), the planner predicts it
    sizes = list(range(8, 160, 8))
    plan = _plan(device, layers=3, sizes=sizes, mode=GraphMode.PIECEWISE, max_streams=200)
    assert not plan.fits
    device.set_stream_plan(plan)  # the stack's limit (200), nothing else
    set_expansion = getattr(device, "set_hccl_op_expansion_mode", None)
    if set_expansion is not None:
        set_expansion("FFTS+")
    x = torch.ones(1, device=device.torch_device)
    alive = []
    failing, exc = None, None
    for index, _size in enumerate(sorted(sizes, reverse=True)):
        try:
            for _ in range(3 + 1):  # layers + 1 pieces
                alive.append(_capture(device, lambda: torch.ops.ascendgraph.all_reduce(x + 1, "tp", 2),
                                      graph_kind="piecewise"))
        except RuntimeError as error:
            failing, exc = index, error
            break
    assert failing == plan.first_failing_index() == plan.max_num_sizes
    assert exc is not None and errors.TEXT_STREAMS_INSUFFICIENT in str(exc)
    typed = rewrite_capture_error(exc)
    assert isinstance(typed, StreamResourceExhausted) and typed.__cause__ is exc


@case(sim_only("the stream charges are the simulator's physical model"))
def test_a_graph_holding_collectives_holds_their_streams(device):
    set_expansion = getattr(device, "set_hccl_op_expansion_mode", None)
    if set_expansion is not None:
        set_expansion("FFTS+")
    start = device.stats().streams_in_use
    x = torch.ones(1, device=device.torch_device)
    alive = [_capture(device, lambda: torch.ops.ascendgraph.all_reduce(x + 1, "tp", 2), graph_kind="full")]
    assert device.stats().streams_in_use == start + 40 + 1 + 2  # group reserve, the graph, its FFTS+ streams
    alive.append(_capture(device, lambda: x + 1, graph_kind="full"))
    assert device.stats().streams_in_use == start + 40 + 1 + 2 + 1
    for graph, _ in alive:
        graph.reset()
    assert device.stats().streams_in_use == start + 40  # the communicator's reserve stays


@case(sim_only("the HDK version is a simulator profile"))
def test_an_old_hdk_runs_out_of_streams_with_alloc_sq_cq_fail(device):
    from ascendgraph.device import get_device

    old = get_device("sim", profile="A2-old-hdk", stream_limit=2)
    x = torch.ones(1)
    alive = [_capture(old, lambda: x + 1) for _ in range(2)]
    with pytest.raises(RuntimeError, match="Alloc sq cq fail") as exc:
        _capture(old, lambda: x + 1)
    assert "retCode=0x7020023" in str(exc.value)
    assert isinstance(rewrite_capture_error(exc.value), OldHdkStack)
    assert len(alive) == 2


# --------------------------------------------------------------------------- task groups, external events


@case(ALL)
def test_a_task_update_changes_the_replayed_result(device):
    attention = _Attention(device)
    graph, handle, event = _capture_updatable_attention(device, attention, [3, 5])
    update_stream = device.new_stream()
    graph.replay()
    _update(device, attention, handle, event, [6, 9], update_stream)
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([6, 9]))


@case(ALL)
def test_without_the_update_replay_uses_the_frozen_lengths(device):
    attention = _Attention(device)
    graph, _, event = _capture_updatable_attention(device, attention, [3, 5])
    graph.replay()
    if _is_sim(device):  # the simulator also reports the stale group (DECISIONS D3); the replay completes
        with pytest.raises(errors.StaleGraphParams, match="without a task update"):
            event.record(device.new_stream())  # release the wait, but no update
    else:
        event.record(device.new_stream())  # release the wait, but no update
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([3, 5]))
    assert not torch.allclose(attention.out, attention.eager([6, 9]))


@case(ALL)
def test_updates_apply_to_every_later_replay(device):
    attention = _Attention(device)
    graph, handle, event = _capture_updatable_attention(device, attention, [3, 5])
    stream = device.new_stream()
    for lens in ([2, 4], [7, 1], [9, 9]):
        graph.replay()
        _update(device, attention, handle, event, lens, stream)
        device.synchronize()
        torch.testing.assert_close(attention.out, attention.eager(lens))


@case(sim_only("a replay suspended at an external-event wait cannot be observed on hardware"))
def test_replay_suspends_at_an_unrecorded_external_event_until_it_is_recorded(device):
    x = _tensor(device, 4)
    graph = device.new_graph()
    event = device.new_external_event()
    with device.graph(graph):
        stream = device.current_stream()
        before = x * 2
        event.wait(stream)
        event.reset(stream)
        after = before + 1
    graph.replay()
    torch.testing.assert_close(before, x * 2)  # ran
    assert torch.isnan(after).all()  # not yet: waiting on the event
    event.record(device.new_stream())
    device.synchronize()
    torch.testing.assert_close(after, x * 2 + 1)


@case(sim_only("a never-recorded event hangs a real device"))
def test_synchronize_with_a_suspended_replay_raises_a_hang_naming_graph_and_event(device):
    device.require_task_updates = False  # this case is about the hang, not the missing update
    attention = _Attention(device)
    graph, _, event = _capture_updatable_attention(device, attention, [3, 5])
    graph.replay()
    with pytest.raises(GraphHang) as exc:
        device.synchronize()
    assert graph.name in str(exc.value) and str(event) in str(exc.value)
    event.record(device.new_stream())
    device.synchronize()


@case(sim_only("reuse without reset is undefined on hardware; the simulator reports it"))
def test_recording_an_external_event_twice_without_reset_is_an_error(device):
    event = device.new_external_event()
    stream = device.new_stream()
    event.record(stream)
    with pytest.raises(RuntimeError, match="without reset"):
        event.record(stream)
    event.reset(stream)
    event.record(stream)


@case(ALL)
def test_an_eager_wait_before_record_is_released_by_the_record(device):
    event = device.new_external_event()
    waiter, recorder = device.new_stream(), device.new_stream()
    event.wait(waiter)
    assert not waiter.query()  # the waiter holds a wait nobody has recorded yet
    event.record(recorder)
    device.synchronize()
    assert waiter.query() and recorder.query()  # the record released it; nothing is left pending


@case(sim_only("the device's error for a mismatched update is undefined; the simulator names it"))
@pytest.mark.parametrize("mistake", ["wrong op", "extra op", "no op"])
def test_an_update_that_does_not_match_the_group_is_an_error(device, mistake):
    attention = _Attention(device)
    graph, handle, event = _capture_updatable_attention(device, attention, [3, 5])
    stream = device.new_stream()
    with device.stream(stream):
        device.task_update_begin(stream, handle)
        if mistake == "wrong op":
            attention.out.mul_(2)
        elif mistake == "extra op":
            attention.launch([1, 1])
            attention.out.mul_(2)
        with pytest.raises(errors.CaptureConstraintError, match="does not match its capture"):
            device.task_update_end(stream)


@case(ALL)
def test_task_groups_exist_only_inside_a_capture(device):
    stream = device.new_stream()
    with pytest.raises(RuntimeError):
        device.task_group_begin(stream)


@case(sim_only("stale handles are undefined behaviour on hardware"))
def test_handles_of_a_reset_graph_cannot_be_updated(device):
    attention = _Attention(device)
    graph, handle, _ = _capture_updatable_attention(device, attention, [3, 5])
    graph.reset()
    stream = device.new_stream()
    with pytest.raises(errors.CaptureConstraintError, match="no longer exists"):
        device.task_update_begin(stream, handle)


# --------------------------------------------------------------------------- wrapper ops


@case(ALL)
def test_a_wrapper_op_records_its_kernels_with_frozen_host_lengths(device):
    attention = _Attention(device)
    context = {"seq_lens": [3, 5]}

    def impl(query: torch.Tensor, out: torch.Tensor) -> None:
        attention.launch(list(context["seq_lens"]), out=out)

    ops.register_wrapper_op(_context_attention, impl)
    try:
        graph = device.new_graph()
        with device.graph(graph):
            _context_attention(attention.query, attention.out)
        context["seq_lens"] = [6, 9]  # a new batch: the graph still holds [3, 5]
        graph.replay()
        device.synchronize()
        torch.testing.assert_close(attention.out, attention.eager([3, 5]))
        if _is_sim(device):
            assert "ascendgraph.paged_attention.default" in graph.recorded_ops()
    finally:
        ops.unregister_wrapper_op(_context_attention)


@torch.library.custom_op("ascendgraph_conformance::context_attention", mutates_args=("out",))
def _context_attention(query: torch.Tensor, out: torch.Tensor) -> None:
    impl = ops.wrapper_impl(_context_attention)
    if impl is None:
        raise RuntimeError("ascendgraph_conformance::context_attention used outside its test")
    impl(query, out)


# --------------------------------------------------------------------------- faults (simulator)


@case(sim_only("fault injection is a simulator facility"))
def test_a_capture_begin_fault_fires_after_the_counted_passes(device):
    device.set_fault_plan("capture_begin=2*off->raise(207008)")
    x = torch.ones(1)
    alive = [_capture(device, lambda: x + 1) for _ in range(2)]
    assert len(alive) == 2
    before = device.stats()
    with pytest.raises(RuntimeError) as exc:
        _capture(device, lambda: x + 1)
    assert isinstance(rewrite_capture_error(exc.value), StreamResourceExhausted)
    _assert_clean(device, before)


@case(sim_only("fault injection is a simulator facility"))
def test_device_loss_fails_every_later_call(device):
    x = torch.ones(1)
    graph, _ = _capture(device, lambda: x + 1)
    device.set_fault_plan("replay=raise(device_lost)")
    with pytest.raises(DeviceLost):
        graph.replay()
    with pytest.raises(DeviceLost):
        device.synchronize()


@case(sim_only("fault injection is a simulator facility"))
def test_a_skipped_update_leaves_stale_results(device):
    attention = _Attention(device)
    graph, handle, event = _capture_updatable_attention(device, attention, [3, 5])
    device.set_fault_plan("task_update=skip_update")
    graph.replay()
    with pytest.raises(errors.StaleGraphParams, match=f"replay 1 of {graph.name} executed task group 0"):
        _update(device, attention, handle, event, [6, 9], device.new_stream())
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([3, 5]))


@case(sim_only("fault injection is a simulator facility"))
def test_without_required_updates_a_skipped_update_is_left_to_the_numbers(device):
    device.require_task_updates = False
    attention = _Attention(device)
    graph, handle, event = _capture_updatable_attention(device, attention, [3, 5])
    device.set_fault_plan("task_update=skip_update")
    graph.replay()
    _update(device, attention, handle, event, [6, 9], device.new_stream())
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([3, 5]))


@case(sim_only("what a card does with a non-kernel task inside a task group is undefined; the simulator refuses it"))
@pytest.mark.parametrize("intruder", ["workspace query", "allocation", "event wait"])
def test_only_kernel_tasks_may_sit_inside_a_task_group(device, intruder):
    attention = _Attention(device)
    before = device.stats()
    stream_before = device.current_stream()
    graph = device.new_graph()
    with pytest.raises(errors.CaptureConstraintError, match="only single-operator kernel tasks") as exc:
        with device.graph(graph):
            stream = device.current_stream()
            device.task_group_begin(stream)
            if intruder == "workspace query":
                ops.attention_workspace(
                    attention.query, attention.key_cache, attention.value_cache, attention.block_table,
                    [1, 2], [3, 5], attention.scale,
                )
            elif intruder == "allocation":
                torch.empty(4, device=device.torch_device)
            else:
                device.new_external_event().wait(stream)
    assert {"event wait": "ExternalEvent (wait"}.get(intruder, intruder) in str(exc.value)
    _assert_clean(device, before)
    assert device.current_stream() == stream_before


@case(sim_only("the workspace query's size is the simulator's stand-in"))
def test_prepared_outside_the_group_the_attention_call_captures(device):
    attention = _Attention(device)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        workspace = ops.attention_workspace(
            attention.query, attention.key_cache, attention.value_cache, attention.block_table,
            [1, 2], [3, 5], attention.scale,
        )
        lse = torch.empty(1, dtype=attention.query.dtype, device=device.torch_device)
        device.task_group_begin(stream)
        ops.paged_attention(
            attention.query, attention.key_cache, attention.value_cache, attention.block_table,
            [1, 2], [3, 5], attention.scale, attention.out, workspace, lse,
        )
        device.task_group_end(stream)
    assert graph.recorded_ops() == ["ascendgraph.paged_attention.default"]


@case(sim_only("fault injection is a simulator facility"))
def test_an_oom_during_capture_leaves_nothing_behind(device):
    device.set_fault_plan("malloc=1*off->raise(oom)")
    x = _tensor(device, 16, 16)
    before = device.stats()
    with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory"):
        _capture(device, lambda: (x @ x) + 1)
    _assert_clean(device, before)


@case(sim_only("fault injection is a simulator facility"))
def test_a_hung_replay_is_reported_at_synchronize(device):
    x = torch.ones(1)
    graph, _ = _capture(device, lambda: x + 1)
    device.set_fault_plan("replay=hang")
    graph.replay()
    with pytest.raises(GraphHang, match=graph.name):
        device.synchronize()


# --------------------------------------------------------------------------- accounting


@case(sim_only("the virtual clock belongs to the simulator"))
def test_a_replay_costs_less_virtual_time_than_the_same_ops_eagerly(device):
    x, w = _tensor(device, 1, 64), _tensor(device, 64, 64, seed=1)

    def step():
        h = x
        for _ in range(8):
            h = torch.relu(h @ w) + 1
        return h

    graph, _ = _capture(device, step)
    start = device.stats().virtual_time_us
    with device.track_eager():
        step()
    device.synchronize()
    eager = device.stats().virtual_time_us - start
    start = device.stats().virtual_time_us
    graph.replay()
    device.synchronize()
    replay = device.stats().virtual_time_us - start
    assert 0 < replay < eager


@case(sim_only("kernel records are the simulator's profile source"))
def test_profiling_keeps_one_kernel_record_per_replayed_task(device, tmp_path):
    x = _tensor(device, 4, 4)
    graph, _ = _capture(device, lambda: (x @ x).relu())
    with device.profiling(str(tmp_path)) as session:
        graph.replay()
    names = [record.name for record in session.records]
    assert names == ["aten.mm.default", "aten.relu.default"]
    assert all(record.graph == graph.name and record.duration_us > 0 for record in session.records)


@case(sim_only("two simulated devices in one process"))
def test_two_devices_are_independent(device):
    from ascendgraph.device import get_device

    other = get_device("sim")
    x = torch.ones(1)
    first, _ = _capture(device, lambda: x + 1)
    assert other.stats().graphs_alive == 0 and other.stats().streams_in_use == 0
    graph = device.new_graph()
    with device.graph(graph):
        inner, inner_out = _capture(other, lambda: x + 2)  # one device's capture does not block another's
        y = x + 3
    assert device.stats().graphs_alive == 2 and other.stats().graphs_alive == 1
    assert graph.recorded_ops() == ["aten.add.Tensor"] and inner.recorded_ops() == ["aten.add.Tensor"]
    inner.replay()
    graph.replay()
    torch.testing.assert_close(inner_out, x + 2)
    torch.testing.assert_close(y, x + 3)
    assert first.is_captured
