"""Check stage: every served step against the eager reference.

The reference is the uncompiled model run eagerly on the unpadded batch with its own KV cache
(`_run_reference`), so graph and eager paths see the same weights and inputs. A step whose
largest absolute difference exceeds ``atol`` (a NaN counts as infinite) fails its requests
with `NumericalMismatch`; otherwise the graph path's greedy predictions complete the step.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Optional

import torch

from ascendgraph.device import Device
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import NumericalMismatch
from ascendgraph.models.build import DecoderModel
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Resolution
from ascendgraph.forward_context import AttentionMetadata, set_forward_context
from ascendgraph.runtime.report import MISMATCH_CAUSES_EAGER, MISMATCH_CAUSES_GRAPH
from ascendgraph.runtime.stages.records import Inputs, Measure, RunResult
from ascendgraph.runtime.workload import ScheduledBatch, Scheduler

if TYPE_CHECKING:
    from ascendgraph.runtime.engine import EngineOptions

__all__ = ["CheckStage"]

log = logging.getLogger(__name__)


class CheckStage:
    """The comparison with eager (a part of `Engine`, readable on its own); runs the reference
    through `ForwardPlumbing`."""

    options: "EngineOptions"
    device: Device
    model: DecoderModel
    inputs: Inputs
    query_len: int
    atol: float
    resolution: Resolution
    scheduler: Scheduler
    first_mismatch: Optional[NumericalMismatch]

    def _run_reference(self, batch: ScheduledBatch) -> tuple[torch.Tensor, Measure]:
        """The uncompiled model, eagerly, on the unpadded batch, with its own KV cache."""
        device = self.device.torch_device
        tokens = batch.num_tokens
        ids = torch.tensor([t for r in batch.requests for t in r.token_ids], dtype=torch.long, device=device)
        positions = torch.tensor(
            [r.start_position + i for r in batch.requests for i in range(r.num_tokens)], dtype=torch.long, device=device
        )
        width = self.inputs.block_table.shape[1]
        table = torch.zeros((batch.num_reqs, width), dtype=torch.int32, device=device)
        for row, r in enumerate(batch.requests):
            table[row, : len(r.block_ids)] = torch.tensor(r.block_ids, dtype=torch.int32, device=device)
        metadata = AttentionMetadata(
            num_reqs=batch.num_reqs,
            num_actual_tokens=tokens,
            num_tokens=tokens,
            query_start_loc=batch.query_start_loc,
            seq_lens=batch.seq_lens,
            block_table=table,
            slot_mapping=torch.tensor([s for r in batch.requests for s in r.slot_ids], dtype=torch.long, device=device),
            query_len=self.query_len,
        )
        context = self._context(GraphMode.NONE, BatchDescriptor(tokens), metadata, reference=True)
        with self._measured() as measure, set_forward_context(context):
            hidden = self.model(ids, positions)
            self.device.synchronize()
        return hidden, measure

    def _sample(self, batch: ScheduledBatch, hidden: torch.Tensor) -> dict[str, list[int]]:
        """Greedy predictions after every query token of each request (from the graph path)."""
        predictions = self.model.compute_logits(hidden).argmax(dim=-1).tolist()
        sampled, start = {}, 0
        for r in batch.requests:
            sampled[r.request_id] = predictions[start : start + r.num_tokens]
            start += r.num_tokens
        return sampled

    def _compare_with_eager(self, batch: ScheduledBatch, hidden: torch.Tensor) -> tuple[float, Optional[Measure]]:
        """The largest absolute difference from the eager reference (0.0 and no measure when
        ``check_eager`` is off; NaN becomes infinity so it never passes)."""
        diff, eager = 0.0, None
        if self.options.check_eager:
            reference, eager = self._run_reference(batch)
            diff = (hidden.float() - reference.float()).abs().max().item() if hidden.numel() else 0.0
            if math.isnan(diff):
                diff = math.inf
        return diff, eager

    def _judge(self, batch: ScheduledBatch, result: RunResult, diff: float) -> None:
        """Within atol: the step's predictions complete it; beyond: its requests fail."""
        mode, descriptor, hidden = result.runtime_mode, result.descriptor, result.hidden
        ids = [r.request_id for r in batch.requests]
        if not diff <= self.atol:
            mismatch = NumericalMismatch(
                f"step {batch.step} ({batch.kind}, {batch.num_tokens} tokens, {mode.name} {descriptor}) differs from "
                f"eager by {diff:.3g} > atol {self.atol:g}; requests {', '.join(ids)} failed; "
                + (MISMATCH_CAUSES_EAGER if mode is GraphMode.NONE and not self.resolution.xlite_enabled
                   else MISMATCH_CAUSES_GRAPH)
            )
            log.error("%s", mismatch)
            if self.first_mismatch is None:
                self.first_mismatch = mismatch
            self.scheduler.fail(ids, str(mismatch))
        else:
            self.scheduler.complete(batch, self._sample(batch, hidden))
