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

__all__ = ["CheckStage", "BFLOAT16_GATE_ULPS", "bfloat16_ulp", "step_tolerance"]

log = logging.getLogger(__name__)

# The bfloat16 gate is relative to the magnitude (docs/semantics.md "Checking against eager"):
# bfloat16 keeps 8 significant bits, so one unit in the last place at |x| = 4.5 is 2**-5 =
# 0.031, more than the fixed 2e-2; a card's graph path (padded shapes, other tilings, another
# accumulation order) may differ from eager by a few of them. The gate is the larger of atol
# and BFLOAT16_GATE_ULPS units in the last place of max |eager| of the step.
BFLOAT16_GATE_ULPS = 4


def bfloat16_ulp(magnitude: float) -> float:
    """One unit in the last place of a bfloat16 number of this magnitude (0 for 0)."""
    if not magnitude > 0 or not math.isfinite(magnitude):
        return 0.0
    return 2.0 ** (math.floor(math.log2(magnitude)) - 7)


def step_tolerance(atol: float, dtype: torch.dtype, magnitude: float, *, explicit_atol: bool) -> float:
    """The gate of one step: ``atol`` when the user set it or the dtype is float32; in bfloat16
    the larger of ``atol`` and `BFLOAT16_GATE_ULPS` ulp of the step's largest eager value."""
    if explicit_atol or dtype != torch.bfloat16:
        return atol
    return max(atol, BFLOAT16_GATE_ULPS * bfloat16_ulp(magnitude))


class CheckStage:
    """The comparison with eager (a part of `Engine`, readable on its own); runs the reference
    through `ForwardPlumbing`."""

    options: "EngineOptions"
    device: Device
    model: DecoderModel
    inputs: Inputs
    query_len: int
    atol: float
    step_tolerance: float  # the gate of the step being judged (step_tolerance)
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
        self.step_tolerance = self.atol
        if self.options.check_eager:
            reference, eager = self._run_reference(batch)
            diff = (hidden.float() - reference.float()).abs().max().item() if hidden.numel() else 0.0
            if math.isnan(diff):
                diff = math.inf
            magnitude = reference.float().abs().max().item() if reference.numel() else 0.0
            self.step_tolerance = step_tolerance(self.atol, hidden.dtype, magnitude,
                                                 explicit_atol=self.options.atol is not None)
        return diff, eager

    def _judge(self, batch: ScheduledBatch, result: RunResult, diff: float) -> None:
        """Within atol: the step's predictions complete it; beyond: its requests fail."""
        mode, descriptor, hidden = result.runtime_mode, result.descriptor, result.hidden
        ids = [r.request_id for r in batch.requests]
        tolerance = self.step_tolerance
        if not diff <= tolerance:
            gate = f"atol {self.atol:g}" if tolerance == self.atol else \
                f"tolerance {tolerance:.3g} ({BFLOAT16_GATE_ULPS} bfloat16 ulp of max |eager|; atol {self.atol:g})"
            mismatch = NumericalMismatch(
                f"step {batch.step} ({batch.kind}, {batch.num_tokens} tokens, {mode.name} {descriptor}) differs from "
                f"eager by {diff:.3g} > {gate}; requests {', '.join(ids)} failed; "
                + (MISMATCH_CAUSES_EAGER if mode is GraphMode.NONE and not self.resolution.xlite_enabled
                   else MISMATCH_CAUSES_GRAPH)
            )
            log.error("%s", mismatch)
            if self.first_mismatch is None:
                self.first_mismatch = mismatch
            self.scheduler.fail(ids, str(mismatch))
        else:
            self.scheduler.complete(batch, self._sample(batch, hidden))
