"""Host reads and writes of host memory a queued non-blocking copy has not finished with.

Why. ``pinned.copy_(npu_tensor, non_blocking=True)`` returns before the device copied, and so
does ``npu_tensor.copy_(pinned, non_blocking=True)`` (torch's rule: a ``non_blocking`` copy
from or into pinned memory is asynchronous). On a card the host must wait for the copy —
``stream.synchronize()``, ``torch.npu.synchronize()``, or an event recorded after the copy and
synchronized — before it reads the destination (it reads stale bytes otherwise) or writes
the source (the copy may send the new bytes). torch_npu reports neither: the data are just
wrong, or right by luck of timing. The simulator names the race, as it names the device-side
ordering hazards: ``StreamOrderError`` ("... reads host memory that copy (device to host,
non_blocking into pinned memory) on stream 0 fills, and nothing waited for that copy ...";
`sim.stream_order`, ``HOST_ACCESS_BEFORE_COPY``).

Theory of operation. Pinned memory is CPU memory: torch runs its ops without the npu device
seeing them. So while a copy with a host side is queued on a simulated NPU (`guard_copy`,
called by the fallback after `sim.npu_device.simulator.copy`), the thread's `HostBufferGuard`, a
``TorchFunctionMode``, sits on torch's function-mode stack and checks what the host does
with CPU tensors (`SimDevice.host_access`, which knows the queued copies' host bytes):

* Python-level reads that dispatch no op (``Tensor.tolist()``, ``.numpy()``, ``repr`` /
  ``str`` / ``format``, ``__array__``) read the tensor;
* every other call runs under a dispatch mode for its duration (`_OpGuard`) that looks at each
  op whose tensors are all CPU tensors: an argument the op's schema writes (``Tensor(a!)``) is
  a write, any other a read; views and ops that only look at metadata (``*_like``, sizes) are
  neither. An op with an npu tensor is the device's (a copy between host and device is
  ordered by its stream), and the device's own work — a queue being run, a kernel on CPU
  aliases of device memory — is not the host's.

The guard steps off the stack when the host waited for every such copy (a listener of the
device queues' host waits); inside the guard's own handler it cannot, and does at the next
wait. It is per thread, as torch's mode stacks are. What it cannot see: accesses through a
NumPy array made before the copy (vLLM's ``CpuGpuBuffer.np``), raw pointers, or another thread.
Under ``lag="synchronous"`` the host waits for every copy, so nothing is guarded.
"""

from __future__ import annotations

import threading
import weakref
from typing import TYPE_CHECKING, Any, Optional

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from sim.mode_stack import on_stack, run_functionalized_ops_under, withdraw
from sim.npu_device import simulator

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["HostBufferGuard", "guard_copy", "guard", "forget"]

# Python-level reads of a tensor's values that dispatch no op (torch 2.13: tolist and numpy read
# the CPU memory directly; __repr__ formats it).
READS_WITHOUT_AN_OP = frozenset({"tolist", "numpy", "__repr__", "__str__", "__format__", "__array__"})
# Ops that look at their tensor arguments' metadata only.
METADATA_OPS = frozenset({"is_pinned", "is_same_size", "size", "stride", "numel", "sym_size", "sym_stride",
                          "sym_numel", "sym_storage_offset", "is_contiguous", "_has_compatible_shallow_copy_type"})


def _written_arguments(func: Any) -> frozenset[int]:
    """Positions of the schema arguments the op writes (``Tensor(a!)``)."""
    return frozenset(index for index, argument in enumerate(func._schema.arguments)
                     if argument.alias_info is not None and argument.alias_info.is_write)


def _reads_data(func: Any) -> bool:
    name = func._schema.name.split("::")[-1]
    return not (func.is_view or name.endswith("_like") or name in METADATA_OPS)


class _OpGuard(TorchDispatchMode):
    """The ops of one host call, checked against the guard's devices (module docstring)."""

    def __init__(self, owner: "HostBufferGuard") -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if _reads_data(func):
            written = _written_arguments(func)
            names = [argument.name for argument in func._schema.arguments]
            accesses: list[tuple[torch.Tensor, bool]] = []
            host_only = True
            for index, value in enumerate([*args, *(kwargs.get(name) for name in names[len(args):])]):
                for leaf in tree_flatten(value)[0]:
                    if isinstance(leaf, torch.Tensor):
                        if leaf.device.type != "cpu":
                            host_only = False
                        else:
                            accesses.append((leaf, index in written))
            if host_only:
                for tensor, write in accesses:
                    self.owner.check(tensor, f"{func} on the host", write=write)
        return func(*args, **kwargs)


# a compiled graph's mutating ops (auto_functionalized_v2) issued while the guard watches: their ops
# are checked as any others (vLLM's compiled model runs its attention op that way)
run_functionalized_ops_under(_OpGuard)


class HostBufferGuard(TorchFunctionMode):
    """One thread's guard of host memory queued copies have not finished with."""

    def __init__(self) -> None:
        super().__init__()
        self.devices: "weakref.WeakSet[SimDevice]" = weakref.WeakSet()
        self._listening: "weakref.WeakSet[SimDevice]" = weakref.WeakSet()
        self.pushed = False  # on the stack (or taken off for a moment by torch, inside its handler)
        self._ops = _OpGuard(self)

    # -- what is pending
    def _pending(self) -> list["SimDevice"]:
        pending = [device for device in list(self.devices) if simulator.host_copies_pending(device)]
        for device in list(self.devices):
            if device not in pending:
                self.devices.discard(device)
        return pending

    def _device_is_working(self) -> bool:
        from sim.npu_device.fallback import running_on_device

        return running_on_device() or any(simulator.device_is_running_work(device) for device in list(self.devices))

    def check(self, tensor: torch.Tensor, what: str, *, write: bool = False) -> None:
        if self._device_is_working():
            return
        for device in self._pending():
            simulator.host_access(device, tensor, what, write=write)

    # -- on and off the stack
    def watch(self, device: "SimDevice") -> None:
        self.devices.add(device)
        if device not in self._listening:
            self._listening.add(device)
            guard_ref = weakref.ref(self)
            simulator.on_host_wait(device, lambda: _settle(guard_ref))
        if not self.pushed:
            self.__enter__()  # stays on the stack until the host waited (settle)
            self.pushed = True

    def settle(self) -> None:
        """Step off the stack once nothing is pending (a no-op inside the guard's own handler,
        where torch has taken it off for the moment)."""
        if self.pushed and not self._pending() and on_stack(self):
            withdraw(self)
            self.pushed = False

    # -- the host's calls
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if torch.compiler.is_compiling():
            # Dynamo traces through function modes: its tensors are fake (no host bytes to race
            # with), and tracing the checks (a ContextVar read) would break the graph, which
            # vLLM's fullgraph compile refuses.
            return func(*args, **kwargs)
        if not self.devices or self._device_is_working():
            return func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if name in READS_WITHOUT_AN_OP:
            if args and isinstance(args[0], torch.Tensor) and args[0].device.type == "cpu":
                self.check(args[0], f"Tensor.{name}()")
            return func(*args, **kwargs)
        if not self._pending() or not _takes_a_tensor(args, kwargs):
            # A call given no tensor reads or writes no host buffer (a factory such as
            # torch.tensor(values, device="npu"), which torch 2.13 cannot run under a dispatch
            # mode: its Python-key exclusion meets the npu device's Python fallback, an internal assert).
            return func(*args, **kwargs)
        with self._ops:
            return func(*args, **kwargs)

    def forget(self, device: "SimDevice") -> None:
        """Stop watching ``device``'s copies (a device replaced: they will never run)."""
        self.devices.discard(device)
        self.settle()


def _takes_a_tensor(args: Any, kwargs: Any) -> bool:
    return any(isinstance(leaf, torch.Tensor) for leaf in tree_flatten((args, kwargs))[0])


def _settle(guard_ref: "weakref.ref[HostBufferGuard]") -> None:
    guard_ = guard_ref()
    if guard_ is not None:
        guard_.settle()


_THREAD = threading.local()


def guard() -> Optional[HostBufferGuard]:
    """The current thread's guard, if a copy ever made one."""
    return getattr(_THREAD, "guard", None)


def forget(device: "SimDevice") -> None:
    """``device`` is replaced (the facade's ``configure``): the copies still queued on it will never
    run, so this thread's guard stops checking the host against them."""
    current = guard()
    if current is not None:
        current.forget(device)


def guard_copy(device: "SimDevice") -> None:
    """A copy with a host side was queued on ``device``: guard its host memory on this thread
    until the host waited for it (module docstring)."""
    if not simulator.host_copies_pending(device):
        return
    current = guard()
    if current is None:
        current = _THREAD.guard = HostBufferGuard()
    current.watch(device)
