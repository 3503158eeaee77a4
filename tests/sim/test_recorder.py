"""How capture classifies ops (the table in sim/recorder.py)."""

from __future__ import annotations

import pytest
import torch

import sim  # noqa: F401
from sim.recorder import ALIAS, ALLOC, DYNAMIC_SHAPE, HOST, HOST_SYNC, METADATA_CHANGE, OP, RNG, classify, draws_random

aten = torch.ops.aten


@pytest.mark.parametrize(
    "op, kind",
    [
        (aten.mm.default, OP),
        (aten.add_.Tensor, OP),
        (aten.copy_.default, OP),
        (aten.mm.out, OP),
        (aten.empty.memory_format, ALLOC),
        (aten.empty.out, OP),
        (aten.empty_like.default, ALLOC),
        (aten.empty_strided.default, ALLOC),
        (aten.new_empty.default, ALLOC),
        (aten._assert_scalar.default, HOST),
        (aten.sym_constrain_range_for_size.default, HOST),
        (aten.zeros.default, OP),
        (torch.ops.ascendgraph.paged_attention.default, OP),
        (aten.view.default, ALIAS),
        (aten.transpose.int, ALIAS),
        (aten.split_with_sizes.default, ALIAS),
        (aten._unsafe_view.default, ALIAS),
        (aten.detach.default, ALIAS),
        (aten._local_scalar_dense.default, HOST_SYNC),
        (aten.equal.default, HOST_SYNC),
        (aten.nonzero.default, DYNAMIC_SHAPE),
        (aten.masked_select.default, DYNAMIC_SHAPE),
        (aten.t_.default, METADATA_CHANGE),
        (aten.unsqueeze_.default, METADATA_CHANGE),
        (aten.set_.source_Tensor, METADATA_CHANGE),
        (aten.resize_.default, METADATA_CHANGE),
        (aten.uniform_.default, RNG),
        (aten.bernoulli.default, RNG),
        (aten.native_dropout.default, RNG),
    ],
)
def test_ops_are_classified_like_the_table(op, kind):
    assert classify(op).kind == kind


def test_in_place_and_out_returns_alias_their_argument():
    assert classify(aten.add_.Tensor).return_alias == (0,)
    info = classify(aten.mm.out)
    assert info.return_alias == (info.arg_names.index("out"),)
    assert classify(aten.mm.default).return_alias == (None,)


def test_dropout_that_draws_nothing_is_not_random():
    info = classify(aten.native_dropout.default)
    x = torch.ones(2)
    assert not draws_random(info, (x, 0.0, True), {})
    assert not draws_random(info, (x, 0.5, False), {})
    assert draws_random(info, (x, 0.5, True), {})


def test_capture_records_the_decomposed_aten_ops_and_not_the_views(sim_device):
    w = torch.randn(4, 8)
    x = torch.randn(2, 8)
    graph = sim_device.new_graph()
    with sim_device.graph(graph):
        torch.nn.functional.linear(x, w.t().contiguous().t()).view(-1).relu()
    assert graph.recorded_ops() == ["aten.clone.default", "aten.mm.default", "aten.relu.default"]


@pytest.mark.parametrize("copying", [
    pytest.param(lambda y: y.contiguous(), id="contiguous"),
    pytest.param(lambda y: y.reshape(-1), id="reshape"),
    pytest.param(lambda y: torch.ops.aten.contiguous.default(y), id="aten.contiguous as a compiled graph calls it"),
])
def test_a_composite_copy_below_autograd_is_recorded_not_frozen_into_the_graph(sim_device, copying):
    # Below autograd (torch.inference_mode(), as vLLM's runner serves; a compiled graph) a
    # CompositeImplicitAutograd op reaches the recorder itself. Its schema returns an alias, yet
    # on a non-contiguous view it copies: run at capture, the copy's data froze into the graph.
    x = torch.randn(2, 12)
    with torch.inference_mode():
        graph = sim_device.new_graph()
        with sim_device.graph(graph):
            out = copying((x * 2)[:, :4]) * 3
        assert graph.recorded_ops() == ["aten.mul.Tensor", "aten.clone.default", "aten.mul.Tensor"]
        x.copy_(torch.randn(2, 12))
        graph.replay()
        sim_device.synchronize()
        assert torch.equal(out, copying((x * 2)[:, :4]) * 3)


def test_an_op_without_a_meta_kernel_runs_at_capture_and_is_counted(sim_device):
    lib = torch.library.Library("ascendgraph_test_nometa", "FRAGMENT")
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CPU")
    x = torch.ones(3)
    graph = sim_device.new_graph()
    with sim_device.graph(graph):
        out = torch.ops.ascendgraph_test_nometa.twice(x)
    assert torch.equal(out, x * 2)  # computed at capture (fallback)
    assert sim_device.stats().extra["capture_fallback_ops"] == 1
    x.fill_(5)
    graph.replay()
    sim_device.synchronize()
    assert torch.equal(out, torch.full((3,), 10.0))


# ----------------------------------------------------------------- ops that launch no kernel


def test_an_allocation_in_capture_takes_pool_bytes_but_records_no_kernel(sim_device):
    x = torch.randn(4, 8)
    graph = sim_device.new_graph()
    with sim_device.graph(graph):
        buffer = torch.empty(4, 8)  # an allocation: pool memory, no kernel
        like = torch.empty_like(x)
        buffer.copy_(x * 2)
        like.copy_(x + 1)
    assert graph.recorded_ops() == ["aten.mul.Tensor", "aten.copy_.default", "aten.add.Tensor", "aten.copy_.default"]
    assert graph.num_tasks == graph.program.num_kernels == 4
    assert graph.pool_bytes == 4 * (4 * 8 * 4), "two allocations + the two temporaries of mul and add"
    sim_device.set_record_kernels(True)
    graph.replay()
    sim_device.synchronize()
    assert [r.name for r in sim_device.kernel_records] == graph.recorded_ops()
    assert torch.equal(buffer, x * 2) and torch.equal(like, x + 1)


def test_a_host_assert_runs_at_capture_and_is_never_replayed(sim_device):
    x = torch.randn(3)
    graph = sim_device.new_graph()
    with sim_device.graph(graph):
        torch.ops.aten._assert_scalar(True, "num_tokens >= 0")
        y = x * 3
    assert graph.recorded_ops() == ["aten.mul.Tensor"]
    other = sim_device.new_graph()
    with pytest.raises(RuntimeError, match="num_tokens >= 0"):
        with sim_device.graph(other):
            torch.ops.aten._assert_scalar(False, "num_tokens >= 0")
    assert other.state == "idle" and other.num_tasks == 0
    graph.replay()
    sim_device.synchronize()
    assert torch.equal(y, x * 3)


def test_eager_allocations_and_asserts_cost_nothing_and_leave_no_kernel_record(sim_device):
    sim_device.set_record_kernels(True)
    with sim_device.track_eager():
        before = sim_device.clock()
        out = torch.empty(2, 4)
        torch.empty_like(out)
        torch.empty_strided((2, 4), (4, 1))
        torch.ops.aten._assert_scalar(True, "num_tokens >= 0")
        assert sim_device.clock() == before and sim_device.kernel_records == []
        torch.zeros(2, 4)  # a fill: the device runs a kernel for it
    assert [r.name for r in sim_device.kernel_records] == ["aten.zeros.default"]
    assert sim_device.clock()[0] > before[0]


# --------------------------------------------------------------------------- memoised meta outputs


def test_meta_outputs_are_memoised_on_the_argument_signature():
    from sim import recorder

    recorder._meta_cache.clear()
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    first = recorder.meta_outputs(torch.ops.aten.mm.default, (a, b), {})
    assert first.device.type == "meta" and first.shape == (3, 5)
    # other data, same sizes / strides / dtype: the same answer, not recomputed
    again = recorder.meta_outputs(torch.ops.aten.mm.default, (torch.zeros(3, 4), torch.ones(4, 5)), {})
    assert again is first
    # anything a meta kernel can see changes the key
    transposed = torch.randn(5, 4).t()
    strided = recorder.meta_outputs(torch.ops.aten.mm.default, (a, transposed), {})
    assert strided is not first and strided.shape == (3, 5)
    half = recorder.meta_outputs(torch.ops.aten.mm.default, (a.double(), b.double()), {})
    assert half.dtype == torch.float64
    summed = recorder.meta_outputs(torch.ops.aten.sum.dim_IntList, (a, [1]), {"keepdim": True})
    assert summed.shape == (3, 1)
    assert recorder.meta_outputs(torch.ops.aten.sum.dim_IntList, (a, [1]), {"keepdim": False}).shape == (3,)


def test_ops_without_a_meta_kernel_and_unsignable_arguments():
    from sim import recorder

    class Opaque:
        pass

    def no_meta(*args, **kwargs):
        raise NotImplementedError("no meta kernel")

    assert recorder.meta_outputs(no_meta, (torch.randn(2),), {}) is recorder.NO_META
    before = len(recorder._meta_cache)
    calls = []

    def counting(x, opaque):
        calls.append(opaque)
        return torch.empty_like(x)

    recorder.meta_outputs(counting, (torch.randn(2), Opaque()), {})
    recorder.meta_outputs(counting, (torch.randn(2), Opaque()), {})
    assert len(calls) == 2 and len(recorder._meta_cache) == before  # never memoised


def test_a_signature_tells_apart_what_a_kernel_can_see():
    from sim import recorder

    x = torch.randn(2, 3)
    key = recorder.call_signature(torch.ops.aten.add.Tensor, (x, 1), {})
    # 1, 1.0 and True are equal in Python but promote differently: their types are in the key
    assert key != recorder.call_signature(torch.ops.aten.add.Tensor, (x, 1.0), {})
    assert key != recorder.call_signature(torch.ops.aten.add.Tensor, (x, True), {})
    assert key == recorder.call_signature(torch.ops.aten.add.Tensor, (torch.zeros(2, 3), 1), {})
    assert key != recorder.call_signature(torch.ops.aten.add.Tensor, (x.t().contiguous().t(), 1), {}), "strides"
    assert key != recorder.call_signature(torch.ops.aten.add.Tensor, (x[:, 1:], 1), {}), "sizes and offset"
    assert key != recorder.call_signature(torch.ops.aten.add.Tensor, (x.double(), 1), {}), "dtype"
    lists = recorder.call_signature(torch.ops.aten.sum.dim_IntList, (x, [1]), {})
    assert lists != recorder.call_signature(torch.ops.aten.sum.dim_IntList, (x, (1,)), {}), "list vs tuple"
    assert lists != recorder.call_signature(torch.ops.aten.sum.dim_IntList, (x, [0]), {})

    class Opaque:
        pass

    assert recorder.call_signature(torch.ops.aten.add.Tensor, (x, Opaque()), {}) is None


def test_a_value_read_of_host_memory_is_allowed_in_capture_and_of_device_memory_refused(sim_device):
    # SimDevice.host_memory says which tensors live in host memory (the torch_npu facade: every
    # CPU tensor, its device tensors being npu tensors). Reading those during a capture is host
    # work; any other tensor stands for device memory, and reading it would wait for the device.
    from ascendgraph.errors import CaptureConstraintError

    host, device_tensor = torch.tensor([3, 5], dtype=torch.int32), torch.tensor([3, 5], dtype=torch.int32)
    sim_device.host_memory = lambda tensor: tensor.untyped_storage().data_ptr() == host.untyped_storage().data_ptr()
    x = torch.randn(4)
    graph = sim_device.new_graph()
    with sim_device.graph(graph):
        assert host.tolist() == [3, 5] and int(host[1]) == 5  # host reads: no task, no refusal
        y = x * 2
    assert graph.recorded_ops() == ["aten.mul.Tensor"]
    with pytest.raises(CaptureConstraintError, match=r"Tensor.tolist\(\) synchronizes with the host"):
        with sim_device.graph(sim_device.new_graph()):
            device_tensor.tolist()
    with pytest.raises(CaptureConstraintError, match="Reading a tensor's value on the host"):
        with sim_device.graph(sim_device.new_graph()):
            torch.ops.aten._local_scalar_dense(device_tensor[0])
    sim_device.host_memory = None  # the simulator's default: every tensor is device memory
    with pytest.raises(CaptureConstraintError, match=r"Tensor.tolist\(\) synchronizes with the host"):
        with sim_device.graph(sim_device.new_graph()):
            host.tolist()
    graph.replay()
    sim_device.synchronize()
    assert torch.equal(y, x * 2)
