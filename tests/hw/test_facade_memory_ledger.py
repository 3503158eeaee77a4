"""The memory ledger says what each captured graph keeps alive and why, and the check reports
what a graph holds that it need not (sim/memory_ledger.py, docs/facade.md "Memory held by
graphs"). The captures follow vLLM Ascend's FULL-graph attention (attention_v1.py@182b75ea
``full_graph_fia``): one workspace per capture size queried inside the capture, a
``softmax_lse`` allocated before the task group, a parameter record per layer and size."""

from __future__ import annotations

import math
from typing import Any

import torch

from sim.memory_ledger import CAPTURED_OUTPUT, PARAMETER_RECORD, POOL_BLOCK, WORKSPACE

HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, BLOCKS = 8, 2, 128, 128, 16


class Model:
    """The static tensors of one attention layer (mask, caches, block table), outside any pool."""

    def __init__(self) -> None:
        self.mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool, device="npu"), diagonal=1)
        self.key = torch.zeros(BLOCKS, BLOCK_SIZE, KV_HEADS * HEAD_DIM, dtype=torch.bfloat16, device="npu")
        self.value = torch.zeros_like(self.key)
        self.table = torch.zeros(16, 2, dtype=torch.int32, device="npu")

    def kwargs(self, size: int) -> dict[str, Any]:
        return dict(atten_mask=self.mask, actual_seq_lengths=list(range(1, size + 1)), actual_seq_lengths_kv=[1] * size,
                    block_table=self.table[:size], num_heads=HEADS, scale=1 / math.sqrt(HEAD_DIM), input_layout="TND",
                    num_key_value_heads=KV_HEADS, sparse_mode=3, block_size=BLOCK_SIZE)


def capture(torch_npu: Any, model: Model, size: int, pool: Any, *, weak: bool) -> tuple[Any, tuple, torch.Tensor]:
    """A graph of ``size`` tokens; returns (graph, its parameter record, its workspace) with the
    record's tensors and the workspace weak (as vLLM Ascend keeps them) or strong."""
    weak_ref = torch_npu._C._weak_ref_tensor if weak else (lambda tensor: tensor)
    query = torch.zeros(size, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="npu")
    out = torch.zeros_like(query)
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph, pool=pool):
        workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
            query, model.key, model.value, **model.kwargs(size))
        softmax_lse = torch.empty(1, dtype=query.dtype, device="npu")
        stream = torch_npu.npu.current_stream()
        torch.npu.graph_task_group_begin(stream)
        torch_npu.npu_fused_infer_attention_score.out(query, model.key, model.value, **model.kwargs(size),
                                                      workspace=workspace, out=[out, softmax_lse])
        torch.npu.graph_task_group_end(stream)
    record = (weak_ref(query), weak_ref(model.key), weak_ref(model.table), weak_ref(out), weak_ref(softmax_lse),
              size, list(range(1, size + 1)))
    return graph, record, weak_ref(workspace)


def test_a_parameter_record_holding_tensors_strongly_is_reported_and_a_weak_one_is_not(torch_npu: Any) -> None:
    from sim import facade

    model = Model()
    pool = torch.npu.graph_pool_handle()
    weak_graph, weak_record, _ = capture(torch_npu, model, 8, pool, weak=True)
    strong_graph, strong_record, _ = capture(torch_npu, model, 4, pool, weak=False)
    check = facade.check_memory(records={weak_graph: [weak_record], strong_graph: [strong_record]})
    strong = [f for f in check.findings if f.kind == "strong_reference"]
    assert strong and {f.graph for f in strong} == {strong_graph.sim_graph.name}
    holders = " ".join(f.detail for f in strong)
    # the capture's softmax_lse is a block of the pool the record keeps from being reused; the
    # caches and the block table belong to the model, which a weak reference leaves them to
    assert "[0][4]" in holders and "a block of the graph pool" in holders
    assert "[0][1]" in holders and "[0][2]" in holders and "memory outside the graph pool" in holders
    weak_entries = [e for book in check.ledgers if book.graph == weak_graph.sim_graph.name for e in book.held
                    if e.why == PARAMETER_RECORD]
    assert weak_entries and not any(e.strong for e in weak_entries)


def test_the_ledger_names_what_each_graph_keeps_alive_and_why(torch_npu: Any) -> None:
    from sim import facade

    model = Model()
    graph, record, workspace = capture(torch_npu, model, 8, None, weak=True)
    query = torch.zeros(2, 2, device="npu")
    kept = []
    other = torch.npu.NPUGraph()
    with torch.npu.graph(other):
        kept.append(query + 1)  # an output the caller keeps
    check = facade.check_memory(records={graph: [record]}, workspaces={graph: {8: workspace}}, graphs=(other,))
    books = {book.graph: book for book in check.ledgers}
    reasons = {e.why for e in books[graph.sim_graph.name].held}
    assert {POOL_BLOCK, PARAMETER_RECORD, WORKSPACE} <= reasons
    assert books[graph.sim_graph.name].bytes(POOL_BLOCK) == graph.sim_graph.pool_bytes > 0
    assert [e.why for e in books[other.sim_graph.name].held if e.why != POOL_BLOCK] == [CAPTURED_OUTPUT]
    assert check.ok  # weak records, private pools: nothing held that need not be
    assert "captured output" in check.report()


def test_blocks_held_after_capture_grow_a_shared_pool_with_each_size_and_memory_allocated_shows_it(
        torch_npu: Any) -> None:
    from sim import facade

    def run(weak: bool) -> tuple[int, Any]:
        facade.configure()
        model = Model()
        pool = torch.npu.graph_pool_handle()
        # largest first; the records go (their query and output would count outside the pools)
        kept = [(graph, workspace) for graph, _, workspace in
                (capture(torch_npu, model, size, pool, weak=weak) for size in (16, 8, 4))]
        return torch.npu.memory_allocated(), facade.check_memory(workspaces=dict(kept)), kept

    weak_bytes, weak_check, _kept_weak = run(weak=True)
    strong_bytes, strong_check, _kept_strong = run(weak=False)
    assert weak_check.ok
    growth = [f for f in strong_check.findings if f.kind == "pool_growth"]
    assert len(growth) == 1 and growth[0].nbytes > 0
    assert strong_bytes == weak_bytes + growth[0].nbytes  # memory_allocated() carries the growth
