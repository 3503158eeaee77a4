"""A torch_npu-compatible facade over the simulator (``sim.facade``).

``import torch_npu`` gets a module with torch_npu 2.13's graph API, streams, events, memory
queries and the kernels graph code calls, backed by a `sim.device.SimDevice`;
``torch.npu`` is ``torch_npu.npu``. "npu" is a torch device (`sim.npu_device`, PyTorch's
PrivateUse1 backend spelled as torch_npu spells it): ``torch.empty(..., device="npu")``,
``tensor.npu()``, ``.to("npu", non_blocking=True)``, ``.cpu()``, ``.item()``, pinned host
memory (``pin_memory=True``, ``Tensor.pin_memory()``) and ``torch.npu.manual_seed`` work, and
the tensors' memory is the simulated NPU's (``torch.npu.memory_allocated``, graph pools,
``empty_cache``). Ops on npu tensors run the CPU kernels on that memory, queued on the current
stream; a host read of an npu tensor is a synchronisation (refused inside a capture). hw/
runs on npu tensors, as on a card.

Activation:

* ``python -m sim.facade -- CMD ...`` runs CMD (and its subprocesses) with the facade in
  place of torch_npu (a directory on PYTHONPATH whose ``torch_npu`` package is this facade);
* `install()` / `uninstall()` in process (tests). `configure()` gives the facade a fresh
  simulated NPU (a profile, a fault plan, a stream limit).

Installing builds the npu device's C++ extension on first use (once per machine, into the
cache: `sim.npu_device.build`) and spells PrivateUse1 "npu" for the rest of the process (torch
cannot undo it); `uninstall()` detaches the simulated NPU from the device.

The facade says once on stderr that it is active, and names an installed torch_npu it
shadows. Modules: ``runtime`` (the SimDevice and the task-group guard), ``npu`` (the
``torch_npu.npu`` module; ``super_kernel_options`` its option checks), ``kernels`` (the
``npu_facade`` ops; ``norm_quant`` the norm and quantisation kernels, ``attention_calls`` the
fused attention's argument layout), ``contracts`` (the kernel-contract seam), ``modules``
(the module objects), ``__main__`` (the launcher).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any, Optional

from sim.launcher_process import is_facade_launcher

if not is_facade_launcher():  # the launcher process only starts CMD (sim.launcher_process)
    from sim.facade.runtime import FacadeRuntime, configure, configure_devices, configured, runtime, runtime_at

__all__ = ["install", "uninstall", "is_installed", "configure", "configure_devices", "configured", "runtime",
           "runtime_at", "device", "check_memory",
           "NOTICE_VARIABLE", "notice_text", "real_torch_npu_location"]

NOTICE_VARIABLE = "ASCENDGRAPH_NPU_FACADE"  # set once the notice was printed (inherited by subprocesses)
_saved: dict[str, Any] = {}
_installed = False


def real_torch_npu_location() -> Optional[str]:
    """Where an installed torch_npu lives (None when there is none), without importing it."""
    module = sys.modules.get("torch_npu")
    if module is not None:
        from sim.facade.modules import is_facade

        return None if is_facade(module) else getattr(module, "__file__", None) or "an imported torch_npu"
    try:
        spec = importlib.util.find_spec("torch_npu")
    except (ImportError, ValueError):
        return None
    if spec is None or spec.origin is None or os.sep + "facade" + os.sep + "shim" + os.sep in spec.origin:
        return None
    return spec.origin


def notice_text(shadowed: Optional[str]) -> str:
    text = ("sim.facade: torch_npu is the ascendgraph simulator facade (no NPU is used; npu tensors live in host "
            "memory the simulator owns)")
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
    from sim import npu_device
    from sim.facade import modules

    shadowed = real_torch_npu_location()
    npu_device.enable()  # NpuDeviceBuildError (one line) when the extension does not build
    for name in ("torch_npu", "torch_npu.npu", "torch_npu._C", "torch_npu._C._distributed_c10d", "torch_npu.version",
                 "torch_npu.utils", "torch_npu.distributed", "torch_npu.profiler", "torch.npu"):
        if name in sys.modules:
            _saved[name] = sys.modules[name]
    import torch

    if hasattr(torch, "npu"):
        _saved["torch.npu attribute"] = torch.npu
    modules.put_in_place()
    npu_device.attach(lambda index: runtime_at(index).device)  # npu:<index> is the facade's simulated NPU <index>
    npu_device.extension().set_device_count(runtime_at(0).device_count)
    from sim.facade.kernels import HOST_TENSOR_ARGUMENTS, NAMESPACE

    for name, arguments in HOST_TENSOR_ARGUMENTS.items():
        npu_device.allow_host_tensors(f"{NAMESPACE}::{name}", arguments)
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
    from sim import npu_device
    from sim.facade import modules
    from sim.kernels import register_cpu_kernels

    npu_device.attach(None)
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

