"""The device protocol every backend implements, its small types, and the backend registry.

Theory of operation. The core (capture, params, engine, ...) talks to a device only
through `Device`: streams, events, graphs, task groups, memory, profiling. The shapes
follow torch_npu's graph API (``torch.npu.NPUGraph``, ``torch.npu.graph``,
``ExternalEvent``, ``graph_task_group_*``) with keyword-only arguments wherever torch_npu's
positional order differs from CUDA's. Two backends exist: ``sim`` (the CPU simulator,
package ``sim``) and ``npu`` (torch_npu, package ``hw``). They are found through the
entry-point group ``ascendgraph.devices``; each entry point names a `DeviceBackend`.
The core never imports ``sim`` or ``hw`` directly.

Beyond `Device`, a backend may provide optional capabilities, each a small runtime-checkable
protocol below (`FaultInjection`, `KernelLog`, `VirtualClock`, `WarmupScope`, `StaticKernels`,
`SuperKernels`, `HcclExpansionMode`, `Float32Attention`, `KernelPrecheck`, `KernelFallbacks`,
`CollectiveFabric`).
The core asks for one with ``isinstance(device, Capability)`` and does without it otherwise;
a backend lists what it provides in its class attribute ``capabilities`` (`CAPABILITIES` names
them all; the conformance suite checks the list against what the device has).
docs/ARCHITECTURE.md "What a backend provides" says what each one is for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from importlib import metadata
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    ContextManager,
    Generator,
    Iterator,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    runtime_checkable,
)

from ascendgraph.errors import ConfigError, DeviceUnavailable

__all__ = [
    "DeviceProfile",
    "DeviceStats",
    "Stream",
    "Event",
    "ExternalEvent",
    "Graph",
    "TaskGroupHandle",
    "PoolHandle",
    "Device",
    "FaultInjection",
    "KernelLog",
    "VirtualClock",
    "WarmupScope",
    "StaticKernels",
    "SuperKernels",
    "HcclExpansionMode",
    "Float32Attention",
    "KernelPrecheck",
    "KernelFallbacks",
    "CollectiveFabric",
    "RankFabric",
    "FabricRunStats",
    "CAPABILITIES",
    "capability_mismatches",
    "DeviceBackend",
    "ENTRY_POINT_GROUP",
    "available_backends",
    "check_device_options",
    "resolve_device_name",
    "backend_availability",
    "get_device",
]

if TYPE_CHECKING:  # pragma: no cover - torch is only needed by the backends themselves
    import torch

    from ascendgraph.parallel.layout import ParallelLayout
    from ascendgraph.xlite import XliteRuntime, XliteRuntimeSpec

ENTRY_POINT_GROUP = "ascendgraph.devices"
CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


@dataclass(frozen=True)
class DeviceProfile:
    """What a device stack is and can do. Data, not code: profiles live in tables.

    ``stream_limit`` is the number of streams graph capture may use (the planner's MAX).
    ``max_piecewise_sizes`` is None when unlimited (A5: 4). ``reserved_streams`` are
    held by the runtime before any capture, out of ``stream_limit`` (the planner does not
    know them: a profile with a reserve fails captures the planner expected to fit).
    """

    name: str
    soc: str
    stream_limit: int = 1800
    hdk_version: str = "25.5.1"
    cann_version: str = "8.5.0"
    old_hdk: bool = False
    supports_npugraph_ex: bool = True
    supports_static_kernel: bool = True
    supports_super_kernel: bool = True
    supports_task_update: bool = True
    max_piecewise_sizes: Optional[int] = None
    memory_bytes: int = 64 * 1024**3
    reserved_streams: int = 0
    description: str = ""


# CANN SoC name prefixes -> the generation resolution reasons about (hw/soc.py reads the same
# names from a card; a simulator profile's ``soc`` is one of them).
SOC_GENERATIONS: tuple[tuple[str, str], ...] = (
    ("Ascend910B", "A2"), ("Ascend910_93", "A3"), ("Ascend310P", "310P"), ("Ascend950", "A5"),
)


def soc_generation(soc: str) -> Optional[str]:
    """"A2" / "A3" / "310P" / "A5" for a CANN SoC name (or a generation name), else None."""
    text = str(soc).strip()
    if text.upper() in ("A2", "A3", "310P", "A5"):
        return text.upper()
    matches = [(len(prefix), generation) for prefix, generation in SOC_GENERATIONS if text.startswith(prefix)]
    return max(matches)[1] if matches else None


@dataclass(frozen=True)
class DeviceStats:
    """A snapshot of what the device holds (for reports, invariants and leak checks)."""

    streams_in_use: int
    stream_limit: int
    graphs_alive: int
    graphs_captured_total: int
    pool_bytes: int
    allocated_bytes: int
    virtual_time_us: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Stream(Protocol):
    """An ordered queue of device work."""

    @property
    def stream_id(self) -> int: ...

    def synchronize(self) -> None: ...


@runtime_checkable
class Event(Protocol):
    """A marker recorded on one stream and waited on by another (record before wait)."""

    def record(self, stream: Optional[Stream] = None) -> None: ...

    def wait(self, stream: Optional[Stream] = None) -> None: ...


@runtime_checkable
class ExternalEvent(Protocol):
    """torch_npu's ExternalEvent: wait may precede record; reset before reuse."""

    def record(self, stream: Optional[Stream] = None) -> None: ...

    def wait(self, stream: Optional[Stream] = None) -> None: ...

    def reset(self, stream: Optional[Stream] = None) -> None: ...


class TaskGroupHandle(Protocol):
    """Opaque handle of a captured task group (returned by task_group_end)."""


class PoolHandle(Protocol):
    """Opaque graph memory-pool handle (graph_pool_handle() or Graph.pool())."""


@runtime_checkable
class Graph(Protocol):
    """torch.npu.NPUGraph: capture once, replay many times.

    ``graph_kind`` ("full" or "piecewise", on `Device.graph`) tells the device which stream
    cost of the StreamPlan a capture is charged; hardware may ignore it.
    """

    def capture_begin(self, pool: Optional[PoolHandle] = None, capture_error_mode: str = "global") -> None: ...

    def capture_end(self) -> None: ...

    def replay(self) -> None: ...

    def reset(self) -> None: ...

    def pool(self) -> PoolHandle: ...


@runtime_checkable
class Device(Protocol):
    """The operations the core needs from a graph-capable accelerator.

    ``capabilities`` lists the optional capability protocols (`CAPABILITIES`) the device
    provides beyond these operations; empty when it provides none.
    """

    name: str
    profile: DeviceProfile

    @property
    def capabilities(self) -> tuple[type, ...]: ...

    @property
    def torch_device(self) -> "torch.device": ...

    # streams and events
    def current_stream(self) -> Stream: ...

    def default_stream(self) -> Stream: ...

    def new_stream(self) -> Stream: ...

    def stream(self, stream: Optional[Stream]) -> ContextManager[None]: ...

    def new_event(self) -> Event: ...

    def new_external_event(self) -> ExternalEvent: ...

    # graphs
    def new_graph(self, name: Optional[str] = None) -> Graph: ...  # the name appears in errors and profiles

    def graph(
        self,
        graph: Graph,
        *,
        pool: Optional[PoolHandle] = None,
        stream: Optional[Stream] = None,
        capture_error_mode: str = "global",
        graph_kind: str = "full",
    ) -> ContextManager[None]: ...

    def graph_pool_handle(self) -> PoolHandle: ...

    def is_current_stream_capturing(self) -> bool: ...

    # FULL-graph parameter update
    def task_group_begin(self, stream: Stream) -> None: ...

    def task_group_end(self, stream: Stream) -> TaskGroupHandle: ...

    def task_update_begin(self, stream: Stream, handle: TaskGroupHandle) -> None: ...

    def task_update_end(self, stream: Stream) -> None: ...

    # memory, sync, profiling
    def empty_cache(self) -> None: ...

    def memory_allocated(self) -> int: ...

    def synchronize(self) -> None: ...

    def weak_ref(self, tensor: "torch.Tensor") -> "torch.Tensor": ...

    def stats(self) -> DeviceStats: ...

    def set_stream_plan(self, plan: Any) -> None: ...

    def profiling(self, output_dir: str, **options: Any) -> ContextManager[Any]: ...

    # XliteGraph (docs/semantics.md §11): the device's xlite runtime for a model — the simulator's
    # stand-in or the adapter over the `xlite` package (DeviceUnavailable when it is missing).
    def xlite_runtime(self, model: Any, spec: "XliteRuntimeSpec") -> "XliteRuntime": ...


# --------------------------------------------------------------------------- optional capabilities
# Each is what one part of the core asks of a device when the device has it; a device without
# it gets the documented behaviour in brackets.


@runtime_checkable
class FaultInjection(Protocol):
    """Failpoints (docs/faults.md): ``--faults``, ``EngineOptions.faults`` and the ``fault``
    test marker apply a plan through it [refused: "--faults needs the sim device"]."""

    def set_fault_plan(self, plan: Any) -> None: ...

    @property
    def fault_plan(self) -> Any: ...


@runtime_checkable
class KernelLog(Protocol):
    """A record per executed kernel and a span per capture/replay/wait on the device's clock:
    the report's ``kernels_per_step`` and ``--profile-dir``'s Ascend files are written from it
    (`ascendgraph.profile_formats`) [kernels_per_step is null; profiles come from the
    backend's own ``profiling()``]."""

    @property
    def kernel_records(self) -> Sequence[Any]: ...

    @property
    def trace_spans(self) -> Sequence[Any]: ...

    @property
    def records_kernels(self) -> bool: ...

    def set_record_kernels(self, enabled: bool = True) -> None: ...

    def discard_kernel_records(self) -> bool: ...

    def stream_names(self) -> dict[int, str]: ...


@runtime_checkable
class VirtualClock(Protocol):
    """Eager work is priced too (``stats().virtual_time_us`` advances inside ``track_eager()``;
    ``clock()`` is (host, device) microseconds): the report's simulated times and `plan`'s
    measured capture costs [null: the device has no virtual clock; `plan` measures on the simulator]."""

    def track_eager(self) -> ContextManager[Any]: ...

    def clock(self) -> tuple[float, float]: ...


@runtime_checkable
class WarmupScope(Protocol):
    """A context for work whose results are discarded (warm-ups, the compile pass); the
    simulator computes their half-precision matmuls in float32 [no context]."""

    def warmup_scope(self) -> ContextManager[Any]: ...


@runtime_checkable
class StaticKernels(Protocol):
    """Installs a static-kernel build (npugraph_ex, docs/npugraph_ex.md) [the build only
    records the fixed-shape launches]."""

    def install_static_kernels(self, kernels: Mapping[tuple, str]) -> None: ...


@runtime_checkable
class SuperKernels(Protocol):
    """torch_npu's super kernel scope and optimisation of a captured FULL graph [super kernel
    has no effect, with a warning]."""

    def super_kernel_scope(self, scope_name: Optional[str] = None) -> ContextManager[None]: ...

    def super_kernel_optimize(self, graph: Any, optimize_options: Optional[dict[str, Any]] = None) -> Any: ...


@runtime_checkable
class HcclExpansionMode(Protocol):
    """Prices captured collectives with HCCL's expansion mode (the resolved plan's, or
    HCCL_OP_EXPANSION_MODE) [the stack's own mode applies]."""

    def set_hccl_op_expansion_mode(self, mode: Optional[str]) -> None: ...


@runtime_checkable
class Float32Attention(Protocol):
    """Accepts float32 attention as a declared leniency on a device made without it
    (docs/decisions.md "float32 on the simulator") [dtype float32 is refused]."""

    def allow_float32_attention_now(self) -> None: ...


@runtime_checkable
class KernelPrecheck(Protocol):
    """Checks one torch_npu kernel call against the contract table without running it
    (KernelContractError) [the kernel-contract conformance cases are skipped]."""

    def check_kernel_call(self, kernel: str, arguments: Mapping[str, Any]) -> None: ...


@runtime_checkable
class KernelFallbacks(Protocol):
    """Ops that ran a reference formula instead of their missing kernel, with the reason: the
    report's ``kernel_fallbacks`` and one warning each [none reported]."""

    def kernel_fallbacks(self) -> Mapping[str, str]: ...


class FabricRunStats(Protocol):
    """What a run of a `RankFabric` did, as the multi-rank report reads it."""

    @property
    def met(self) -> Mapping[str, int]: ...  # collectives met per group kind ("tp", "dp", "world", ...)

    @property
    def met_by_rank(self) -> Mapping[int, int]: ...

    @property
    def failed_rank(self) -> Optional[int]: ...  # the rank whose own failure is the run's error


class RankFabric(Protocol):
    """Many ranks' programs stepped in one process (docs/ranks.md). A rank program is a
    generator that yields a ``collective_type`` (fields ``group``, ``op``, ``shape``, ``dtype``,
    ``how``, ``site``, ``params``, ``rows``, ``reduce``, ``local_us``) and receives its result, or
    yields a ``decision_type`` (``group``, ``value``, ``sp_tp``, ``padded``) after a DP sync;
    ``run`` steps them all and raises the run's error (a collective error, or a rank's own)."""

    @property
    def collective_type(self) -> Callable[..., Any]: ...

    @property
    def decision_type(self) -> Callable[..., Any]: ...

    @property
    def clock_us(self) -> Mapping[int, float]: ...  # each rank's virtual clock when the run ended

    @property
    def stats(self) -> FabricRunStats: ...

    def run(self, programs: Mapping[int, Generator[Any, Any, Any]]) -> Any: ...


@runtime_checkable
class CollectiveFabric(Protocol):
    """An in-process collective fabric for a layout's ranks, one device each: the multi-rank
    runner (`ascendgraph.runtime.ranks.run_ranks`, ``ascendgraph run`` with DP/TP/EP > 1) steps
    its rank programs on it; its devices need a `VirtualClock` too (each collective carries the
    time its rank spent) [multi-rank runs refused: DeviceUnavailable]."""

    def collective_fabric(self, layout: "ParallelLayout", *, seed: int = 0,
                          timeout_s: Optional[float] = 1836.0) -> RankFabric: ...


CAPABILITIES: tuple[type, ...] = (
    FaultInjection, KernelLog, VirtualClock, WarmupScope, StaticKernels, SuperKernels, HcclExpansionMode,
    Float32Attention, KernelPrecheck, KernelFallbacks, CollectiveFabric,
)


def capability_mismatches(device: Device) -> dict[str, str]:
    """Capability name -> what is wrong with the device's declaration of it: "declared, not
    provided" (a method is missing) or "provided, not declared" (absent from its
    ``capabilities``). Empty when the declaration is exact."""
    declared = set(device.capabilities)
    unknown = declared - set(CAPABILITIES)
    found = {c.__name__: "not a capability of ascendgraph.device.CAPABILITIES" for c in unknown}
    for protocol in CAPABILITIES:
        provided = isinstance(device, protocol)
        if provided != (protocol in declared):
            found[protocol.__name__] = "provided, not declared" if provided else "declared, not provided"
    return found


@dataclass(frozen=True)
class DeviceBackend:
    """What an ``ascendgraph.devices`` entry point names.

    ``availability()`` returns (usable, reason); it must never raise and must be cheap
    enough to call for ``--device auto``.
    """

    name: str
    create: Callable[..., Device]
    availability: Callable[[], tuple[bool, str]]
    description: str = ""
    # Validates creation options (e.g. the simulator's profile and fault plan) without creating
    # a device: raises ConfigError naming the bad option. None: nothing to check up front.
    check_options: Optional[Callable[..., None]] = None


# Used only when the distribution's metadata is missing (running from a bare checkout).
_FALLBACK_ENTRY_POINTS = {"sim": "sim:BACKEND", "npu": "hw:BACKEND"}


def _load(target: str) -> DeviceBackend:
    module_name, _, attribute = target.partition(":")
    backend = getattr(importlib.import_module(module_name), attribute)
    if not isinstance(backend, DeviceBackend):
        raise TypeError(f"entry point {target} is not a DeviceBackend")
    return backend


def _entry_points() -> dict[str, str]:
    found = {ep.name: ep.value for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}
    return found or dict(_FALLBACK_ENTRY_POINTS)


def available_backends() -> list[str]:
    """Names registered in the ``ascendgraph.devices`` entry-point group."""
    return sorted(_entry_points())


def _backend(name: str) -> DeviceBackend:
    points = _entry_points()
    if name not in points:
        raise ConfigError(
            f"unknown device {name!r}: expected one of {', '.join(sorted(points) + ['auto'])}", key="device"
        )
    return _load(points[name])


def backend_availability(name: str) -> tuple[bool, str]:
    """(usable, reason) for a registered backend; never raises for a known name."""
    try:
        backend = _backend(name)
    except ConfigError:
        raise
    except Exception as exc:  # a broken backend package is "unavailable", with the reason
        return False, f"cannot load the {name!r} device backend: {type(exc).__name__}: {exc}"
    return backend.availability()


def resolve_device_name(name: str = "auto") -> str:
    """The backend ``get_device(name)`` would pick: ``auto`` becomes ``npu`` when usable, else ``sim``.

    Callers that pass backend-specific options (the simulator's profile, seed, stream limit)
    resolve the name first so ``auto`` gets the same options as the backend it lands on.
    """
    if not isinstance(name, str):
        raise ConfigError(f"device name must be a string, got {name!r}", key="device")
    key = name.strip().lower()
    if key == "auto":
        usable, _ = backend_availability("npu") if "npu" in _entry_points() else (False, "")
        key = "npu" if usable else "sim"
    return key


def check_device_options(name: str, **options: Any) -> None:
    """Validate a backend's creation options without creating a device (and without the core
    importing the backend): a ConfigError names the bad option, as creating the device would."""
    backend = _backend(resolve_device_name(name))
    if backend.check_options is not None:
        backend.check_options(**options)


def get_device(name: str = "auto", **options: Any) -> Device:
    """A device by backend name: ``sim``, ``npu`` or ``auto`` (npu when usable, else sim).

    ``--device npu`` without a usable NPU raises DeviceUnavailable naming the reason.
    """
    key = resolve_device_name(name)
    backend = _backend(key)
    usable, reason = backend.availability()
    if not usable:
        raise DeviceUnavailable(f"device {key!r} is not usable here: {reason}")
    return backend.create(**options)


def iter_backends() -> Iterator[DeviceBackend]:
    for name in available_backends():
        yield _backend(name)
