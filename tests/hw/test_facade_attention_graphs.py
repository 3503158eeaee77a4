"""Captured fused attention on the facade computes what the step's arguments ask for, and a
workspace too small for the step is refused (docs/facade.md, the kernel audit table).

vLLM Ascend captures FULL graphs with a dummy decode batch and re-issues every step's
lengths into the captured kernels (vllm_ascend/attention/attention_v1.py@182b75ea
``full_graph_fia`` 918-1087 and ``update_graph_params`` 850-913; the v2 sinks path
1089-1213 and 609-705). So a graph captured at Q_S == 1 (where the sparse mode does
nothing, op docs :8117) is replayed for mixed batches where it does: causal prefill chunks,
sliding windows (sparse_mode 4, ``pre_tokens`` = window, ``next_tokens`` = 0) and non-causal
layers (sparse_mode 0). Each step's graph output is compared with the eager kernel (bit for
bit) and with the row-by-row reference of the op docs (tests/sim/attention_reference.py,
computed on host copies). The tensors are npu tensors, as vLLM Ascend's are.
"""

from __future__ import annotations

import math
from typing import Any, Optional

import pytest
import torch

from ascendgraph.errors import KernelContractError
from tests.sim.attention_reference import fused_attention

HEAD_DIM, BLOCK_SIZE, BLOCKS = 128, 128, 40
INT_MAX = 2147483647
MASK = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1)  # host copy: .npu() per use


def randn(*shape: int, seed: int) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / 2).to(torch.bfloat16).npu()


def int32(rows: Any) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.int32, device="npu")


def on_host(call: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments with npu tensors copied to the host (for the reference)."""
    return {name: value.cpu() if isinstance(value, torch.Tensor) else value for name, value in call.items()}


class Attention:
    """One attention layer as vLLM Ascend calls the fused kernel: its caches, heads and mode."""

    def __init__(self, seed: int, *, heads: int = 4, kv_heads: int = 2, v2: bool = False, mode: int = 3,
                 window: Optional[int] = None, sinks: bool = False) -> None:
        self.heads, self.kv_heads, self.v2 = heads, kv_heads, v2
        self.key = randn(BLOCKS, BLOCK_SIZE, kv_heads * HEAD_DIM, seed=seed)
        self.value = randn(BLOCKS, BLOCK_SIZE, kv_heads * HEAD_DIM, seed=seed + 1)
        self.mode = 4 if window is not None else mode
        self.window = window
        self.sink = torch.linspace(-1, 1, heads).to(torch.bfloat16).npu() if sinks else None
        self.mask = MASK.npu()

    def kwargs(self, table: torch.Tensor, ends: list[int], lens: list[int]) -> dict[str, Any]:
        mask = None if self.mode == 0 else self.mask
        pre = self.window if self.window is not None else INT_MAX
        nxt = 0 if self.window is not None else INT_MAX
        common = dict(atten_mask=mask, block_table=table, input_layout="TND", num_key_value_heads=self.kv_heads,
                      sparse_mode=self.mode, block_size=BLOCK_SIZE, pre_tokens=pre, next_tokens=nxt)
        if self.v2:
            return dict(common, actual_seq_qlen=ends, actual_seq_kvlen=lens, num_query_heads=self.heads,
                        softmax_scale=1 / math.sqrt(HEAD_DIM), learnable_sink=self.sink)
        return dict(common, actual_seq_lengths=ends, actual_seq_lengths_kv=lens, num_heads=self.heads,
                    scale=1 / math.sqrt(HEAD_DIM))

    def op(self, torch_npu: Any) -> Any:
        return torch_npu.npu_fused_infer_attention_score_v2 if self.v2 else torch_npu.npu_fused_infer_attention_score

    def workspace(self, torch_npu: Any, query: torch.Tensor, table: torch.Tensor, ends: list[int],
                  lens: list[int]) -> torch.Tensor:
        query_fn = (torch_npu._npu_fused_infer_attention_score_v2_get_max_workspace if self.v2
                    else torch_npu._npu_fused_infer_attention_score_get_max_workspace)
        return query_fn(query, self.key, self.value, **self.kwargs(table, ends, lens))


class Captured:
    """A FULL graph of ``size`` tokens over ``layers``: captured with a decode batch of
    ``size`` requests of KV length 1, then stepped in vLLM's order (replay, then on the update
    stream: task update with the step's lengths and block table, record the event)."""

    def __init__(self, torch_npu: Any, layers: list[Attention], size: int, *, pool: Any = None,
                 workspace: Optional[torch.Tensor] = None, one_workspace: bool = True) -> None:
        self.torch_npu, self.layers, self.size = torch_npu, layers, size
        self.query = randn(size, max(layer.heads for layer in layers), HEAD_DIM, seed=100 + size)
        self.tables = torch.zeros(size, 2, dtype=torch.int32, device="npu")  # the runner's persistent block table
        self.outputs = [torch.zeros(size, layer.heads, HEAD_DIM, dtype=torch.bfloat16, device="npu") for layer in layers]
        self.lse = torch.empty(1, dtype=torch.bfloat16, device="npu")
        self.handles: list[Any] = []
        self.events: list[Any] = []
        self.workspaces: list[torch.Tensor] = []
        ends, lens = list(range(1, size + 1)), [1] * size
        self.graph = torch.npu.NPUGraph()
        with torch.npu.graph(self.graph, pool=pool):
            for layer, out in zip(layers, self.outputs):
                query = self._query(layer)
                if workspace is None or not one_workspace:
                    workspace = layer.workspace(torch_npu, query, self.tables, ends, lens)
                self.workspaces.append(workspace)
                stream = torch_npu.npu.current_stream()
                event = torch.npu.ExternalEvent()
                event.wait(stream)
                event.reset(stream)
                torch.npu.graph_task_group_begin(stream)
                try:  # a refused kernel still closes its group, so the capture ends on the kernel's error
                    layer.op(torch_npu).out(query, layer.key, layer.value, **layer.kwargs(self.tables, ends, lens),
                                            workspace=workspace, out=[out, self.lse])
                finally:
                    handle = torch.npu.graph_task_group_end(stream)
                self.handles.append(handle)
                self.events.append(event)

    def _query(self, layer: Attention) -> torch.Tensor:
        return self.query if layer.heads == self.query.shape[1] else self.query[:, : layer.heads].contiguous()

    def step(self, ends: list[int], lens: list[int], rows: list[list[int]], update_stream: Any, *,
             workspace: Optional[torch.Tensor] = None) -> None:
        requests = len(ends)
        self.tables.zero_()
        self.tables[:requests] = int32(rows)
        table = self.tables[:requests]  # the step's rows of the runner's table (what the v1 update passes)
        self.graph.replay()
        with torch.npu.stream(update_stream):
            for index, (layer, handle, event, out) in enumerate(zip(self.layers, self.handles, self.events,
                                                                    self.outputs)):
                torch.npu.graph_task_update_begin(update_stream, handle)
                try:
                    layer.op(self.torch_npu).out(
                        self._query(layer), layer.key, layer.value, **layer.kwargs(table, ends, lens),
                        workspace=workspace if workspace is not None else self.workspaces[index], out=[out, self.lse])
                finally:
                    torch.npu.graph_task_update_end(update_stream)
                event.record(update_stream)
        torch.npu.synchronize()

    def expected(self, index: int, ends: list[int], lens: list[int], rows: list[list[int]]) -> torch.Tensor:
        layer = self.layers[index]
        table = int32(rows)
        call = dict(query=self._query(layer), key=layer.key, value=layer.value, **layer.kwargs(table, ends, lens))
        reference, _ = fused_attention(on_host(call), v2=layer.v2)
        eager, _ = layer.op(self.torch_npu)(self._query(layer), layer.key, layer.value, **layer.kwargs(table, ends, lens))
        assert torch.equal(self.outputs[index], eager)  # the graph's kernel is the eager one, bit for bit
        return reference


# A decode capture's steps: a mixed batch (two decodes and a prefill chunk of 2: Q_S = 2, the
# sparse mode acts), then a decode batch (Q_S = 1: it does not).
MIXED = ([1, 2, 4], [131, 9, 3], [[0, 1], [2, 3], [4, 5]])
DECODE = ([1, 2, 3, 4], [129, 7, 3, 40], [[6, 7], [8, 9], [10, 11], [0, 1]])
LAYERS = {
    "causal v1": dict(mode=3),
    "sliding window v1": dict(window=3),
    "non-causal v1": dict(mode=0),
    "sliding window v2 with sinks": dict(v2=True, window=5, sinks=True),
    "causal v2 with sinks": dict(v2=True, sinks=True),
}


@pytest.mark.parametrize("options", LAYERS.values(), ids=list(LAYERS))
def test_a_decode_capture_replayed_for_mixed_and_decode_batches_computes_each_steps_mode(
        torch_npu: Any, options: dict[str, Any]) -> None:
    layers = [Attention(seed=10, **options)]
    graph = Captured(torch_npu, layers, 4)
    update_stream = torch.npu.Stream()
    for ends, lens, rows in (MIXED, DECODE):
        graph.step(ends, lens, rows, update_stream)
        for index in range(len(layers)):
            expected = graph.expected(index, ends, lens, rows)
            torch.testing.assert_close(graph.outputs[index].float().cpu(), expected, atol=2e-2, rtol=2e-2)


def test_the_sparse_mode_changes_a_mixed_batchs_result_but_not_a_decode_batchs(torch_npu: Any) -> None:
    # What the test above guards against: a kernel that computes one mode whatever it is given
    # would agree with every mode at Q_S == 1 and disagree with them at Q_S > 1.
    table = int32(MIXED[2])
    query = randn(4, 4, HEAD_DIM, seed=3)
    results = {}
    for name, options in (("causal", dict(mode=3)), ("window", dict(window=3)), ("non-causal", dict(mode=0))):
        layer = Attention(seed=10, **options)
        results[name] = torch_npu.npu_fused_infer_attention_score(
            query, layer.key, layer.value, **layer.kwargs(table, MIXED[0], MIXED[1]))[0]
    assert not torch.equal(results["causal"], results["window"])
    assert not torch.equal(results["causal"], results["non-causal"])
    decode_table = int32(DECODE[2])
    decode = [torch_npu.npu_fused_infer_attention_score(
        query, Attention(seed=10, **options).key, Attention(seed=10, **options).value,
        **Attention(seed=10, **options).kwargs(decode_table, DECODE[0], DECODE[1]))[0]
        for options in (dict(mode=3), dict(window=3), dict(mode=0))]
    assert torch.equal(decode[0], decode[1]) and torch.equal(decode[0], decode[2])


def test_a_non_causal_layer_given_the_causal_mask_with_sparse_mode_0_masks_the_upper_triangle(torch_npu: Any) -> None:
    # vLLM Ascend's AttentionMaskBuilder.get_attention_mask returns no mask for non-causal
    # layers because FIA applies a mask given with sparse_mode 0 as defaultMask
    # (attention_mask.py@182b75ea:58-66): the 2048 mask then hides j > i of every request.
    layer = Attention(seed=10, mode=0)
    table = int32(MIXED[2])
    query = randn(4, 4, HEAD_DIM, seed=4)
    kwargs = layer.kwargs(table, MIXED[0], MIXED[1])
    without = torch_npu.npu_fused_infer_attention_score(query, layer.key, layer.value, **kwargs)[0]
    masked_kwargs = {**kwargs, "atten_mask": layer.mask}
    masked = torch_npu.npu_fused_infer_attention_score(query, layer.key, layer.value, **masked_kwargs)[0]
    reference, _ = fused_attention(on_host(dict(query=query, key=layer.key, value=layer.value, **masked_kwargs)))
    torch.testing.assert_close(masked.float().cpu(), reference, atol=2e-2, rtol=2e-2)
    assert not torch.equal(masked, without)


# --------------------------------------------------------------------------- workspace sizes


def test_a_capture_sizes_workspace_handed_to_a_larger_sizes_update_is_refused(torch_npu: Any) -> None:
    # Two sizes share one pool, each with its own workspace (vLLM Ascend keys them by num_tokens,
    # graph_params.workspaces.get(num_tokens)). A step of the 16-token graph re-issued with the
    # 2-token graph's workspace needs more than it holds: refused, naming the rule.
    pool = torch.npu.graph_pool_handle()
    layers = [Attention(seed=10)]
    large = Captured(torch_npu, layers, 16, pool=pool)
    small = Captured(torch_npu, layers, 2, pool=pool)
    update_stream = torch.npu.Stream()
    ends, lens = list(range(1, 17)), [5] * 16
    rows = [[i % BLOCKS, (i + 1) % BLOCKS] for i in range(16)]
    large.step(ends, lens, rows, update_stream)  # its own workspace: fine
    with pytest.raises(KernelContractError, match="workspace_too_small") as info:
        large.step(ends, lens, rows, update_stream, workspace=small.workspaces[0])
    assert "_npu_fused_infer_attention_score_get_max_workspace" in str(info.value)


def test_one_workspace_per_size_queried_by_a_smaller_layer_is_refused_for_a_larger_one(torch_npu: Any) -> None:
    # Layers of different shapes under one graph size: the first layer's workspace is too small
    # for a layer with more heads (vLLM Ascend's use_max_workspace / cache_graph_workspace keeps the
    # largest, attention/utils.py@182b75ea:105-124); querying per layer and keeping the largest passes.
    small, large = Attention(seed=10, heads=1, kv_heads=1), Attention(seed=20, heads=8, kv_heads=2)
    with pytest.raises(KernelContractError, match="workspace_too_small"):
        Captured(torch_npu, [small, large], 8)
    torch.npu.synchronize()
    graph = Captured(torch_npu, [large, small], 8)  # the larger layer first: its workspace serves both
    assert graph.workspaces[0] is graph.workspaces[1]


def test_the_workspace_query_grows_with_the_calls_shapes_and_not_with_its_lengths(torch_npu: Any) -> None:
    layer = Attention(seed=10)
    table = torch.zeros(4, 2, dtype=torch.int32, device="npu")

    def size(tokens: int, lens: list[int], table: torch.Tensor = table, heads: int = 4) -> int:
        query = randn(tokens, heads, HEAD_DIM, seed=1)
        ends = list(range(1, tokens + 1)) if tokens == 4 else [tokens // 4 * (i + 1) for i in range(4)]
        return int(layer.workspace(torch_npu, query, table, ends, lens).numel())

    assert size(4, [1, 1, 1, 1]) == size(4, [200, 7, 250, 3])  # the lengths: a "max" workspace
    assert size(8, [2, 2, 2, 2]) > size(4, [1, 1, 1, 1])  # more query tokens
    wider = torch.zeros(4, 40, dtype=torch.int32, device="npu")  # a block table reaching past one KV split
    assert size(4, [1, 1, 1, 1], wider) > size(4, [1, 1, 1, 1])


def test_hw_leaves_the_workspace_size_to_cann_while_the_simulator_checks_its_model() -> None:
    # The size model is the simulator's (ascendgraph/workspace_sizes.py): on a card CANN sized
    # the workspace hw passes, so hw's pre-check skips the rule; the simulator's kernels keep it.
    from ascendgraph.kernel_calls import check_op
    from hw.kernels import _contract_check

    query = torch.zeros(4, 4, 16, dtype=torch.bfloat16)
    cache = torch.zeros(8, 128, 2, 16, dtype=torch.bfloat16)
    table = torch.zeros(4, 2, dtype=torch.int32)
    args = (query, cache, cache.clone(), table, [1, 2, 3, 4], [5, 6, 7, 8], 0.25, torch.zeros_like(query),
            torch.empty(64, dtype=torch.uint8))
    with pytest.raises(KernelContractError, match="workspace_too_small"):
        check_op("paged_attention", args, in_graph=True)
    _contract_check()("paged_attention", args, in_graph=True)


@pytest.mark.parametrize("v2", [False, True], ids=["v1", "v2"])
def test_an_attention_task_re_issued_without_its_workspace_in_a_task_update_is_refused(torch_npu: Any, v2: bool) -> None:
    # The op doc's graph use needs the caller's workspace (_op_plugin_docs.py:8524, 9049); an update
    # that leaves it out (vLLM Ascend's update_graph_params, attention_v1.py@182b75ea:905, passes the
    # captured one) would hand the task the per-stream workspace the next launch reuses.
    from sim.facade.runtime import TaskGroupAllocation

    layer = Attention(seed=10, v2=v2, sinks=v2)
    graph = Captured(torch_npu, [layer], 4)
    update_stream = torch.npu.Stream()
    table = int32([[0, 1]] * 4)
    graph.graph.replay()
    with torch.npu.stream(update_stream):
        torch.npu.graph_task_update_begin(update_stream, graph.handles[0])
        with pytest.raises(TaskGroupAllocation, match=r"simulator strictness: npu_fused_infer_attention_score"
                                                      rf"{'_v2' if v2 else ''}\.out without a workspace"):
            layer.op(torch_npu).out(graph.query, layer.key, layer.value, **layer.kwargs(table, [1, 2, 3, 4], [3] * 4),
                                    workspace=None, out=[graph.outputs[0], graph.lse])
        layer.op(torch_npu).out(graph.query, layer.key, layer.value, **layer.kwargs(table, [1, 2, 3, 4], [3] * 4),
                                workspace=graph.workspaces[0], out=[graph.outputs[0], graph.lse])  # as captured
        torch.npu.graph_task_update_end(update_stream)
        graph.events[0].record(update_stream)
    torch.npu.synchronize()
