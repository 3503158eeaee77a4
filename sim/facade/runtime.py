"""The facade's process-wide state: a `SimDevice` standing in for NPU 0 (and, after
`configure_devices`, one for each further NPU), and the rules torch_npu's runtime enforces
that the simulator does not model itself.

Theory of operation. torch_npu is process-wide (one runtime, streams and graphs shared
by every caller), so the facade is too: `runtime()` returns the `FacadeRuntime` whose
``device`` backs every facade call, the one of the calling thread's current NPU (NPU 0
unless the thread called ``torch.npu.set_device``: torch_npu's current device is per
thread). `configure()` replaces it with a fresh device (a test per device, a fault plan, a
profile such as an old HDK), so state never leaks between tests that ask for a fresh one;
`configure_devices()` makes several, as the NPUs of one host (simulated ranks as threads,
each on its own NPU).

What the facade adds on top of the simulator:

* **task groups hold kernel tasks only**: while a ``graph_task_group_begin`` /
  ``_end`` pair is open on the capturing stream (or a task update is open), a dispatch
  mode refuses every op that *allocates* (an op returning a tensor that does not alias
  an argument: ``torch.empty``, a workspace query, a non-``out`` kernel), as on a card
  where an allocation between the two calls is not a kernel task (torch_npu's handler
  contract: "prepare_capture ... runs before graph_task_group_begin"). ``.out`` kernels,
  in-place kernels and views pass.
* **super kernel scopes** (``super_kernel_scope_begin/end``) are tracked so a scope left
  open is visible (``open_super_kernel_scopes``); super kernel itself is refused off Atlas
  A3 (`supports_super_kernel`), as CANN's aclsk API is.
* **the npu device**: the SimDevice backs torch's "npu" device (`sim.npu_device`): its
  captures allocate npu tensors from their graph pools and ask where an op's tensors live
  (`sim.npu_device.device_type.NpuDeviceType`).

What the facade takes away from the simulator (torch_npu does not do it): RNG inside a
capture is recorded (torch_npu 2.13 captures RNG through its generator's graph-safe
state), and a kernel's first launch inside a capture is not refused (no lazy-init model).
docs/facade.md has the table of every deviation that remains.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch
from ascendgraph.dynamo_gate import LazyDynamoDispatchMode

from ascendgraph import ops as ag_ops
from ascendgraph.errors import CaptureConstraintError
from sim.device import SimDevice
from sim.memory_ledger import beyond_pool_bytes
from sim.mode_stack import reentered, withdraw
from sim.recorder import wrapper_reentry
from sim.streams import SimStream

__all__ = ["FacadeRuntime", "runtime", "configure", "configured", "TaskGroupGuard", "DEVICE_NAME", "TaskGroupAllocation"]

DEVICE_NAME = "Ascend910B3"  # what torch.npu.get_device_name() reports (an Atlas A2 SoC name)
DEFAULT_PROFILE = "A2"
# What get_device_name() reports per simulator profile generation (CANN SoC names).
DEVICE_NAMES = {"A2": "Ascend910B3", "A3": "Ascend910_9392", "310P": "Ascend310P3", "A5": "Ascend950PR"}
SUPER_KERNEL_SOC_PREFIX = "Ascend910_93"  # Atlas A3: the only product line of CANN's aclsk API
# SimDevice options the facade sets unless a caller overrides them: what torch_npu does. Its
# tensors are npu tensors whose host reads the simulated device sees (sim.npu_device), so the
# device runs behind the host as a card does (lag "device", SimDevice's default).
FACADE_DEVICE_DEFAULTS = {"allow_rng_in_capture": True, "lazy_kernel_init": False, "torch_device": "npu"}
SUPER_KERNEL_UNSUPPORTED = (
    "{what}: super kernel is not supported on {device} (an Atlas {generation} device): CANN's super kernel "
    "API (aclskScopeBegin / aclskOptimize, which torch_npu 2.13 calls) is for Atlas A3 products only; "
    "disable enable_super_kernel on this device"
)


class TaskGroupAllocation(CaptureConstraintError):
    """An allocation (or any op producing fresh memory) between task_group_begin and _end.

    Declared strictness: torch_npu's ``graph_task_group_begin/end`` are thin wrappers over
    aclmdlRICaptureTaskGrpBegin/End and check nothing of the kind; on a card the allocation
    is captured and its address goes stale after the next task update."""


def _allocates(func: Any) -> bool:
    """True when ``func`` returns a tensor that aliases none of its arguments."""
    schema = func._schema
    if func.is_view:
        return False
    for ret in schema.returns:
        if ret.alias_info is None and str(ret.type) in ("Tensor", "List[Tensor]", "Optional[Tensor]"):
            return True
    return False


# The `.out` kernels whose graph task runs in the workspace the caller passes: "npu_fused_infer_
# attention_score.out ... for aclgraph tiling sink (a workspace tensor must be passed in)"
# (torch-npu 2.13.0 _op_plugin_docs.py:8524; v2: :9049). Launched without one, op-plugin takes
# the launch's workspace from torch_npu's per-stream workspace allocator
# (NPUWorkspaceAllocator::malloc_with_stream), which the next launch on that stream reuses.
GRAPH_TASK_WORKSPACE_KERNELS = frozenset({"npu_fused_infer_attention_score.out", "npu_fused_infer_attention_score_v2.out"})
WORKSPACE_LEFT_OUT = (
    "simulator strictness: {kernel} without a workspace between {where}; a card accepts it, but the launch "
    "takes its workspace from torch_npu's per-stream workspace allocator, which the next kernel on that stream "
    "reuses, so the graph's task computes in memory other launches write. Pass the workspace the capture used "
    "(the _get_max_workspace query's tensor), as the op doc's graph (tiling sink) use requires"
)


def _leaves_out_workspace(func: Any, args: tuple, kwargs: dict) -> Optional[str]:
    """The kernel's name when ``func`` is a graph task's `.out` kernel called without a workspace."""
    name = func._schema.name.partition("::")[2]
    kernel = f"{name}.{func._overloadname}"
    if kernel not in GRAPH_TASK_WORKSPACE_KERNELS:
        return None
    names = [argument.name for argument in func._schema.arguments]
    index = names.index("workspace")
    workspace = args[index] if index < len(args) else kwargs.get("workspace")
    return kernel if workspace is None else None


class TaskGroupGuard(LazyDynamoDispatchMode):
    """Refuses allocating ops while a task group (or a task update) is open."""

    def __init__(self, where: str) -> None:
        super().__init__()
        self.where = where

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        impl = ag_ops._WRAPPER_OPS.get(func)
        if impl is not None:  # see the kernels the wrapper issues, not the wrapper
            with reentered(self), wrapper_reentry():
                return impl(*args, **kwargs)
        kernel = _leaves_out_workspace(func, args, kwargs)
        if kernel is not None:
            raise TaskGroupAllocation(WORKSPACE_LEFT_OUT.format(kernel=kernel, where=self.where))
        if _allocates(func):
            raise TaskGroupAllocation(
                f"simulator strictness: {func} allocates memory between {self.where}; a card accepts it, but "
                "the task update re-issues the kernel against a new allocation, so the captured task keeps a "
                "dangling address after the next update (a use-after-free). Allocate workspace, outputs and "
                "softmax_lse before graph_task_group_begin and pass them to the .out kernel (torch_npu's "
                "npugraph handler contract)"
            )
        return func(*args, **kwargs)


class FacadeRuntime:
    """The simulated NPU behind the facade, plus torch_npu's process-wide state."""

    def __init__(self, *, index: int = 0, **device_options: Any) -> None:
        from sim import npu_device
        from sim.npu_device.device_type import NpuDeviceType

        options = {**FACADE_DEVICE_DEFAULTS, **device_options}
        options.setdefault("profile", DEFAULT_PROFILE)
        # The facade's simulated NPU backs the npu torch device ``npu:<index>``: tensors say
        # where they live (npu: device memory; cpu: host memory, pinned or not).
        device_type = NpuDeviceType(npu_device.enable().extension, index)
        self.device = SimDevice(**options)
        self.device.device_type = device_type
        self.device.host_memory = device_type.host_memory
        profile = self.device.profile
        generation = next((g for g in DEVICE_NAMES if profile.name == g or profile.name.startswith(g + "-")), None)
        self.device_name = DEVICE_NAMES[generation] if generation else str(profile.soc)
        self.generation = generation or str(profile.name)
        self.device_count = 1  # `configure_devices` sets every NPU's count
        self.default_capture_stream: Optional[SimStream] = None  # torch.npu.graph's class-wide stream
        self._guards: dict[str, TaskGroupGuard] = {}
        self.open_super_kernel_scopes: list[Optional[str]] = []
        self.lock = threading.RLock()

    # -- the current NPU: per thread, as torch_npu's (aclrtSetDevice) and the npu device guard's
    @property
    def current_index(self) -> int:
        return _current_index()

    @current_index.setter
    def current_index(self, index: int) -> None:
        _set_current_index(index)

    # -- memory: the device's caching allocator (sim.memory), plus the growth of shared pools
    def allocated_bytes(self) -> int:
        """What the allocator hands out (the device pool's blocks and the graph pools), plus what
        shared pools hold beyond their largest graph because blocks stay held after capture
        (sim.memory_ledger.beyond_pool_bytes: the graph pools are charged their largest graph)."""
        return int(self.device.memory.allocated_bytes()) + beyond_pool_bytes(self.device)

    def reserved_bytes(self) -> int:
        """What the allocator holds (freed blocks stay until empty_cache), plus the same growth."""
        return int(self.device.memory.reserved_bytes()) + beyond_pool_bytes(self.device)

    # -- super kernel: CANN's aclsk API exists on Atlas A3 only
    @property
    def supports_super_kernel(self) -> bool:
        return self.device_name.startswith(SUPER_KERNEL_SOC_PREFIX)

    def check_super_kernel(self, what: str) -> None:
        if not self.supports_super_kernel:
            raise RuntimeError(SUPER_KERNEL_UNSUPPORTED.format(what=what, device=self.device_name,
                                                              generation=self.generation))

    # -- streams: torch_npu's set_stream is not a context, so the facade sets the
    # simulator's current stream directly (it is the device's per-thread slot).
    def set_current(self, stream: SimStream) -> None:
        self.device.set_current_stream(stream)

    # -- task-group guard: one while a task group is open ("group"), one while a task update is ("update")
    def push_guard(self, kind: str, where: str) -> None:
        self.pop_guard(kind)
        guard = TaskGroupGuard(where)
        guard.__enter__()
        self._guards[kind] = guard

    def pop_guard(self, kind: str) -> None:
        guard = self._guards.pop(kind, None)
        if guard is not None:
            withdraw(guard)  # wherever it sits on torch's mode stack (sim.mode_stack)

    @property
    def guarded(self) -> bool:
        return bool(self._guards)

    # -- what a caller left open, and closing it
    def open_work(self) -> list[str]:
        """What is open on the facade's NPU, in words: a task update, a capture (with a task
        group open in it), a super kernel scope. Empty when nothing is."""
        scopes = [f"super kernel scope {name!r}" if name else "a super kernel scope" for name in self.open_super_kernel_scopes]
        return self.device.open_work() + scopes

    def leave_stream_by_exception(self, stream: SimStream) -> None:
        """An exception leaves ``torch.npu.stream(stream)``: a task update open on it is closed
        (discarded), and so is a capture begun on it (aborted, its task group discarded); their
        modes come off torch's mode stacks. torch_npu keeps them open (the next
        ``graph_task_update_begin`` on a card fails until ``_end``), which a suite cannot recover
        from; docs/facade.md, deviations table."""
        device = self.device
        update = device.update_in_progress
        if update is not None and update.stream is stream:
            self.pop_guard("update")
            device.abandon_task_update()
        capture = device.capture_in_progress
        if capture is not None and capture.stream is stream:
            self.pop_guard("group")
            device.abandon_open_work()

    def close_open_work(self) -> list[str]:
        """Close everything `open_work` reports (as leaving it by an exception would) and say
        what it was: the facade's guards and the simulator's collector and capture modes come off
        torch's mode stacks, so later ops of the process run eagerly again."""
        found = self.open_work()
        for kind in list(self._guards):
            self.pop_guard(kind)
        self.device.abandon_open_work()
        self.open_super_kernel_scopes.clear()
        return found

    def retire(self) -> list[str]:
        """This NPU is replaced by a fresh one (`configure`): close what is open, and forget the
        queued work that can never run (a replay behind an event nothing records: the test that
        left it saw, or should have seen, `GraphHang`), so a tensor of this NPU that a process
        global keeps does not meet that hang in a later test. What was open or stuck, in words."""
        from sim.npu_device import host_guard

        found = self.close_open_work()
        left = [f"queued work that cannot run: {item}" for item in self.device.queues.abandon()]
        host_guard.forget(self.device)  # its queued copies never run: nothing for the host to race with
        return found + left


_LOCK = threading.RLock()  # re-entered: retiring an NPU runs its queued work, which asks for the runtime
_RUNTIME: Optional[FacadeRuntime] = None  # NPU 0
_MORE: list[FacadeRuntime] = []  # NPUs 1..n-1 after `configure_devices`
_THREAD = threading.local()  # .index: the calling thread's current NPU (torch_npu's is per thread)


def _current_index() -> int:
    return int(getattr(_THREAD, "index", 0))


def _set_current_index(index: int) -> None:
    _THREAD.index = int(index)


def runtime() -> FacadeRuntime:
    """The runtime of the calling thread's current NPU (`torch.npu.set_device`; NPU 0 unless
    `configure_devices` made more; created on first use with the default A2 profile)."""
    with _LOCK:
        index = _current_index()
        if 0 < index <= len(_MORE):
            return _MORE[index - 1]
        return _zero()


def runtime_at(index: int) -> FacadeRuntime:
    """The runtime of NPU ``index`` (``npu:<index>``), whichever thread asks."""
    with _LOCK:
        runtimes = [_zero()] + _MORE
        if not 0 <= index < len(runtimes):
            raise RuntimeError("Invalid device id")  # the npu device's own text (sim/npu_device/csrc)
        return runtimes[index]


def _zero() -> FacadeRuntime:
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is None:
            _RUNTIME = FacadeRuntime()
        return _RUNTIME


def _retire_all() -> None:
    global _RUNTIME
    for rt in ([_RUNTIME] if _RUNTIME is not None else []) + _MORE:
        rt.retire()  # its modes would stay on torch's stacks for the whole process
    _MORE.clear()


def _announce_count(count: int) -> None:
    """The npu device's device count (its index check), when the facade's npu device is in use."""
    from sim import npu_device

    if npu_device.enabled():
        npu_device.extension().set_device_count(count)


def configure(**device_options: Any) -> FacadeRuntime:
    """A fresh simulated NPU for the facade (SimDevice options: profile, faults, stream_limit,
    seed ...): the whole NPU is new (current stream, torch.npu.graph's capture stream, pools,
    suspended replays, graphs), and what the previous one left open (a capture, a task group, a
    task update) is closed first, its modes taken off torch's mode stacks. Graphs, streams and
    events of the previous one must not be used again. One NPU: the ones `configure_devices`
    made beside NPU 0 are retired too."""
    global _RUNTIME
    with _LOCK:
        _retire_all()
        _RUNTIME = FacadeRuntime(**device_options)
        _announce_count(1)
        _set_current_index(0)
        return _RUNTIME


def configure_devices(options: Sequence[Mapping[str, Any]]) -> list[FacadeRuntime]:
    """Fresh simulated NPUs ``npu:0`` .. ``npu:<n-1>``, one per entry of ``options`` (each
    entry: `configure`'s options for that NPU, e.g. a fault plan on one of them), as the NPUs
    of one host: ``torch.npu.device_count()`` is n, and each thread's ``torch.npu.set_device(i)``
    makes NPU i the one its facade calls and npu tensors use (the current device is per
    thread, as torch_npu's is). What the previous NPUs left open is closed first (`configure`)."""
    global _RUNTIME
    if not options:
        raise ValueError("configure_devices needs the options of at least one NPU")
    with _LOCK:
        _retire_all()
        runtimes = [FacadeRuntime(index=i, **dict(entry)) for i, entry in enumerate(options)]
        for rt in runtimes:
            rt.device_count = len(runtimes)
        _RUNTIME = runtimes[0]
        _MORE.extend(runtimes[1:])
        _announce_count(len(runtimes))
        _set_current_index(0)
        return runtimes


@contextlib.contextmanager
def configured(**device_options: Any) -> Iterator[FacadeRuntime]:
    """A fresh simulated NPU for the block (`configure`), then the previous one again: a test
    that needs a special device (a stream limit, an old HDK) leaves the process-wide one as
    it was (``--npu-facade-process-wide``)."""
    global _RUNTIME
    with _LOCK:
        previous, previous_more = _RUNTIME, list(_MORE)
    fresh = configure(**device_options)
    try:
        yield fresh
    finally:
        with _LOCK:
            fresh.retire()
            _RUNTIME = previous
            _MORE[:] = previous_more
            _announce_count(1 + len(previous_more))
