"""The module objects the facade puts in place of torch_npu.

``torch_npu`` (a package-like module: the kernels as attributes, ``npu``, ``_C``,
``version``, ``utils``, ``profiler``), ``torch_npu.npu`` = ``torch.npu`` =
`sim.facade.npu` (one module, late-bound), ``torch_npu._C`` (``_weak_ref_tensor``,
``_NPUTaskGroupHandle``). Built once per process; `install()` puts them in
``sys.modules`` and on ``torch``, `uninstall()` takes them away again.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Optional

import torch

from sim.capture import TaskGroup
from sim.facade import kernels, npu
from sim.facade.runtime import runtime
from sim.facade.weak_refs import weak_ref_tensor

__all__ = ["FACADE_MARK", "VERSION", "facade_modules", "torch_npu_module"]

FACADE_MARK = "__ascendgraph_facade__"
DEVICE_TYPE_ATTRIBUTE = "__ascendgraph_torch_device_type__"
VERSION = "2.13.0"


def _weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """torch_npu's non-owning alias: it does not keep the storage alive, and a read after the
    storage was freed raises (`sim.facade.weak_refs`)."""
    return weak_ref_tensor(tensor)


def _get_cann_version(module: str = "CANN") -> str:
    profile = runtime().device.profile
    return profile.hdk_version if module == "DRIVER" else profile.cann_version


_MODULES: Optional[dict[str, ModuleType]] = None


def _module(name: str, doc: str, **attributes: Any) -> ModuleType:
    module = ModuleType(name, doc)
    setattr(module, FACADE_MARK, True)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def facade_modules() -> dict[str, ModuleType]:
    """sys.modules name -> module, for every module the facade provides."""
    global _MODULES
    if _MODULES is None:
        setattr(npu, FACADE_MARK, True)
        c_module = _module("torch_npu._C", "torch_npu._C on the simulator (sim.facade)",
                           _weak_ref_tensor=_weak_ref_tensor, _NPUTaskGroupHandle=TaskGroup)
        version = _module("torch_npu.version", "torch_npu.version (sim.facade)", __version__=VERSION)
        utils = _module("torch_npu.utils", "torch_npu.utils (sim.facade)", get_cann_version=_get_cann_version)
        from sim.facade import profiler

        profiler_module = profiler.module()
        setattr(profiler_module, FACADE_MARK, True)
        top = _module(
            "torch_npu",
            "torch_npu on the ascendgraph simulator (sim.facade): graph API, streams, events, memory and the "
            "kernels graph code calls, backed by a SimDevice; tensors are CPU tensors.",
            npu=npu, _C=c_module, version=version, utils=utils, profiler=profiler_module, __version__=VERSION, __path__=[],
            **{DEVICE_TYPE_ATTRIBUTE: "cpu"}, **kernels.exported_ops(),
        )
        _MODULES = {"torch_npu": top, "torch_npu.npu": npu, "torch_npu._C": c_module,
                    "torch_npu.version": version, "torch_npu.utils": utils,
                    "torch_npu.profiler": profiler_module}
    return _MODULES


def torch_npu_module() -> ModuleType:
    return facade_modules()["torch_npu"]


def is_facade(module: Any) -> bool:
    return bool(getattr(module, FACADE_MARK, False))


def put_in_place() -> None:
    modules = facade_modules()
    for name, module in modules.items():
        sys.modules[name] = module
    torch.npu = npu  # type: ignore[attr-defined]
    sys.modules["torch.npu"] = npu


def take_away() -> None:
    for name, module in facade_modules().items():
        if sys.modules.get(name) is module:
            del sys.modules[name]
    if getattr(torch, "npu", None) is npu:
        delattr(torch, "npu")
    if sys.modules.get("torch.npu") is npu:
        del sys.modules["torch.npu"]
