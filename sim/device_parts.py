"""What the parts of `sim.device.SimDevice` share, declared for the type checker only.

`CaptureMixin`, `ReplayMixin`, `TaskGroupMixin` and `TracingMixin` are parts of one class:
their methods read attributes `SimDevice.__init__` sets and call each other's methods. The
type checker reads each mixin as deriving from `DeviceParts` (a ``TYPE_CHECKING`` base; at run
time a mixin derives from ``object``), so those attributes and methods have one declared type.
Nothing here runs.
"""

from __future__ import annotations

import itertools
import threading
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

if TYPE_CHECKING:  # pragma: no cover - declarations only
    import torch

    from ascendgraph.device import DeviceProfile
    from ascendgraph.errors import StaleGraphParams
    from sim.budget import StreamLedger
    from sim.capture import Capture, Update
    from sim.cost import CostModel
    from sim.faults import FaultPlan, Term
    from sim.graph import ReplayRun
    from sim.program import Segment
    from sim.kernels import ContractPolicy
    from sim.pools import SimPool
    from sim.recorder import OpInfo
    from sim.streams import SimStream
    from sim.tracing import KernelRecord, TraceSpan

__all__ = ["DeviceParts"]


class DeviceParts:
    """The attributes and methods of SimDevice its mixins use (see the module docstring)."""

    name: str
    profile: "DeviceProfile"
    uid: int
    cost: "CostModel"
    contracts: "ContractPolicy"
    seed: int
    stream_error: str
    allow_rng_in_capture: bool
    poison_capture_outputs: bool
    allow_float32_attention: bool
    require_task_updates: bool
    meta_tensors: bool
    host_memory: Optional[Callable[["torch.Tensor"], bool]]
    _env: Mapping[str, str]
    _ledger: "StreamLedger"
    _faults: Optional["FaultPlan"]
    _default: "SimStream"
    _streams: list["SimStream"]
    _capture_stream: Optional["SimStream"]
    _tls: threading.local
    _busy: set["SimStream"]
    _stream_ids: "itertools.count[int]"
    _event_ids: "itertools.count[int]"
    _graph_ids: "itertools.count[int]"
    _pool_ids: "itertools.count[int]"
    _hold_ids: "itertools.count[int]"
    _stamps: "itertools.count[int]"
    _pools: dict[int, "SimPool"]
    _ops: dict[Any, "OpInfo"]
    _capture: Optional["Capture"]
    _update: Optional["Update"]
    _graphs_alive: int
    _captured_total: int
    _replays: int
    _stale: list["StaleGraphParams"]
    _fallback_ops: int
    _lost_at: Optional[str]
    _host_us: float
    _device_us: float
    _capture_time_us: float
    kernel_records: list["KernelRecord"]
    trace_spans: list["TraceSpan"]
    _sessions: int
    _profiling: bool
    _replay_marks: dict[int, tuple[float, Optional[float], str]]

    if TYPE_CHECKING:  # pragma: no cover - the methods of SimDevice and of the other mixins

        def _check_alive(self) -> None: ...

        def _current(self) -> "SimStream": ...

        def _fault(self, site: str, *, stream_id: int = 0, size_bytes: int = 0) -> Optional["Term"]: ...

        def _pool_bytes(self) -> int: ...

        def new_stream(self) -> "SimStream": ...

        def _surface_stale(self) -> None: ...

        def _check_fresh(self, run: "ReplayRun", segment: "Segment") -> None: ...

        def _drain(self, stream: "SimStream") -> None: ...

        def _mark_replay(self, run: "ReplayRun", stream: "SimStream", start: float) -> None: ...

        def _end_replay_part(self, run: "ReplayRun", stream: "SimStream", finished: bool) -> None: ...

        def _log_tasks(self, tasks: list, start: float, stream_id: int, graph: Optional[str]) -> None: ...
