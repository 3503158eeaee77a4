"""The virtual clock's cost model."""

from __future__ import annotations

import pytest
import torch

import sim  # noqa: F401
from sim.cost import CostModel, CostParams, describe_task

aten = torch.ops.aten
A = torch.ops.ascendgraph
PARAMS = CostParams(task_overhead_us=1.0, peak_tflops=1.0, bandwidth_gbps=1.0)


def test_matmul_flops_are_two_m_n_k():
    a, b = torch.ones(8, 32), torch.ones(32, 16)
    out = a @ b
    task = describe_task(aten.mm.default, (a, b), {}, [out], PARAMS)
    assert task.flops == 2 * 8 * 16 * 32 and task.op_type == "mm"
    bias = torch.ones(16)
    task = describe_task(aten.addmm.default, (bias, a, b), {}, [out], PARAMS)
    assert task.flops == 2 * 8 * 16 * 32


def test_elementwise_ops_count_one_flop_per_output_and_their_bytes():
    x = torch.ones(10)
    task = describe_task(aten.add.Tensor, (x, x), {}, [x + x], PARAMS)
    assert task.flops == 10 and task.bytes == 3 * 40
    assert task.input_shapes == ((10,), (10,)) and task.output_dtypes == ("float32",)


def test_duration_is_overhead_plus_the_roofline_bound():
    # 64 x 64 x 64 matmul in float32 at 1 TFLOP/s and 1 GB/s, worked by hand:
    # compute 2 * 64**3 = 524,288 flop -> 0.524 us; memory 3 * 64 * 64 * 4 = 49,152 bytes -> 49.152 us;
    # memory-bound, so 1 us overhead + 49.152 us
    a, b = torch.ones(64, 64), torch.ones(64, 64)
    task = describe_task(aten.mm.default, (a, b), {}, [a @ b], PARAMS)
    assert task.duration_us == pytest.approx(50.152)
    compute_bound = CostParams(task_overhead_us=1.0, peak_tflops=1.0, bandwidth_gbps=1e6)
    task = describe_task(aten.mm.default, (a, b), {}, [a @ b], compute_bound)
    assert task.duration_us == pytest.approx(1.0 + 0.524288)


def test_attention_counts_only_the_visible_pairs_and_the_kv_it_reads():
    q = torch.ones(3, 4, 8)
    cache = torch.ones(100, 16, 2, 8)
    args = (q, cache, cache, torch.zeros(2, 4), [1, 3], [10, 5])
    task = describe_task(A.paged_attention.default, args + (0.1, torch.empty_like(q)), {}, [], PARAMS)
    # request 0: 1 query x 10 keys; request 1: 2 queries seeing 4 and 5 keys
    assert task.flops == 4 * 4 * 8 * (10 + 4 + 5)
    assert task.bytes == 2 * 15 * 2 * 8 * 4 + 2 * q.numel() * 4


def test_graph_launch_and_capture_costs_grow_with_tasks():
    model = CostModel(PARAMS)
    assert model.graph_launch_us(100) > model.graph_launch_us(1)
    priced = CostModel(CostParams(capture_base_us=5.0, capture_per_task_us=0.5, graph_launch_us=2.0,
                                  graph_launch_per_task_us=0.25))
    assert priced.capture_us(10) == pytest.approx(10.0)  # 5 + 10 * 0.5
    assert priced.graph_launch_us(8) == pytest.approx(4.0)  # 2 + 8 * 0.25


def test_the_task_adjust_hook_rescales_graph_tasks_only():
    model = CostModel(PARAMS, task_adjust=lambda task: task.duration_us / 2)
    x = torch.ones(1000)
    eager = model.task(aten.relu.default, (x,), {}, [x])
    graph = model.graph_task(aten.relu.default, (x,), {}, [x])
    assert graph.duration_us == pytest.approx(eager.duration_us / 2)


def test_task_infos_are_memoised_on_the_call_signature_and_equal_a_fresh_description():
    model = CostModel()
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    out = torch.empty(8, 4)
    first = model.task(torch.ops.aten.mm.default, (a, b), {}, [out])
    assert first == describe_task(torch.ops.aten.mm.default, (a, b), {}, [out], model.params)
    # other data, same signature: the memoised TaskInfo
    assert model.task(torch.ops.aten.mm.default, (torch.ones(8, 16), torch.zeros(16, 4)), {}, [out]) is first
    # anything the description reads changes the key: sizes, dtypes, outputs
    bigger = model.task(torch.ops.aten.mm.default, (torch.randn(9, 16), b), {}, [torch.empty(9, 4)])
    assert bigger.flops > first.flops
    halves = model.task(torch.ops.aten.mm.default, (a.half(), b.half()), {}, [out.half()])
    assert halves.input_dtypes == ("float16", "float16")
    # the attention's host lists are part of the key (its cost reads them)
    q, cache = torch.randn(4, 2, 8), torch.randn(3, 16, 1, 8)
    table = torch.zeros(2, 3, dtype=torch.int32)
    short = model.task(torch.ops.ascendgraph.paged_attention.default, (q, cache, cache, table, [2, 4], [2, 2]), {}, [])
    long = model.task(torch.ops.ascendgraph.paged_attention.default, (q, cache, cache, table, [2, 4], [20, 30]), {}, [])
    assert long.bytes > short.bytes and long == describe_task(
        torch.ops.ascendgraph.paged_attention.default, (q, cache, cache, table, [2, 4], [20, 30]), {}, [], model.params
    )
    # kwargs in another order: the inputs' order of the description follows them
    x, y = torch.randn(2, 3), torch.randn(2, 5)
    one = model.task(torch.ops.aten.cat.default, (), {"tensors": [x], "dim": 0}, [x])
    two = model.task(torch.ops.aten.cat.default, (), {"dim": 0, "tensors": [y]}, [y])
    assert one.input_shapes == ((2, 3),) and two.input_shapes == ((2, 5),)
    # new params: nothing memoised under the old ones is handed back
    model.params = CostParams(task_overhead_us=model.params.task_overhead_us + 100)
    assert model.task(torch.ops.aten.mm.default, (a, b), {}, [out]).duration_us > first.duration_us
