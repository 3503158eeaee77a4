"""Check stage: every served step against the eager reference.

The reference is the uncompiled model run eagerly on the unpadded batch with its own KV cache
(`run_reference`), so graph and eager paths see the same weights and inputs. A step whose
largest absolute difference exceeds ``atol`` (a NaN counts as infinite) fails its requests
with `NumericalMismatch`; otherwise the graph path's greedy predictions complete the step.
"""

from __future__ import annotations

import logging
import math

import torch

from ascendgraph.device import Device
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import NumericalMismatch
from ascendgraph.models.build import DecoderModel
from ascendgraph.modes import GraphMode
from ascendgraph.forward_context import AttentionMetadata, set_forward_context
from ascendgraph.runtime.options import EngineOptions
from ascendgraph.runtime.report import MISMATCH_CAUSES_EAGER, MISMATCH_CAUSES_GRAPH
from ascendgraph.runtime.stages.forward import ForwardPlumbing
from ascendgraph.runtime.stages.records import Comparison, Measure, RunResult
from ascendgraph.runtime.stages.state import EngineState
from ascendgraph.runtime.workload import ScheduledBatch, Scheduler

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
    """The comparison with eager.

    Needs: the engine's state (writes ``first_mismatch``), the forward plumbing (the reference
    runs through it), the model, the device, the options (``check_eager``, whether ``atol`` was
    set), the default gate ``atol``, whether xlite is on (the mismatch's advice), and the
    scheduler (a judged step completes or fails its requests). Offers: `run_reference`,
    `compare_with_eager`, `judge`.
    """

    def __init__(
        self,
        *,
        state: EngineState,
        forward: ForwardPlumbing,
        model: DecoderModel,
        device: Device,
        options: EngineOptions,
        atol: float,
        xlite_enabled: bool,
        scheduler: Scheduler,
    ) -> None:
        self.state = state
        self.forward = forward
        self.model = model
        self.device = device
        self.options = options
        self.atol = atol
        self.xlite_enabled = xlite_enabled
        self.scheduler = scheduler

    def run_reference(self, batch: ScheduledBatch) -> tuple[torch.Tensor, Measure]:
        """The uncompiled model, eagerly, on the unpadded batch, with its own KV cache."""
        device = self.device.torch_device
        tokens = batch.num_tokens
        ids = torch.tensor([t for r in batch.requests for t in r.token_ids], dtype=torch.long, device=device)
        positions = torch.tensor(
            [r.start_position + i for r in batch.requests for i in range(r.num_tokens)], dtype=torch.long, device=device
        )
        width = self.forward.inputs.block_table.shape[1]
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
            query_len=self.forward.query_len,
        )
        context = self.forward.context(GraphMode.NONE, BatchDescriptor(tokens), metadata, reference=True)
        with self.forward.measured() as measure, set_forward_context(context):
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

    def compare_with_eager(self, batch: ScheduledBatch, hidden: torch.Tensor) -> Comparison:
        """The largest absolute difference from the eager reference and the step's gate (0.0,
        no measure and ``atol`` when ``check_eager`` is off; NaN becomes infinity so it never passes)."""
        if not self.options.check_eager:
            return Comparison(0.0, None, self.atol)
        reference, eager = self.run_reference(batch)
        diff = (hidden.float() - reference.float()).abs().max().item() if hidden.numel() else 0.0
        if math.isnan(diff):
            diff = math.inf
        magnitude = reference.float().abs().max().item() if reference.numel() else 0.0
        tolerance = step_tolerance(self.atol, hidden.dtype, magnitude, explicit_atol=self.options.atol is not None)
        return Comparison(diff, eager, tolerance)

    def judge(self, batch: ScheduledBatch, result: RunResult, comparison: Comparison) -> None:
        """Within the gate: the step's predictions complete it; beyond: its requests fail."""
        mode, descriptor, hidden = result.runtime_mode, result.descriptor, result.hidden
        ids = [r.request_id for r in batch.requests]
        diff, tolerance = comparison.diff, comparison.tolerance
        if not diff <= tolerance:
            gate = f"atol {self.atol:g}" if tolerance == self.atol else \
                f"tolerance {tolerance:.3g} ({BFLOAT16_GATE_ULPS} bfloat16 ulp of max |eager|; atol {self.atol:g})"
            mismatch = NumericalMismatch(
                f"step {batch.step} ({batch.kind}, {batch.num_tokens} tokens, {mode.name} {descriptor}) differs from "
                f"eager by {diff:.3g} > {gate}; requests {', '.join(ids)} failed; "
                + (MISMATCH_CAUSES_EAGER if mode is GraphMode.NONE and not self.xlite_enabled
                   else MISMATCH_CAUSES_GRAPH)
            )
            log.error("%s", mismatch)
            if self.state.first_mismatch is None:
                self.state.first_mismatch = mismatch
            self.scheduler.fail(ids, str(mismatch))
        else:
            self.scheduler.complete(batch, self._sample(batch, hidden))
