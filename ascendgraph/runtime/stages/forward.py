"""Forward plumbing shared by the stages: the persistent input buffers, the forward context,
one forward of the compiled model (a scheduled batch or a dummy batch of a key's shape), and
the measure (CPU time, device time, kernels) of a block.

Capture (dummy batches), serve (scheduled batches) and check (the eager reference) all run the
model through one `ForwardPlumbing` object, which the engine builds and hands to each of them.
"""

from __future__ import annotations

import itertools
import time
from contextlib import contextmanager, nullcontext
from typing import Iterator, Sequence

import torch

from ascendgraph.compile.backend import CompiledModel
from ascendgraph.device import Device, KernelLog, VirtualClock
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.models.build import DecoderModel
from ascendgraph.modes import GraphMode
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, KVCache, set_forward_context
from ascendgraph.runtime.params import GraphParams
from ascendgraph.runtime.stages.records import Inputs, Measure
from ascendgraph.runtime.workload import ScheduledBatch

__all__ = ["ForwardPlumbing"]


class ForwardPlumbing:
    """Writing inputs and running one forward of the model, compiled or as the eager reference.

    Needs: the device, the model and its compiled form, the two KV caches (graph path and
    reference), the FULL-graph parameters, the persistent input buffers, and the batch shape
    limits (query length of a uniform decode, max_num_seqs). Offers: `context`,
    `write_batch` / `write_inputs`, `batch_metadata`, `table_rows`, `forward`,
    `dummy_forward` (a key's dummy batch), `measured`, and `has_clock`.
    """

    def __init__(
        self,
        *,
        device: Device,
        model: DecoderModel,
        compiled: CompiledModel,
        kv_caches: dict[str, KVCache],
        reference_kv_caches: dict[str, KVCache],
        graph_params: GraphParams,
        inputs: Inputs,
        query_len: int,
        max_num_seqs: int,
    ) -> None:
        self.device = device
        self.model = model
        self.compiled = compiled
        self.kv_caches = kv_caches
        self.reference_kv_caches = reference_kv_caches
        self.graph_params = graph_params
        self.inputs = inputs
        self.query_len = query_len
        self.max_num_seqs = max_num_seqs
        # optional device capabilities (ascendgraph.device): eager ops priced, kernels logged
        self._clock = device if isinstance(device, VirtualClock) else None
        self._kernel_log = device if isinstance(device, KernelLog) else None

    @property
    def has_clock(self) -> bool:
        """Whether the device prices eager work on a virtual clock (else simulated times are None)."""
        return self._clock is not None

    def context(
        self, mode: GraphMode, descriptor: BatchDescriptor, metadata: AttentionMetadata, *, reference: bool = False
    ) -> ForwardContext:
        """The forward context of one forward (``reference``: the eager reference's KV cache, no params)."""
        return ForwardContext(
            runtime_mode=mode,
            batch_descriptor=descriptor,
            attn_metadata=metadata,
            kv_caches=self.reference_kv_caches if reference else self.kv_caches,
            attention_layers=self.model.attention_layers,
            device=self.device,
            graph_params=None if reference else self.graph_params,
        )

    def write_batch(self, batch: ScheduledBatch, *, padded_tokens: int, padded_rows: int) -> None:
        """The persistent buffers for a scheduled batch: its requests' tokens, positions, slots, blocks."""
        requests = batch.requests
        self.write_inputs(
            [t for r in requests for t in r.token_ids],
            [r.start_position + i for r in requests for i in range(r.num_tokens)],
            [s for r in requests for s in r.slot_ids],
            [r.block_ids for r in requests],
            padded_tokens=padded_tokens,
            padded_rows=padded_rows,
        )

    def write_inputs(
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

    def forward(
        self, mode: GraphMode, descriptor: BatchDescriptor, metadata: AttentionMetadata, padded_tokens: int
    ) -> torch.Tensor:
        """One forward of the compiled model on the first ``padded_tokens`` of the buffers."""
        with set_forward_context(self.context(mode, descriptor, metadata)):
            return self.compiled(self.inputs.input_ids[:padded_tokens], self.inputs.positions[:padded_tokens])

    def table_rows(self, batch: ScheduledBatch, descriptor: BatchDescriptor) -> int:
        """Block-table rows a batch's metadata exposes: its requests and the graph's padded ones,
        plus one zero row for the dummy request of FULL padding (`fia_padded_lengths`)."""
        return min(max(batch.num_reqs, descriptor.num_reqs or 0) + 1, self.inputs.block_table.shape[0])

    def batch_metadata(
        self, batch: ScheduledBatch, descriptor: BatchDescriptor, padded_tokens: int
    ) -> AttentionMetadata:
        """The attention metadata of a scheduled batch over the persistent buffers."""
        rows = self.table_rows(batch, descriptor)
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
    def measured(self) -> Iterator[Measure]:
        """Host CPU time, virtual device time and kernel records of the block (eager ops are
        tracked on devices with a `VirtualClock`, kernels counted on devices with a `KernelLog`)."""
        measure = Measure()
        log = self._kernel_log
        kernels_before = len(log.kernel_records) if log is not None else 0
        before = self.device.stats().virtual_time_us
        cpu_before = time.process_time()
        with self._clock.track_eager() if self._clock is not None else nullcontext():
            yield measure
        measure.cpu_s = time.process_time() - cpu_before
        measure.device_us = self.device.stats().virtual_time_us - before
        measure.kernels = (len(log.kernel_records) - kernels_before) if log is not None else 0

    def dummy_layout(self, mode: GraphMode, descriptor: BatchDescriptor) -> list[int]:
        """Query lengths of the dummy batch a key is warmed up or captured with.

        A FULL graph freezes its attention lists, so its capture uses the key's own shape:
        num_reqs requests (q tokens each when uniform). Everything else — warm-ups and
        piecewise captures, where attention runs eagerly — uses one request of num_tokens
        tokens: the graphs are the same and the eager attention stays cheap.
        """
        tokens = descriptor.num_tokens
        if mode is not GraphMode.FULL:
            return [tokens]
        if descriptor.uniform:
            return [self.query_len] * (descriptor.num_reqs or tokens // self.query_len)
        reqs = descriptor.num_reqs if descriptor.num_reqs is not None else min(tokens, self.max_num_seqs)
        reqs = max(1, min(reqs, tokens))
        base = tokens // reqs
        lengths = [base] * reqs
        lengths[-1] += tokens - base * reqs
        return lengths

    def dummy_forward(self, mode: GraphMode, descriptor: BatchDescriptor) -> torch.Tensor:
        """One forward of a dummy batch of the key's shape (warm-ups, captures, compile, profile runs)."""
        lengths = self.dummy_layout(mode, descriptor)
        tokens = sum(lengths)
        positions = [p for length in lengths for p in range(length)]
        ends = list(itertools.accumulate(lengths))
        self.write_inputs(
            [0] * tokens, positions, [-1] * tokens, [[] for _ in lengths], padded_tokens=tokens, padded_rows=len(lengths)
        )
        metadata = AttentionMetadata(
            num_reqs=len(lengths),
            num_actual_tokens=tokens,
            num_tokens=tokens,
            query_start_loc=ends,
            seq_lens=list(lengths),
            block_table=self.inputs.block_table[: len(lengths)],
            slot_mapping=self.inputs.slot_mapping[:tokens],
            uniform_decode=descriptor.uniform,
            query_len=self.query_len,
        )
        return self.forward(mode, descriptor, metadata, tokens)
