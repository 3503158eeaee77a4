"""The simulator's stand-in for the xlite runtime (``SimDevice.xlite_runtime``).

Theory of operation. On hardware, xlite takes over the whole forward of a batch that fits
its token budget: it reads the model's weights and vLLM's paged KV cache and writes the
final hidden states into a buffer it allocated once, ``budget`` rows long. The stand-in
keeps that contract and nothing more: at construction it allocates the buffer; each
`forward` runs the *plain* (uncompiled, uncaptured) model eagerly under the forward
context it is given — the same attention metadata and KV caches the native runnable
uses, so a request may prefill natively and decode on xlite — and copies the result into
the buffer's first rows, returning that view. A batch over the budget is refused with
`XliteBudgetExceeded` before anything runs: the router must never send one.

Its work is ordinary eager device work: inside ``SimDevice.track_eager`` every op is
priced like any eager launch (the stand-in does not model xlite's own kernels).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from ascendgraph.errors import ConfigError
from ascendgraph.forward_context import ForwardContext, set_forward_context
from ascendgraph.modes import GraphMode
from ascendgraph.xlite import XliteRuntimeSpec, check_within_budget

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["SimXliteRuntime"]


class SimXliteRuntime:
    """Eager forward into a preallocated ``[budget, hidden_size]`` hidden-state buffer."""

    def __init__(self, device: "SimDevice", model: nn.Module, spec: XliteRuntimeSpec) -> None:
        if spec.budget < 1:
            raise ConfigError(f"the xlite token budget must be >= 1, got {spec.budget}", key="xlite_graph_config")
        if spec.hidden_size < 1:
            raise ConfigError(f"hidden_size must be >= 1 for the xlite buffer, got {spec.hidden_size}",
                              key="xlite_graph_config")
        self.device = device
        self.model = model
        self.spec = spec
        self.hidden_states = torch.zeros((spec.budget, spec.hidden_size), dtype=spec.dtype,
                                         device=device.torch_device)
        self.forwards = 0
        self.profile_runs = 0

    @property
    def budget(self) -> int:
        return self.spec.budget

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, context: ForwardContext) -> torch.Tensor:
        """The model's hidden states for the batch, as ``hidden_states[:num_tokens]``."""
        num_tokens = int(input_ids.shape[0])
        check_within_budget(num_tokens, self.spec.budget)
        if tuple(positions.shape) != (num_tokens,):
            raise ValueError(f"positions must have shape ({num_tokens},), got {tuple(positions.shape)}")
        if context.runtime_mode is not GraphMode.NONE:
            raise ValueError(
                f"xlite runs outside ACL graphs: the forward context's runtime mode must be NONE, "
                f"got {context.runtime_mode.name}"
            )
        if self.device.is_current_stream_capturing():
            raise RuntimeError("the xlite runtime cannot run while the current stream is capturing an ACL graph")
        with set_forward_context(context):
            hidden = self.model(input_ids, positions)
        view = self.hidden_states[:num_tokens]
        view.copy_(hidden)
        self.forwards += 1
        return view

    def profile_run(self) -> torch.Tensor:
        """Full-mode profile run: the preallocated buffer itself, no forward (docs/semantics.md §11)."""
        self.profile_runs += 1
        return self.hidden_states

    def __repr__(self) -> str:
        mode = "full" if self.spec.full_mode else "decode-only"
        return f"<SimXliteRuntime {mode} budget={self.spec.budget} hidden={self.spec.hidden_size}>"
