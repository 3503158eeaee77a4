"""The simulated NPU as a torch device: ``torch.empty(..., device="npu")`` on the CPU simulator.

torch's PrivateUse1 backend, spelled "npu" as torch_npu spells it, backed by a `SimDevice`:

* ``csrc/npu_device.cpp`` — the C++ torch needs (allocator, pinned host allocator, device
  guard, hooks, generators, metadata kernels), forwarding every decision to
* `driver` — the Python driver (which simulated NPU, which block of memory, which stream), and
* `fallback` — every other op: the CPU kernel on CPU aliases of the device memory (no copies),
  submitted to the stream's queue;
* `simulator` — the one seam to the SimDevice's internals;
* `build` — compiling the C++ once per machine into the cache.

`enable()` loads the extension (building it on first use), spells PrivateUse1 "npu", gives
tensors and modules their ``.npu()`` / ``is_npu`` and attaches the driver; `attach()` says which
SimDevice serves the device. Both are process-wide (torch's device registration cannot be
undone). The torch_npu facade (`sim.facade`) does both when it is installed; docs/facade.md
describes what the device models and where it deviates from torch_npu.
"""

from __future__ import annotations

import sys
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Union, cast

import torch

from sim.npu_device import simulator
from sim.npu_device.build import NpuDeviceBuildError, load_extension
from sim.npu_device.driver import Driver, NoSimulatedNpu
from sim.npu_device.fallback import running_on_device

if TYPE_CHECKING:  # pragma: no cover
    from sim.device import SimDevice

__all__ = ["enable", "enabled", "attach", "driver", "extension", "weak_alias", "is_weak_alias", "default_generator", "pinned_bytes",
           "allow_host_tensors", "running_on_device",
           "NpuDeviceBuildError", "NoSimulatedNpu", "DEVICE_TYPE", "OTHER_BACKEND"]

DEVICE_TYPE = "npu"
OTHER_BACKEND = (
    "sim.npu_device: torch's PrivateUse1 backend is already '{name}' in this process (another extension registered "
    "it); the simulated NPU needs it as 'npu'. Run without that extension (TORCH_DEVICE_BACKEND_AUTOLOAD=0)"
)


class _Device:
    """The process-wide state torch's registration implies: the extension, the driver, the fallback."""

    def __init__(self, extension: ModuleType) -> None:
        from sim.npu_device.fallback import Fallback

        self.extension = extension
        self.driver = Driver()
        self.driver._extension_weak_token = extension.weak_token
        extension.set_driver(self.driver)
        from sim.pool_checks import register_weak_view_resolver

        register_weak_view_resolver(self.driver.weak_view)  # a capture sees weak aliases of pool blocks
        self.generators: dict[int, Any] = {}  # index -> torch.Generator (one Python object per default generator)
        self.fallback = Fallback(self.driver, extension, self.default_generator)
        self.library = torch.library.Library("_", "IMPL")
        self.library.fallback(self.fallback, dispatch_key="PrivateUse1")

    def default_generator(self, index: int) -> Any:
        generator = self.generators.get(index)
        if generator is None:
            generator = self.generators[index] = self.extension.default_generator(index)
        return generator


_LOCK = threading.Lock()
_DEVICE: Optional[_Device] = None


def enable(cache_root: Optional[str] = None) -> _Device:
    """Make "npu" a torch device backed by the simulator (idempotent; NpuDeviceBuildError when
    the extension does not build)."""
    global _DEVICE
    with _LOCK:
        if _DEVICE is not None:
            return _DEVICE
        name = torch._C._get_privateuse1_backend_name()
        if name not in ("privateuseone", DEVICE_TYPE):
            raise RuntimeError(OTHER_BACKEND.format(name=name))
        extension = load_extension(cache_root)
        if name != DEVICE_TYPE:
            torch.utils.rename_privateuse1_backend(DEVICE_TYPE)
        if not hasattr(torch.Tensor, "is_npu"):
            torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True,
                                                                 for_packed_sequence=False)
        _DEVICE = _Device(extension)
        if not hasattr(torch, DEVICE_TYPE):  # torch asks torch.<device> for a device's RNG and lazy init
            module = _device_module(extension)
            torch.npu = module  # type: ignore[attr-defined]  # torch has no npu attribute of its own: the device module is ours
            sys.modules["torch.npu"] = module
        return _DEVICE


def _device_module(extension: ModuleType) -> ModuleType:
    """A minimal ``torch.npu`` while the torch_npu facade (which brings torch_npu's) is not
    installed: what torch itself asks a device module for once "npu" is its accelerator
    (``torch.random.fork_rng``, ``torch.manual_seed``, a device's lazy initialisation)."""
    module = ModuleType("torch.npu", "the simulated NPU's device module (sim.npu_device); the torch_npu facade "
                                     "puts torch_npu.npu in its place while it is installed")

    def generator(device: Any = None) -> Any:
        index = torch.device(device).index if isinstance(device, (str, torch.device)) else device
        return default_generator(extension.current_device() if index is None else int(index))

    def manual_seed_all(seed: int) -> None:
        for index in range(extension.device_count()):
            default_generator(index).manual_seed(int(seed))

    attributes: dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "_is_in_bad_fork": lambda: False,
        "device_count": extension.device_count,
        "current_device": extension.current_device,
        "set_device": extension.set_device,
        "manual_seed": lambda seed: generator().manual_seed(int(seed)),
        "manual_seed_all": manual_seed_all,
        "get_rng_state": lambda device="npu": generator(device).get_state(),
        "set_rng_state": lambda new_state, device="npu": generator(device).set_state(new_state),
    }
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


def enabled() -> bool:
    return _DEVICE is not None


def _device() -> _Device:
    if _DEVICE is None:
        raise NoSimulatedNpu("sim.npu_device is not enabled (sim.npu_device.enable())")
    return _DEVICE


def attach(device: Union[None, "SimDevice", Mapping[int, "SimDevice"], Callable[[int], "SimDevice"]]) -> None:
    """Which simulated NPU serves ``npu:<index>``: a SimDevice (``npu:0``, the only device), a
    mapping ``{index: SimDevice}`` (as many devices as entries, numbered from 0), a callable
    ``index -> SimDevice`` (one device), or None (none: making an npu tensor raises
    NoSimulatedNpu)."""
    state = _device()
    if device is None:
        state.driver.attach(None)
        return
    if isinstance(device, Mapping):
        devices = dict(device)
        if sorted(devices) != list(range(len(devices))):
            raise ValueError(f"sim.npu_device.attach: device indices must be 0..{len(devices) - 1}, got {sorted(devices)}")
        state.extension.set_device_count(len(devices))

        def provider(index: int) -> "SimDevice":
            if index not in devices:
                raise RuntimeError("Invalid device id")
            return devices[index]

        state.driver.attach(provider)
        return
    state.extension.set_device_count(1)
    if callable(device) and not hasattr(device, "current_stream"):
        state.driver.attach(device)
        return
    fixed = cast("SimDevice", device)
    state.driver.attach(lambda index: fixed)


def driver() -> Driver:
    return _device().driver


def extension() -> ModuleType:
    return _device().extension


def allow_host_tensors(op_name: str, arguments: frozenset[str]) -> None:
    """Let the arguments ``arguments`` of the op ``op_name`` ("namespace::name") be host (CPU)
    tensors next to npu ones: a kernel that reads them on the host (the ATB paged attention's
    ``context_lens``). Every other CPU tensor beside npu tensors is refused in torch's words."""
    _device().fallback.allow_host_tensors(op_name, frozenset(arguments))


def weak_alias(tensor: torch.Tensor) -> torch.Tensor:
    """torch_npu._C._weak_ref_tensor on the npu device: a plain npu tensor over the same memory
    that owns nothing; an op on it after its block was freed or handed out again raises
    DeadWeakReference (`sim.npu_device.simulator.check_weak_reference`)."""
    state = _device()
    if tensor.device.type != DEVICE_TYPE:
        raise TypeError(f"weak_alias expects an npu tensor, got one on {tensor.device}")
    previous = state.extension.weak_token(tensor)
    if previous >= 0:  # a weak alias of a weak alias: the same block, the same generation
        token = state.driver.copy_weak_token(previous)
    else:
        base = tensor.untyped_storage().data_ptr()
        owner = state.driver.owner(base) or state.driver.device(tensor.device.index or 0)
        what = f"shape {tuple(tensor.shape)}, {str(tensor.dtype).replace('torch.', '')}"
        token = state.driver.new_weak_token(owner, tensor, what)
    return state.extension.weak_alias(tensor, token)


def settled_host_view(tensor: torch.Tensor, what: str) -> torch.Tensor:
    """A CPU tensor over ``tensor``'s memory (an npu tensor's bytes live in host memory the
    simulator owns), owning nothing, once the simulated NPU holding it has run its work up to
    this point: when that NPU is running queued work right now (a graph replay reached the call),
    what came before has run; otherwise the host waits for its current stream first (``what``
    names the wait). For the simulator's own data movement between simulated NPUs (a collective
    of the fabric's torch.distributed backend, sim.process_group); the caller keeps ``tensor``."""
    state = _device()
    if tensor.device.type != DEVICE_TYPE:
        raise TypeError(f"settled_host_view expects an npu tensor, got one on {tensor.device}")
    device = state.driver.owner(tensor.untyped_storage().data_ptr()) or state.driver.device(tensor.device.index or 0)
    if not simulator.device_is_running_work(device):
        simulator.host_read(device, what)
    (alias,), _, _ = state.extension.cpu_aliases([tensor], False)
    return alias


def run_queued_work(what: str) -> None:
    """The calling thread's current simulated NPU runs its queued work (every stream) now, as a
    card keeps running while the host blocks (``what``: the blocking call). Nothing when no
    simulated NPU is attached or when its queued work is what is running right now."""
    if _DEVICE is None or not _DEVICE.driver.attached:
        return
    device = _DEVICE.driver.device(int(_DEVICE.extension.current_device()))
    if not simulator.device_is_running_work(device):
        simulator.flush(device, None, reason=what)


def is_weak_alias(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a weak alias (`weak_alias`): an npu tensor that owns nothing."""
    if _DEVICE is None or tensor.device.type != DEVICE_TYPE:
        return False
    return bool(_DEVICE.extension.weak_token(tensor) >= 0)


def default_generator(index: int = 0) -> Any:
    """torch_npu's default generator of ``npu:<index>`` (``torch.npu.default_generators[index]``)."""
    return _device().default_generator(index)


def pinned_bytes() -> int:
    """Bytes of pinned host memory in use (Tensor.pin_memory(), torch.empty(..., pin_memory=True))."""
    return int(_device().extension.pinned_bytes())
