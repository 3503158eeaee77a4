"""FULL-graph parameter updates pair every layer with its own task group (docs/semantics.md §7).

Three attention layers that differ in everything the update hands their kernel: their own
KV caches, head counts (so each queries a workspace of its own size, vLLM Ascend's
mixed-layer rule: attention/utils.py@182b75ea ``cache_graph_workspace``), queries and
outputs; the forward runs them out of layer order (layer 2 first), so capture order and
layer index disagree. After each replay and update every layer must equal its eager
result; a record paired with another layer's task group is refused as stale parameters."""

from __future__ import annotations

import pytest
import torch

from ascendgraph import ops
from ascendgraph.compile.graph_wrapper import CaptureState, GraphWrapper
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import StaleGraphParams
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, set_forward_context
from ascendgraph.models.attention import AttentionCall
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.params import GraphParams

SCALE = 0.3
HEADS = (2, 4, 1)  # layer i has HEADS[i] query heads over one KV head; in forward order 1, 2, 4
FORWARD_ORDER = (2, 0, 1)


class Layers:
    def __init__(self, device) -> None:
        generator = torch.Generator().manual_seed(7)
        self.device = device
        self.caches = [(torch.randn(4, 128, 1, 16, generator=generator).bfloat16(),
                        torch.randn(4, 128, 1, 16, generator=generator).bfloat16()) for _ in HEADS]
        self.queries = [torch.randn(4, heads, 16, generator=generator).bfloat16() for heads in HEADS]
        self.block_table = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2], [0, 0]], dtype=torch.int32)
        self.descriptor = BatchDescriptor(4, 4, True)
        self.params = GraphParams(device)
        self.params.set_sizes([4])
        self.state = CaptureState(device, allowed=True, graph_params=self.params)
        self.wrapper = GraphWrapper(self._forward, GraphMode.FULL, self.state)
        self.captured = ([1, 2, 3, 4], [1, 1, 1, 1])

    def _forward(self) -> tuple[torch.Tensor, ...]:
        outs: dict[int, torch.Tensor] = {}
        ends, lens = self.captured
        for index in FORWARD_ORDER:
            key, value = self.caches[index]
            out = torch.empty_like(self.queries[index])
            self.params.capture_attention(self.descriptor, AttentionCall(
                f"layers.{index}", self.queries[index], key, value, self.block_table[:4], ends, lens, SCALE, out))
            outs[index] = out
        return tuple(outs[index] for index in range(len(HEADS)))

    def capture(self) -> None:
        for index in range(len(HEADS)):  # warm-up: every layer's kernel launched eagerly first
            self.eager(index, *self.captured)
        with set_forward_context(ForwardContext(GraphMode.FULL, self.descriptor, None, {}, graph_params=self.params)):
            self.wrapper()

    def step(self, seq_lens: list[int]) -> list[torch.Tensor]:
        metadata = AttentionMetadata(num_reqs=len(seq_lens), num_actual_tokens=len(seq_lens), num_tokens=4,
                                     query_start_loc=list(range(1, len(seq_lens) + 1)), seq_lens=list(seq_lens),
                                     block_table=self.block_table, slot_mapping=torch.zeros(4, dtype=torch.long),
                                     uniform_decode=True, query_len=1)
        with set_forward_context(ForwardContext(GraphMode.FULL, self.descriptor, None, {}, graph_params=self.params)):
            outs = self.wrapper()
        self.params.update(self.descriptor, metadata, query_len=1)
        self.device.synchronize()
        return [out.clone() for out in outs]

    def eager(self, index: int, ends: list[int], seq_lens: list[int]) -> torch.Tensor:
        key, value = self.caches[index]
        out = torch.empty_like(self.queries[index])
        ops.paged_attention(self.queries[index], key, value, self.block_table[: len(ends)], ends, seq_lens, SCALE, out)
        return out


def _matches_eager(layers: Layers, outs: list[torch.Tensor], seq_lens: list[int]) -> bool:
    padded = seq_lens + [0] * (4 - len(seq_lens))
    return all(torch.equal(out, layers.eager(index, [1, 2, 3, 4], padded)) for index, out in enumerate(outs))


def test_each_layer_is_updated_through_its_own_task_group_out_of_layer_order(sim_device):
    layers = Layers(sim_device)
    layers.capture()
    records = layers.params.records(layers.descriptor)
    assert [record.call.layer_name for record in records] == [f"layers.{i}" for i in FORWARD_ORDER]
    workspaces = {id(record.call.workspace) for record in records}
    assert len(workspaces) == len(HEADS)  # each layer, larger than the one before, queried its own
    for seq_lens in ([5, 3, 8], [100, 9, 17, 40], [6]):
        assert _matches_eager(layers, layers.step(seq_lens), seq_lens)


def test_a_record_paired_with_another_layers_task_group_is_caught(sim_device):
    # The planted wrong pairing: each record gets the other's task group but keeps its event. The
    # update then records layer 2's event before layer 2's group is re-issued, so the replay runs
    # that group with the capture's lengths: the device names it.
    layers = Layers(sim_device)
    layers.capture()
    records = layers.params._records[layers.descriptor]
    records[0].handle, records[1].handle = records[1].handle, records[0].handle
    with pytest.raises(StaleGraphParams, match="layer layers.2"):
        layers.step([5, 3, 8])
