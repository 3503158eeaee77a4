"""Super kernel (``enable_super_kernel``, docs/semantics.md §10): merging a captured graph's kernels.

Theory of operation. Super kernel is a binary-level fusion applied *during capture*: once
a FULL graph has been captured, its eligible kernels (fixed-shape static kernels, in runs
that no graph event wait interrupts) are merged into larger kernels with the needed syncs
inside, so a replay launches fewer kernels. vLLM Ascend calls torch_npu's
``NPUGraph.super_kernel_optimize(optimize_options={"dcci_after_kernel_end": [".*"]})``
right after the capture block (the capture itself runs inside
``super_kernel_scope("full_model")``: `SuperKernelStage.scope`, a `CaptureState.capture_scopes`
entry) and logs, once, ``Super kernel optimization is enabled for
ACL graph capture.``; here `SuperKernelStage` is a `CaptureState.after_capture` hook
calling ``device.super_kernel_optimize(graph, optimize_options=...)`` on each FULL graph
(the simulator merges runs of static kernels; the NPU backend calls torch_npu) and logging
that line once per engine. Piecewise graphs are never optimised (the flag is off in
piecewise modes). A failing optimisation undoes the capture (the hook's contract).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ContextManager, Optional

from ascendgraph.device import Device, SuperKernels
from ascendgraph.modes import GraphMode

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.compile.graph_wrapper import CaptureState, GraphEntry, GraphWrapper

__all__ = ["SUPER_KERNEL_LOG", "SUPER_KERNEL_OPTIONS", "SUPER_KERNEL_SCOPE", "SuperKernelStage", "attach_super_kernel"]

log = logging.getLogger(__name__)

SUPER_KERNEL_LOG = "Super kernel optimization is enabled for ACL graph capture."
# What vLLM Ascend passes: a data-cache clean after every kernel of the merged region.
SUPER_KERNEL_OPTIONS: dict[str, Any] = {"dcci_after_kernel_end": [".*"]}
# The scope name vLLM Ascend's graph wrapper opens around a whole FULL capture.
SUPER_KERNEL_SCOPE = "full_model"


@dataclass
class SuperKernelStage:
    """After-capture hook: super-kernel optimisation of every captured FULL graph."""

    device: SuperKernels
    graphs_optimized: int = 0
    super_kernels: int = 0  # kernels made by merging (as the device reports them)
    logged: bool = False
    options: dict[str, Any] = field(default_factory=lambda: dict(SUPER_KERNEL_OPTIONS))

    def scope(self, wrapper: "GraphWrapper") -> ContextManager[Any]:
        """The super-kernel scope around a FULL capture (vLLM Ascend's graph wrapper opens
        ``super_kernel_scope("full_model", enabled)`` inside ``torch.npu.graph``); nothing
        for piecewise captures."""
        if wrapper.runtime_mode is not GraphMode.FULL:
            return contextlib.nullcontext()
        return self.device.super_kernel_scope(SUPER_KERNEL_SCOPE)

    def __call__(self, wrapper: "GraphWrapper", entry: "GraphEntry") -> None:
        if wrapper.runtime_mode is not GraphMode.FULL:
            return
        made = self.device.super_kernel_optimize(entry.graph, optimize_options=dict(self.options))
        self.graphs_optimized += 1
        self.super_kernels += int(made or 0)
        if not self.logged:
            self.logged = True
            log.info("%s", SUPER_KERNEL_LOG)


def attach_super_kernel(enabled: bool, device: Device, capture_state: "CaptureState") -> Optional[SuperKernelStage]:
    """Hook super-kernel optimisation into the captures of ``capture_state`` when the resolution
    turned it on (``enabled``; `Resolution.super_kernel`) and ``device`` can optimise a graph."""
    if not enabled:
        return None
    if not isinstance(device, SuperKernels):
        log.warning("device %s has no super_kernel_optimize; enable_super_kernel has no effect", device.name)
        return None
    stage = SuperKernelStage(device)
    capture_state.capture_scopes.append(stage.scope)
    capture_state.after_capture.append(stage)
    return stage
