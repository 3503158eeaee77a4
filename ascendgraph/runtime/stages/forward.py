"""Forward plumbing shared by the stages: the persistent input buffers, the forward context,
one forward of the compiled model, and the measure (CPU time, device time, kernels) of a block.

Capture (dummy batches), serve (scheduled batches) and check (the eager reference) all run the
model through these helpers.
"""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from typing import Iterator, Sequence

import torch

from ascendgraph.compile.backend import CompiledModel
from ascendgraph.device import Device
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.models.build import DecoderModel
from ascendgraph.modes import GraphMode
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, KVCache, set_forward_context
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.stages.records import Inputs, Measure
from ascendgraph.runtime.workload import ScheduledBatch

__all__ = ["ForwardPlumbing"]


class ForwardPlumbing:
    """Writing inputs and running one forward (a part of `Engine`, readable on its own)."""

    device: Device
    model: DecoderModel
    compiled: CompiledModel
    kv_caches: dict[str, KVCache]
    reference_kv_caches: dict[str, KVCache]
    graph_params: GraphParams
    inputs: Inputs
    query_len: int

    def _context(
        self, mode: GraphMode, descriptor: BatchDescriptor, metadata: AttentionMetadata, *, reference: bool = False
    ) -> ForwardContext:
        return ForwardContext(
            runtime_mode=mode,
            batch_descriptor=descriptor,
            attn_metadata=metadata,
            kv_caches=self.reference_kv_caches if reference else self.kv_caches,
            attention_layers=self.model.attention_layers,
            device=self.device,
            graph_params=None if reference else self.graph_params,
        )

    def _write_batch(self, batch: ScheduledBatch, *, padded_tokens: int, padded_rows: int) -> None:
        """The persistent buffers for a scheduled batch: its requests' tokens, positions, slots, blocks."""
        requests = batch.requests
        self._write_inputs(
            [t for r in requests for t in r.token_ids],
            [r.start_position + i for r in requests for i in range(r.num_tokens)],
            [s for r in requests for s in r.slot_ids],
            [r.block_ids for r in requests],
            padded_tokens=padded_tokens,
            padded_rows=padded_rows,
        )

    def _write_inputs(
        self,
        token_ids: Sequence[int],
        positions: Sequence[int],
        slots: Sequence[int],
        block_rows: Sequence[Sequence[int]],
        *,
        padded_tokens: int,
        padded_rows: int,
    ) -> None:
        """Fill the persistent buffers for one forward (padding: token 0, position 0, slot -1)."""
        inputs = self.inputs
        device = inputs.input_ids.device
        count = len(token_ids)
        inputs.input_ids[:count].copy_(torch.tensor(token_ids, dtype=torch.long, device=device))
        inputs.positions[:count].copy_(torch.tensor(positions, dtype=torch.long, device=device))
        inputs.slot_mapping[:count].copy_(torch.tensor(slots, dtype=torch.long, device=device))
        if padded_tokens > count:
            inputs.input_ids[count:padded_tokens].zero_()
            inputs.positions[count:padded_tokens].zero_()
            inputs.slot_mapping[count:padded_tokens].fill_(-1)
        table = inputs.block_table
        table[: max(padded_rows, len(block_rows))].zero_()
        for row, blocks in enumerate(block_rows):
            if blocks:
                table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32, device=device)

    def _forward(
        self, mode: GraphMode, descriptor: BatchDescriptor, metadata: AttentionMetadata, padded_tokens: int
    ) -> torch.Tensor:
        with set_forward_context(self._context(mode, descriptor, metadata)):
            return self.compiled(self.inputs.input_ids[:padded_tokens], self.inputs.positions[:padded_tokens])

    def _table_rows(self, batch: ScheduledBatch, descriptor: BatchDescriptor) -> int:
        """Block-table rows a batch's metadata exposes: its requests and the graph's padded ones,
        plus one zero row for the dummy request of FULL padding (`fia_padded_lengths`)."""
        return min(max(batch.num_reqs, descriptor.num_reqs or 0) + 1, self.inputs.block_table.shape[0])

    def _batch_metadata(
        self, batch: ScheduledBatch, descriptor: BatchDescriptor, padded_tokens: int
    ) -> AttentionMetadata:
        rows = self._table_rows(batch, descriptor)
        return AttentionMetadata(
            num_reqs=batch.num_reqs,
            num_actual_tokens=batch.num_tokens,
            num_tokens=padded_tokens,
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_table=self.inputs.block_table[:rows],
            slot_mapping=self.inputs.slot_mapping[:padded_tokens],
            uniform_decode=descriptor.uniform,
            query_len=self.query_len,
        )

    @contextmanager
    def _measured(self) -> Iterator[Measure]:
        """Host CPU time, virtual device time and kernel records of the block (eager ops are
        tracked on devices that price them, e.g. the simulator's ``track_eager``)."""
        measure = Measure()
        track = getattr(self.device, "track_eager", None)
        records = getattr(self.device, "kernel_records", None)
        kernels_before = len(records) if records is not None else 0
        before = self.device.stats().virtual_time_us
        cpu_before = time.process_time()
        with track() if track is not None else nullcontext():
            yield measure
        measure.cpu_s = time.process_time() - cpu_before
        measure.device_us = self.device.stats().virtual_time_us - before
        measure.kernels = (len(records) - kernels_before) if records is not None else 0
