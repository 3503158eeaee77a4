"""The module objects the facade puts in place of torch_npu.

``torch_npu`` (a package-like module: the kernels as attributes, ``npu``, ``_C``,
``version``, ``utils``, ``profiler``), ``torch_npu.npu`` = ``torch.npu`` =
`sim.facade.npu` (one module, late-bound), ``torch_npu._C`` (``_weak_ref_tensor``,
``_NPUTaskGroupHandle``). Built once per process; `install()` puts them in
``sys.modules`` and on ``torch``, `uninstall()` takes them away again.

Importable by real code. Every module carries a ``ModuleSpec`` (transformers asks
``importlib.util.find_spec("torch_npu")``, which raises for a module without one). Names
that vLLM Ascend and transformers read when they are *imported* exist even where graph mode
never calls them (`IMPORT_TIME_NAMES`): the NPU-only dtypes as torch_npu's dtype codes,
a few ``torch.npu`` memory/device queries answered from the SimDevice, and
`NotModelled` placeholders whose call raises one line
("torch_npu.X is not modelled by the simulator"). Each name is checked against the
torch-npu 2.13.0 wheel (tests/hw/test_torch_npu_contract.py).
"""

from __future__ import annotations

import importlib.machinery
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Optional

import torch

from sim.capture import TaskGroup
from sim.facade import kernels, model_kernels, moe_kernels, npu
from sim.facade.runtime import runtime
from sim.facade.weak_refs import weak_ref_tensor

__all__ = ["FACADE_MARK", "VERSION", "facade_modules", "torch_npu_module", "NotModelled", "NPU_DTYPE_CODES",
           "PLACEHOLDERS", "NPU_MODULE_EXTRAS", "TORCH_DISTRIBUTED_ALIASES",
           "C_DISTRIBUTED_PLACEHOLDERS"]

FACADE_MARK = "__ascendgraph_facade__"
VERSION = "2.13.0"


def _weak_ref_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """torch_npu's non-owning alias: a plain npu tensor over the same device memory that keeps
    nothing alive (`sim.npu_device.weak_alias`: an op on it after its block was freed or written
    by another graph raises). A CPU tensor gets `sim.facade.weak_refs`' alias."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == "npu":
        from sim import npu_device

        return npu_device.weak_alias(tensor)
    return weak_ref_tensor(tensor, runtime().device)


def _get_cann_version(module: str = "CANN") -> str:
    profile = runtime().device.profile
    return profile.hdk_version if module == "DRIVER" else profile.cann_version


class NotModelled:
    """A torch_npu name that exists so importing code works; calling it says plainly that the
    simulator does not model it (a kernel graph mode never issues, an MoE/MLA/quantised op...)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.__name__ = path.rpartition(".")[2]
        self.__qualname__ = self.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{self.path} is not modelled by the simulator (sim.facade; docs/vllm-ascend.md)")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return NotModelled(f"{self.path}.{name}")  # .default / .out overloads

    def __repr__(self) -> str:
        return f"<{self.path}: not modelled by the simulator>"


# torch_npu's own dtypes are integer codes beside torch's ScalarTypes (torch-npu 2.13.0
# torch_npu/op_plugin/meta/_meta_registrations.py:57-69, TORCH_NPU_DTYPE_TO_STRING_MAP);
# vLLM Ascend's MoE / quantisation modules read them at import time.
NPU_DTYPE_CODES: dict[str, int] = {"int4": 285, "hifloat8": 290, "float8_e8m0fnu": 293,
                                   "float4_e2m1fn_x2": 296, "float4_e1m2fn_x2": 297}

# torch_npu kernels that importing code names but graph mode on the facade does not issue.
PLACEHOLDERS: tuple[str, ...] = (
    "npu_fusion_attention",  # vllm_ascend/attention/attention_v1.py _forward_encoder_attention (pooling models)
    "npu_format_cast",  # vllm_ascend weight/cache format casts (NZ layouts are not modelled)
    "get_npu_format",
)


@dataclass(frozen=True)
class _DeviceProperties:
    """What ``torch.npu.get_device_properties()`` reports (torch_npu's _NPUDeviceProperties fields)."""

    name: str
    total_memory: int
    cube_core_num: int = 24
    vector_core_num: int = 48
    L2_cache_size: int = 192 * 1024 * 1024


def _memory_stats(device: Any = None) -> dict[str, int]:
    rt = runtime()
    allocated, reserved = rt.allocated_bytes(), rt.reserved_bytes()
    return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": allocated,
            "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved}


def _max_memory_allocated(device: Any = None) -> int:
    return runtime().allocated_bytes()


def _reset_peak_memory_stats(device: Any = None) -> None:
    """Peaks are not tracked separately from the current allocation: nothing to reset."""


def _get_device_properties(device: Any = None) -> _DeviceProperties:
    rt = runtime()
    return _DeviceProperties(name=rt.device_name, total_memory=int(rt.device.profile.memory_bytes))


class _NpuConfig:
    """``torch.npu.config``: torch_npu's option object (``allow_internal_format``); setting an
    option is remembered, nothing else changes on the simulator."""

    allow_internal_format = False


# Names added to ``torch.npu`` (= sim.facade.npu) when the module does not define them itself:
# vLLM Ascend's worker / platform and transformers read them at import or set-up time.
NPU_MODULE_EXTRAS: dict[str, Any] = {
    "memory_stats": _memory_stats,
    "max_memory_allocated": _max_memory_allocated,
    "reset_peak_memory_stats": _reset_peak_memory_stats,
    "get_device_properties": _get_device_properties,
    "config": _NpuConfig(),
}


def is_hccl_available() -> bool:
    """torch_npu's answer (torch-npu 2.13.0 torch_npu/distributed/distributed_c10d.py:320-321):
    whether an "hccl" backend is registered with torch.distributed. The simulator registers
    none (it has no collectives library), so on the facade this is False, as it would be for
    a torch_npu whose HCCL backend failed to register."""
    import torch.distributed as distributed

    return "hccl" in distributed.Backend.backend_list


# Names torch_npu puts on ``torch.distributed`` when it is imported (torch-npu 2.13.0
# torch_npu/_init/patches/distributed_patches.py:44-47, _PUBLIC_API_ALIASES, applied by
# apply_distributed_methods_patch). vLLM Ascend imports ``is_hccl_available`` from
# torch.distributed at module level (model_loader/netloader/executor/netloader_pg.py:25),
# which vLLM's model inspection subprocess reaches through the general plugins: without it a
# ModelConfig cannot be built.
TORCH_DISTRIBUTED_ALIASES: dict[str, Any] = {"is_hccl_available": is_hccl_available}

# torch_npu's C-level distributed bindings that vLLM Ascend imports at module level (the same
# netloader_pg.py:28 imports ProcessGroupHCCL); the simulator has no HCCL process group, so
# they are placeholders whose call says so.
C_DISTRIBUTED_PLACEHOLDERS: tuple[str, ...] = ("ProcessGroupHCCL",)

class HcclOptions:
    """``ProcessGroupHCCL.Options`` (a binding of lib/libtorch_npu.so in torch-npu 2.13.0, whose
    attributes include ``hccl_config`` and ``is_high_priority_stream``): a plain option record.
    vLLM Ascend's GroupCoordinator builds one for every process group it creates, whatever the
    backend (utils.py:960-965 create_hccl_pg_options, called from
    patch/worker/patch_distributed.py:160 at 182b75ea), and hands it to
    ``torch.distributed.new_group(..., pg_options=...)``, which ignores it for gloo."""

    def __init__(self, is_high_priority_stream: bool = False) -> None:
        self.is_high_priority_stream = is_high_priority_stream
        self.hccl_config: dict[str, Any] = {}
        self.global_ranks_in_group: list[int] = []
        self.group_id = ""
        self.group_name = ""


class ProcessGroupHCCL(NotModelled):
    """The HCCL process group: not modelled (constructing one says so), but its ``Options``
    record exists, as vLLM Ascend's group set-up builds one before choosing a backend."""

    Options = HcclOptions

    def __init__(self) -> None:
        super().__init__("torch_npu._C._distributed_c10d.ProcessGroupHCCL")


_MODULES: Optional[dict[str, ModuleType]] = None
_SAVED_DISTRIBUTED: dict[str, Any] = {}
_ABSENT = object()


def _spec(module: ModuleType, *, package: bool) -> None:
    """A ModuleSpec as an import would have left (no loader: the module is built in memory)."""
    spec = importlib.machinery.ModuleSpec(module.__name__, None, is_package=package)
    if package:
        spec.submodule_search_locations = []
    module.__spec__ = spec
    module.__loader__ = None
    module.__package__ = module.__name__ if package else module.__name__.rpartition(".")[0]


def _module(name: str, doc: str, **attributes: Any) -> ModuleType:
    module = ModuleType(name, doc)
    _spec(module, package=name in ("torch_npu", "torch_npu._C"))
    setattr(module, FACADE_MARK, True)
    for key, value in attributes.items():
        setattr(module, key, value)
    return module


def facade_modules() -> dict[str, ModuleType]:
    """sys.modules name -> module, for every module the facade provides."""
    global _MODULES
    if _MODULES is None:
        setattr(npu, FACADE_MARK, True)
        for name, value in NPU_MODULE_EXTRAS.items():
            if not hasattr(npu, name):
                setattr(npu, name, value)
        c_distributed = _module("torch_npu._C._distributed_c10d",
                                "torch_npu._C._distributed_c10d (sim.facade): HCCL process groups are not modelled",
                                ProcessGroupHCCL=ProcessGroupHCCL())
        c_module = _module("torch_npu._C", "torch_npu._C on the simulator (sim.facade)",
                           _weak_ref_tensor=_weak_ref_tensor, _NPUTaskGroupHandle=TaskGroup,
                           _distributed_c10d=c_distributed)
        version = _module("torch_npu.version", "torch_npu.version (sim.facade)", __version__=VERSION)
        utils = _module("torch_npu.utils", "torch_npu.utils (sim.facade)", get_cann_version=_get_cann_version)
        distributed = _module("torch_npu.distributed", "torch_npu.distributed (sim.facade): no collectives; "
                              "is_hccl_available only", **TORCH_DISTRIBUTED_ALIASES)
        from sim.facade import profiler

        profiler_module = profiler.module()
        setattr(profiler_module, FACADE_MARK, True)
        if getattr(profiler_module, "__spec__", None) is None:
            _spec(profiler_module, package=False)
        top = _module(
            "torch_npu",
            "torch_npu on the ascendgraph simulator (sim.facade): graph API, streams, events, memory and the "
            "kernels graph code calls, backed by a SimDevice; npu tensors live in the simulated NPU's memory.",
            npu=npu, _C=c_module, version=version, utils=utils, distributed=distributed, profiler=profiler_module,
            __version__=VERSION, __path__=[], **NPU_DTYPE_CODES,
            **model_kernels.exported_ops(), **moe_kernels.exported_ops(),
            **{name: NotModelled(f"torch_npu.{name}") for name in PLACEHOLDERS}, **kernels.exported_ops(),
        )
        _MODULES = {"torch_npu": top, "torch_npu.npu": npu, "torch_npu._C": c_module,
                    "torch_npu._C._distributed_c10d": c_distributed,
                    "torch_npu.version": version, "torch_npu.utils": utils, "torch_npu.distributed": distributed,
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
    torch.npu = npu  # type: ignore[attr-defined]  # torch.npu is what the facade installs (torch has no npu attribute of its own)
    sys.modules["torch.npu"] = npu
    import torch.distributed as distributed

    for name, value in TORCH_DISTRIBUTED_ALIASES.items():
        _SAVED_DISTRIBUTED.setdefault(name, getattr(distributed, name, _ABSENT))
        setattr(distributed, name, value)


def take_away() -> None:
    for name, module in facade_modules().items():
        if sys.modules.get(name) is module:
            del sys.modules[name]
    if getattr(torch, "npu", None) is npu:
        delattr(torch, "npu")
    if sys.modules.get("torch.npu") is npu:
        del sys.modules["torch.npu"]
    import torch.distributed as distributed

    for name, value in _SAVED_DISTRIBUTED.items():
        if value is _ABSENT:
            if getattr(distributed, name, None) is TORCH_DISTRIBUTED_ALIASES[name]:
                delattr(distributed, name)
        else:
            setattr(distributed, name, value)
    _SAVED_DISTRIBUTED.clear()
