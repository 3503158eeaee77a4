"""A torch_npu-compatible facade over the simulator (``sim.facade``).

``import torch_npu`` gets a module with torch_npu 2.13's graph API, streams, events,
memory queries and the kernels graph code calls, backed by a `sim.device.SimDevice`;
``torch.npu`` is ``torch_npu.npu``. Tensors stay CPU tensors: code that asks torch_npu
which torch device type to use (hw/ does, through ``hw.api.torch_device_type``) gets
``"cpu"``; code that spells ``device="npu"`` itself cannot run (see docs/facade.md).

Activation:

* ``python -m sim.facade -- CMD ...`` runs CMD (and its subprocesses) with the facade in
  place of torch_npu (a directory on PYTHONPATH whose ``torch_npu`` package is this facade);
* `install()` / `uninstall()` in process (tests). `configure()` gives the facade a fresh
  simulated NPU (a profile, a fault plan, a stream limit).

The ``npu`` device spelling is opt-in (``python -m sim.facade --npu-device -- CMD``, or
``ASCENDGRAPH_FACADE_NPU_DEVICE=1`` before the facade is installed): PrivateUse1 is renamed
"npu" so ``torch.device("npu")`` / ``"npu:0"`` construct (vLLM's ``DeviceConfig`` with
vLLM Ascend's ``NPUPlatform`` builds one), ``Tensor.npu()`` returns the CPU tensor itself,
and ``Tensor.pin_memory()`` copies into host memory the facade remembers as pinned
(`sim.facade.pinned`: torch asks the accelerator's C++ hooks for a pinned allocator, which a
Python backend cannot provide).
Allocating a tensor *on* the npu device still fails (there is no PrivateUse1 allocator;
vLLM Ascend's NPUModelRunner needs one). The rename cannot be undone within a process,
so it stays off unless asked for: code that tests ``device.type == "npu"`` to mean "a real
NPU" does not change behaviour silently.

The facade says once on stderr that it is active, and names an installed torch_npu it
shadows. Modules: ``runtime`` (the SimDevice and the task-group guard), ``npu`` (the
``torch_npu.npu`` module), ``pinned`` (pinned host memory), ``kernels`` (the ``npu_facade`` ops), ``contracts`` (the
kernel-contract seam), ``modules`` (the module objects), ``__main__`` (the launcher).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Optional

from sim.facade.runtime import FacadeRuntime, configure, configured, runtime

__all__ = ["install", "uninstall", "is_installed", "configure", "configured", "runtime", "device", "check_memory",
           "NOTICE_VARIABLE",
           "notice_text", "real_torch_npu_location", "NPU_DEVICE_VARIABLE", "enable_npu_device_spelling",
           "npu_device_spelling_enabled"]

NOTICE_VARIABLE = "ASCENDGRAPH_NPU_FACADE"  # set once the notice was printed (inherited by subprocesses)
NPU_DEVICE_VARIABLE = "ASCENDGRAPH_FACADE_NPU_DEVICE"  # "1": spell PrivateUse1 "npu" (opt-in, irreversible)
_saved: dict[str, Any] = {}
_installed = False


def real_torch_npu_location() -> Optional[str]:
    """Where an installed torch_npu lives (None when there is none), without importing it."""
    from sim.facade.modules import is_facade

    module = sys.modules.get("torch_npu")
    if module is not None and not is_facade(module):
        return getattr(module, "__file__", None) or "an imported torch_npu"
    if module is not None:
        return None
    try:
        spec = importlib.util.find_spec("torch_npu")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or os.sep + "facade" + os.sep + "shim" + os.sep in spec.origin:
        return None
    return spec.origin


def notice_text(shadowed: Optional[str]) -> str:
    text = "sim.facade: torch_npu is the ascendgraph simulator facade (no NPU is used; tensors stay on the CPU)"
    if shadowed:
        text += f"; the installed torch_npu ({shadowed}) is shadowed"
    return text


def say_active(shadowed: Optional[str]) -> None:
    """The one stderr line (once per process tree: subprocesses inherit the marker)."""
    if os.environ.get(NOTICE_VARIABLE) == "announced":
        return
    os.environ[NOTICE_VARIABLE] = "announced"
    print(notice_text(shadowed), file=sys.stderr, flush=True)


def install(*, quiet: bool = False) -> None:
    """Put the facade in place of torch_npu in this process (idempotent)."""
    global _installed
    if _installed:
        return
    from sim.facade import modules

    shadowed = real_torch_npu_location()
    for name in ("torch_npu", "torch_npu.npu", "torch_npu._C", "torch_npu._C._distributed_c10d", "torch_npu.version",
                 "torch_npu.utils", "torch_npu.distributed", "torch_npu.profiler", "torch.npu"):
        if name in sys.modules:
            _saved[name] = sys.modules[name]
    import torch

    if hasattr(torch, "npu"):
        _saved["torch.npu attribute"] = torch.npu
    modules.put_in_place()
    if os.environ.get(NPU_DEVICE_VARIABLE) == "1":
        enable_npu_device_spelling()
    _installed = True
    if not quiet or shadowed:
        say_active(shadowed)


def uninstall() -> None:
    """Take the facade away again and restore what was there (a real torch_npu, the
    simulator's own CPU kernels for the ascendgraph ops)."""
    global _installed
    if not _installed:
        return
    from ascendgraph import ops
    from sim.facade import modules
    from sim.kernels import register_cpu_kernels

    modules.take_away()
    import torch

    for name, module in list(_saved.items()):
        if name == "torch.npu attribute":
            torch.npu = module  # type: ignore[attr-defined]  # torch.npu is what the facade installs (torch has no npu attribute of its own)
        else:
            sys.modules[name] = module
    _saved.clear()
    # hw/ on the facade routes the ascendgraph ops through its kernel router on the CPU
    # (wrapper ops + CPU kernels); give them back to the simulator.
    for name in ops.OP_NAMES:
        ops.unregister_wrapper_op(ops.kernel_op(name))
    register_cpu_kernels()
    _installed = False


def _tensor_npu(self: Any, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    """``Tensor.npu()`` on the facade: tensors stay CPU tensors, so the tensor itself."""
    return self


def npu_device_spelling_enabled() -> bool:
    import torch

    return torch._C._get_privateuse1_backend_name() == "npu"


def enable_npu_device_spelling() -> None:
    """Spell PrivateUse1 "npu" and give tensors ``.npu()`` and the facade's ``pin_memory()`` /
    ``is_pinned()`` (`sim.facade.pinned`) (idempotent; cannot be undone)."""
    import torch

    if not npu_device_spelling_enabled():
        torch.utils.rename_privateuse1_backend("npu")
    if getattr(torch.Tensor, "npu", None) is not _tensor_npu:
        torch.Tensor.npu = _tensor_npu  # type: ignore[attr-defined]  # Tensor.npu is what the facade installs (torch_npu adds it on a node)
    from sim.facade.pinned import install_pinned_memory

    install_pinned_memory()  # torch now has an accelerator ("npu") whose pinned allocator it asks for


def is_installed() -> bool:
    return _installed


def device() -> Any:
    """The SimDevice behind the facade (recorded ops, stats, fault plans)."""
    return runtime().device


def check_memory(*, records: Any = None, workspaces: Any = None, graphs: tuple[Any, ...] = ()) -> Any:
    """What the facade's captured graphs keep alive and what they need not
    (`sim.memory_ledger.check_memory` on the facade's SimDevice): ``records`` and
    ``workspaces`` map a graph (an ``NPUGraph``, a SimGraph or its name) to the parameter
    records / workspace cache kept for it, e.g. vLLM Ascend's ``graph_params.attn_params[n]``."""
    from sim.memory_ledger import check_memory as check

    return check(runtime().device, records=records, workspaces=workspaces, graphs=graphs)


FacadeRuntime = FacadeRuntime
