"""SimDevice behaviour beyond the conformance suite: compile inside capture, wrapper ops,
leak checks after every kind of failure, task-group misuse, clocks, stats, options."""

from __future__ import annotations

import math

import pytest
import torch

from ascendgraph import ops
from ascendgraph.device import DeviceStats, get_device
from ascendgraph.errors import (
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_EL0009,
    CaptureConstraintError,
    ConfigError,
    DeviceLost,
    GraphHang,
)
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget
from sim import BACKEND, SimDevice


def capture(device, fn, **options):
    graph = device.new_graph()
    with device.graph(graph, **options):
        out = fn()
    return graph, out


def resources(device) -> tuple:
    stats = device.stats()
    return stats.streams_in_use, stats.pool_bytes, stats.graphs_alive, stats.extra["capturing"]


# --------------------------------------------------------------------------- registry


def test_the_entry_point_backend_creates_independent_sim_devices():
    assert BACKEND.name == "sim" and BACKEND.availability() == (True, "CPU simulator")
    first, second = get_device("sim"), get_device("sim", profile="A3")
    assert isinstance(first, SimDevice) and first is not second
    assert second.profile.name == "A3"


def test_unknown_options_are_config_errors_listing_the_valid_ones():
    with pytest.raises(ConfigError, match="allow_rng_in_capture"):
        SimDevice(allow_rng=True)
    with pytest.raises(ConfigError, match="positive integer"):
        SimDevice(stream_limit=0)
    with pytest.raises(ConfigError, match="207008, el0009"):
        SimDevice(stream_error="207009")


# --------------------------------------------------------------------------- torch.compile, wrapper ops


def test_a_compiled_function_captured_runs_its_compiled_code_and_replays():
    device = SimDevice()
    compiled_runs = []

    def backend(gm, example_inputs):
        def run(*args):
            compiled_runs.append(1)
            return gm.forward(*args)

        return run

    @torch.compile(backend=backend, fullgraph=True)
    def step(x, w):
        return torch.relu(x @ w) * 2

    x, w = torch.randn(4, 8), torch.randn(8, 8)
    expected = step(x, w)  # warm-up compiles
    graph, out = capture(device, lambda: step(x, w))
    assert len(compiled_runs) == 2  # the compiled code ran under the recorder
    assert graph.recorded_ops() == ["aten.mm.default", "aten.relu.default", "aten.mul.Tensor"]
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, expected)


@torch.library.custom_op("ascendgraph_simtest::ctx_attention", mutates_args=("out",))
def ctx_attention(query: torch.Tensor, out: torch.Tensor) -> None:
    impl = ops.wrapper_impl(ctx_attention)
    assert impl is not None
    impl(query, out)


def test_a_wrapper_op_is_recorded_as_the_kernels_it_issues():
    device = SimDevice()
    q = torch.randn(2, 4, 16).bfloat16()
    cache = torch.randn(4, 16, 2, 16).bfloat16()
    table = torch.arange(4, dtype=torch.int32).view(2, 2)
    context = {"seq_lens": [2, 3]}

    def impl(query, out):
        scaled = query * 1.0
        ops.paged_attention(scaled, cache, cache, table, [1, 2], list(context["seq_lens"]), 0.3, out)

    ops.register_wrapper_op(ctx_attention, impl)
    try:
        assert ops.is_wrapper_op(torch.ops.ascendgraph_simtest.ctx_attention)
        out = torch.zeros(2, 4, 16, dtype=torch.bfloat16)
        ctx_attention(q, out)  # the warm-up (a kernel's first launch for a shape is refused in a capture)
        graph, _ = capture(device, lambda: ctx_attention(q, out))
        assert graph.recorded_ops() == ["aten.mul.Tensor", "ascendgraph.paged_attention.default"]
        context["seq_lens"] = [5, 7]
        graph.replay()
        expected = torch.zeros_like(out)
        ops.paged_attention(q, cache, cache, table, [1, 2], [2, 3], 0.3, expected)
        torch.testing.assert_close(out, expected)  # stale, as on the device
    finally:
        ops.unregister_wrapper_op(ctx_attention)
    assert ops.wrapper_impl(ctx_attention) is None


def test_registering_a_non_op_as_a_wrapper_is_a_type_error():
    with pytest.raises(TypeError, match="OpOverload"):
        ops.register_wrapper_op("attention", lambda: None)


# --------------------------------------------------------------------------- leak checks


def test_every_kind_of_failed_capture_leaves_the_device_as_it_was():
    device = SimDevice(stream_limit=1)
    x = torch.randn(16, 16)
    keep, _ = capture(device, lambda: x @ x)  # uses the only stream
    baseline = resources(device)

    failures = {
        "stream exhaustion": lambda: capture(device, lambda: x + 1),
        "exception in block": None,
    }
    with pytest.raises(RuntimeError, match="207008"):
        failures["stream exhaustion"]()
    assert resources(device) == baseline
    keep.reset()
    baseline = resources(device)

    def boom():
        x @ x
        raise KeyError("inside")

    with pytest.raises(KeyError):
        capture(device, boom)
    assert resources(device) == baseline
    with pytest.raises(CaptureConstraintError):
        capture(device, lambda: (x @ x).sum().item())
    assert resources(device) == baseline
    device.set_fault_plan("capture_end=raise(207005)")
    with pytest.raises(RuntimeError, match="207005"):
        capture(device, lambda: x @ x)
    assert resources(device) == baseline
    device.set_fault_plan("malloc=1*off->raise(oom)")
    with pytest.raises(torch.OutOfMemoryError):
        capture(device, lambda: (x @ x) + 1)
    assert resources(device) == baseline
    device.set_fault_plan(None)
    graph, out = capture(device, lambda: x + 1)
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x + 1)


def test_an_open_task_group_at_capture_end_discards_the_capture():
    device = SimDevice()
    baseline = resources(device)
    graph = device.new_graph()
    x = torch.ones(2)
    with pytest.raises(CaptureConstraintError, match="never closed"):
        with device.graph(graph):
            device.task_group_begin(device.current_stream())
            x.add_(1)
    assert resources(device) == baseline and graph.state == "idle"


def test_capture_memory_beyond_the_device_is_an_oom():
    tiny = SimDevice(profile=SimDevice().profile.__class__(name="tiny", soc="test", memory_bytes=1000))
    with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory"):
        capture(tiny, lambda: torch.ones(100) + torch.ones(100) * 2 + 1)
    assert tiny.stats().pool_bytes == 0


def test_reset_drops_a_suspended_replay():
    device = SimDevice(lag="synchronous")  # it looks at the device between issue and completion
    event = device.new_external_event()
    graph = device.new_graph()
    with device.graph(graph):
        event.wait(device.current_stream())
        torch.ones(1) + 1
    graph.replay()
    assert device.stats().extra["suspended_replays"] == 1
    graph.reset()
    assert device.stats().extra["suspended_replays"] == 0
    device.synchronize()


# --------------------------------------------------------------------------- pools


def test_a_shared_pool_costs_its_largest_graph():
    device = SimDevice()
    pool = device.graph_pool_handle()
    large, little, medium = torch.ones(1000), torch.ones(10), torch.ones(100)
    big, _ = capture(device, lambda: large * 2, pool=pool)
    small, _ = capture(device, lambda: little * 2, pool=pool)
    assert big.pool_bytes == 4000 and small.pool_bytes == 40
    assert device.stats().pool_bytes == 4000
    big.reset()
    assert device.stats().pool_bytes == 40
    private, _ = capture(device, lambda: medium * 2)
    assert device.stats().pool_bytes == 40 + 400
    assert private.pool() != pool and small.pool() == pool


def test_a_pool_of_another_device_is_refused():
    first, second = SimDevice(), SimDevice()
    with pytest.raises(ConfigError, match="does not belong to this device"):
        capture(second, lambda: torch.ones(1) + 1, pool=first.graph_pool_handle())


# --------------------------------------------------------------------------- streams and events


def test_an_eager_wait_on_an_unrecorded_event_hangs_synchronize_until_recorded():
    device = SimDevice()
    event = device.new_external_event()
    stream = device.new_stream()
    event.wait(stream)
    with pytest.raises(GraphHang, match=str(event)):
        device.synchronize()
    assert not stream.query()
    event.record(device.new_stream())
    device.synchronize()
    assert stream.query()


def test_a_replay_behind_a_blocked_stream_waits_its_turn():
    device = SimDevice(lag="synchronous")  # it looks at the device between issue and completion
    x = torch.ones(2)
    graph, out = capture(device, lambda: x * 3)
    stream = device.new_stream()
    event = device.new_external_event()
    event.wait(stream)
    with device.stream(stream):
        graph.replay()
    assert torch.isnan(out).all()
    event.record(device.new_stream())
    torch.testing.assert_close(out, x * 3)


def _replay_suspended_at(device, event, name: str = "decode-8"):
    """A graph named ``name`` that waits on ``event``, replayed on a new stream: the stream."""
    graph = device.new_graph(name=name)
    with device.graph(graph):
        event.wait(device.current_stream())
    stream = device.new_stream()
    with device.stream(stream):
        graph.replay()
    return stream


def test_stream_synchronize_names_the_suspended_graph():
    device = SimDevice()
    stream = _replay_suspended_at(device, device.new_external_event())
    with pytest.raises(GraphHang, match="decode-8"):
        stream.synchronize()


def test_a_graph_that_records_an_external_event_releases_its_waiters():
    device = SimDevice(lag="synchronous")  # it looks at the device between issue and completion
    event = device.new_external_event()
    x = torch.ones(2)
    producer, _ = capture(device, lambda: event.record(device.current_stream()))
    consumer = device.new_graph()
    with device.graph(consumer):
        event.wait(device.current_stream())
        event.reset(device.current_stream())
        out = x + 5
    consumer_stream = device.new_stream()
    with device.stream(consumer_stream):
        consumer.replay()
    assert torch.isnan(out).all()
    producer.replay()
    torch.testing.assert_close(out, x + 5)
    assert not event.flag


def test_the_stream_context_rejects_foreign_streams():
    with pytest.raises(ConfigError, match="not a stream of this device"):
        with SimDevice().stream(SimDevice().new_stream()):
            pass


# --------------------------------------------------------------------------- task groups


@pytest.mark.parametrize(
    "misuse, fragment",
    [
        ("end without begin", "no task group is open"),
        ("nested begin", "already open"),
        ("update while capturing", "is capturing"),
    ],
)
def test_task_group_misuse_is_explained(misuse, fragment):
    device = SimDevice()
    graph = device.new_graph()
    x = torch.ones(1)
    with pytest.raises(CaptureConstraintError, match=fragment):
        with device.graph(graph):
            stream = device.current_stream()
            if misuse == "end without begin":
                device.task_group_end(stream)
            elif misuse == "nested begin":
                device.task_group_begin(stream)
                device.task_group_begin(stream)
            else:
                device.task_group_begin(stream)
                x.add_(1)
                handle = device.task_group_end(stream)
                device.task_update_begin(stream, handle)


def test_an_update_end_without_begin_and_a_second_open_update_are_refused():
    device = SimDevice(require_task_updates=False)  # the update precedes the replay here
    x = torch.ones(2)
    y = torch.empty(2)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        device.task_group_begin(stream)
        torch.add(x, 1, out=y)
        handle = device.task_group_end(stream)
    update = device.new_stream()
    with pytest.raises(CaptureConstraintError, match="no task update is open"):
        device.task_update_end(update)
    device.task_update_begin(update, handle)
    try:
        with pytest.raises(CaptureConstraintError, match="still open"):
            device.task_update_begin(update, handle)
    finally:
        torch.add(x, 2, out=y)
        device.task_update_end(update)
    graph.replay()


def test_an_update_can_change_an_out_op_and_keeps_its_output_address():
    device = SimDevice(require_task_updates=False)  # the update precedes the replay here
    x = torch.ones(3)
    out = torch.empty(3)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        device.task_group_begin(stream)
        torch.mul(x, 2.0, out=out)
        handle = device.task_group_end(stream)
    update = device.new_stream()
    with device.stream(update):
        device.task_update_begin(update, handle)
        torch.mul(x, 5.0, out=out)
        device.task_update_end(update)
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(out, x * 5.0)


# --------------------------------------------------------------------------- stream plan


def test_exhaustion_carries_the_el0009_line_when_asked():
    device = SimDevice(stream_limit=1, stream_error="el0009")
    keep = capture(device, lambda: torch.ones(1) + 1)
    with pytest.raises(RuntimeError) as exc:
        capture(device, lambda: torch.ones(1) + 1)
    assert str(exc.value) == TEXT_207008_CAPTURE_BEGIN + "\n" + TEXT_EL0009
    assert keep


def test_the_plan_budget_replaces_the_device_limit():
    device = SimDevice(stream_limit=5)
    plan = plan_stream_budget(num_hidden_layers=2, capture_sizes=[1, 2], mode=GraphMode.PIECEWISE, max_streams=50)
    device.set_stream_plan(plan)
    assert device.stats().stream_limit == 50
    device.set_stream_plan(None)
    assert device.stats().stream_limit == 5


# --------------------------------------------------------------------------- clocks, stats


def test_stats_report_graphs_pool_streams_and_clocks():
    device = SimDevice()
    x = torch.ones(8, 8)
    graph, _ = capture(device, lambda: x @ x)
    graph.replay()
    stats = device.stats()
    assert isinstance(stats, DeviceStats)
    assert (stats.graphs_alive, stats.graphs_captured_total, stats.streams_in_use) == (1, 1, 1)
    assert stats.pool_bytes == stats.allocated_bytes == 256 == device.memory_allocated()
    assert stats.extra["replays"] == 1
    assert stats.extra["capture_time_us"] == graph.capture_time_us > 0
    assert stats.virtual_time_us >= stats.extra["capture_time_us"]
    assert graph.info()["tasks"] == 1 and graph.device_time_us() > 0


def test_replay_advances_the_device_clock_by_the_graph_time():
    device = SimDevice()
    x = torch.ones(64, 64)
    graph, _ = capture(device, lambda: (x @ x).relu())
    device.synchronize()
    host, dev = device.clock()
    graph.replay()
    host2, dev2 = device.clock()
    assert host2 - host == pytest.approx(device.cost.graph_launch_us(2))
    assert dev2 == dev  # the device runs behind the host: the replay is queued
    device.synchronize()
    _, dev3 = device.clock()
    assert dev3 == pytest.approx(max(dev, host2) + graph.device_time_us())  # from its launch, not from the sync


def test_eager_ops_are_free_unless_tracked():
    device = SimDevice()
    x = torch.ones(4)
    before = device.stats().virtual_time_us
    x + 1
    assert device.stats().virtual_time_us == before
    with device.profiling("unused") as session, device.track_eager():
        (x + 1).view(2, 2).relu()
    assert [r.op_type for r in session.records] == ["add", "relu"]
    assert all(r.graph is None for r in session.records)
    assert device.stats().virtual_time_us > before


def test_a_delay_fault_moves_the_virtual_clock():
    device = SimDevice(faults="synchronize=delay(2)")
    before = device.clock()[0]
    device.synchronize()
    assert device.clock()[0] - before == pytest.approx(2000.0)


def test_the_fault_seed_is_the_device_seed():
    outcomes = []
    for _ in range(2):
        device = SimDevice(faults="replay=50%raise(207005)", seed=3)
        graph, _ = capture(device, lambda: torch.ones(1) + 1)
        row = []
        for _ in range(20):
            try:
                graph.replay()
                row.append(0)
            except RuntimeError:
                row.append(1)
        outcomes.append(row)
    assert outcomes[0] == outcomes[1] and 0 < sum(outcomes[0]) < 20


def test_a_lost_device_refuses_new_work():
    device = SimDevice(faults="synchronize=raise(device_lost)")
    with pytest.raises(DeviceLost):
        device.synchronize()
    with pytest.raises(DeviceLost, match="create a new device"):
        device.new_graph()
    assert device.stats().extra["device_lost"]


def test_weak_ref_aliases_the_tensor():
    device = SimDevice()
    x = torch.ones(3, requires_grad=True)
    alias = device.weak_ref(x)
    assert alias.data_ptr() == x.data_ptr() and not alias.requires_grad


def test_bf16_attention_in_a_graph_matches_eager():
    device = SimDevice()
    q = torch.randn(4, 4, 16).bfloat16()
    cache = torch.randn(8, 128, 2, 16).bfloat16()  # two query tokens a request: Q_S > 1 takes 128 (op docs :8219)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    out = torch.empty(4, 4, 16, dtype=torch.bfloat16)
    ops.paged_attention(q, cache, cache, table, [2, 4], [5, 9], 1 / math.sqrt(16), out)  # warm-up
    graph, _ = capture(device, lambda: ops.paged_attention(q, cache, cache, table, [2, 4], [5, 9], 1 / math.sqrt(16), out))
    graph.replay()
    expected = torch.empty_like(out)
    ops.paged_attention(q, cache, cache, table, [2, 4], [5, 9], 1 / math.sqrt(16), expected)
    assert torch.equal(out, expected)


# --------------------------------------------------------------------------- eager records in stream order


def test_a_record_on_the_stream_its_own_wait_blocks_is_a_hang_at_the_record():
    # A FULL replay waits for its update event; recording that event on the replay's own
    # stream queues the record behind the wait: the device hangs for ever.
    device = SimDevice()
    event = device.new_external_event()
    stream = _replay_suspended_at(device, event)
    with pytest.raises(GraphHang, match=rf"{event}.*blocked by replay of decode-8"):
        event.record(stream)
    event.record(device.new_stream())  # the update's own stream: the replay finishes
    device.synchronize()
    assert stream.query()


def test_a_record_behind_other_pending_work_takes_effect_when_the_stream_reaches_it():
    device = SimDevice(lag="synchronous")  # it looks at the device between issue and completion
    first, second = device.new_external_event(), device.new_external_event()
    stream, other = device.new_stream(), device.new_stream()
    first.wait(stream)
    second.record(stream)  # queued behind the wait for `first`
    second.wait(other)
    assert not second.flag and not other.query()
    first.record(device.new_stream())
    assert second.flag  # the stream drained to the record
    device.synchronize()
    assert stream.query() and other.query()


def test_an_eager_wait_ahead_of_a_record_of_the_same_event_is_a_hang():
    device = SimDevice()
    event = device.new_external_event()
    stream = device.new_stream()
    event.wait(stream)
    with pytest.raises(GraphHang, match="an eager wait"):
        event.record(stream)


def test_a_reset_behind_a_suspended_replay_runs_after_the_replay_is_released():
    # The replay's own stream resets the event after its wait, as vLLM Ascend does: queued, the
    # reset clears the flag only once the update's record has released the replay.
    device = SimDevice(lag="synchronous")  # it looks at the device between issue and completion
    event = device.new_external_event()
    stream = _replay_suspended_at(device, event)
    event.reset(stream)  # queued behind the suspended replay
    event.record(device.new_stream())
    assert not event.flag  # the replay ran, then the reset
    event.record(device.new_stream())  # so a second record is legal, not "recorded again without reset"
    device.synchronize()
    assert stream.query()


def test_eager_kernels_take_the_policy_of_the_device_whose_scope_they_run_in():
    # The kernels are process-wide (torch.library); the leniency is per device inside a device's
    # scopes: a device created later must not relax, or tighten, the kernels another device runs.
    from ascendgraph import ops
    from ascendgraph.errors import KernelContractError
    from sim import SimDevice

    x = torch.randn(4, 8)  # float32: dynamic_quant takes float16/bfloat16 only (relaxed by the leniency)
    lenient = SimDevice(allow_float32_attention=True)
    strict = SimDevice()  # the newest device
    with lenient.track_eager():
        ops.dynamic_quant(x)
    with lenient.kernel_policy():
        ops.dynamic_quant(x)
    with pytest.raises(KernelContractError, match="input_dtype_half"):
        with strict.track_eager():
            ops.dynamic_quant(x)
    with pytest.raises(KernelContractError, match="input_dtype_half"):
        ops.dynamic_quant(x)  # outside every scope: the newest device's policy (strict), documented
    later_lenient = SimDevice(allow_float32_attention=True)
    with pytest.raises(KernelContractError, match="input_dtype_half"):
        with strict.warmup_scope():  # the newest device relaxes nothing inside another device's scope
            ops.dynamic_quant(x)
    with later_lenient.warmup_scope():
        ops.dynamic_quant(x)


@torch.library.custom_op("ascendgraph_simtest::scale_into", mutates_args=("out",))
def scale_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 3)


@scale_into.register_fake
def _(x: torch.Tensor, out: torch.Tensor) -> None:
    return None


def test_a_compiled_mutating_op_runs_through_auto_functionalized_under_capture_and_replays():
    # An AOT-compiled graph (vLLM's compiled model: its attention op writes ``output``) calls a
    # mutating op through torch's auto_functionalized_v2 higher-order op, which asks each
    # dispatch mode for its own implementation: the capture records the op's dense run.
    device = SimDevice()

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(x, out):
        scale_into(x + 1, out)
        return out * 2

    x, out = torch.randn(4), torch.zeros(4)
    step(x, out)  # warm-up compiles
    graph, result = capture(device, lambda: step(x, out))
    x.copy_(torch.arange(4.0))
    graph.replay()
    device.synchronize()  # the device runs behind the host; the result is read through a plain CPU tensor
    torch.testing.assert_close(result, (torch.arange(4.0) + 1) * 6)
    assert "ascendgraph_simtest.scale_into.default" in graph.recorded_ops()
