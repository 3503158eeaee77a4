"""Every torch_npu attribute ``hw/`` touches, declared as data, and the one door to torch_npu.

Theory of operation. ``hw/`` never spells ``torch_npu.<something>`` in code. It declares
each attribute it uses here, as an `NpuApi` (dotted path, how many positional arguments
and which keyword names it passes), and reaches it through a `TorchNpu` namespace:

    npu.call(api.GRAPH, graph, pool=pool, stream=stream, capture_error_mode=mode)
    npu.get(api.PROFILER_LEVEL_1)
    npu.has(api.NPU_GRAPH_UPDATE)          # feature detection by attribute

So the list below *is* the list of torch_npu APIs the backend depends on.
``tests/hw/test_torch_npu_contract.py`` checks it against the real torch-npu 2.13.0 wheel
(read with ``ast``, never imported), and checks that every ``npu.call(api.X, ...)`` in
``hw/`` stays inside X's declared positional count and keyword names.

Kinds, i.e. where the wheel defines an attribute:

* ``python`` — a def / class / class attribute reachable through the wheel's Python
  modules (re-exports followed); a chain that ends in ``torch_npu._C`` is a C binding,
  checked by name in the shared libraries.
* ``op`` — an op-plugin operator (``torch.ops.npu.<name>``, exported as
  ``torch_npu.<name>``), checked against ``csrc/aten/npu_native_functions_by_codegen.yaml``.
* ``atb`` — an ATB operator exported lazily as ``torch_npu.<name>`` (needs the NNAL package
  at run time); its schema lives only inside ``lib/libop_plugin_atb.so``, so hw passes it
  positional arguments only.

Roles: ``call`` (hw calls it), ``read`` (hw reads or feature-detects it) and ``protocol``
(hw hands torch_npu objects to the core, which calls these methods through the Device
protocol: ``graph.replay()``, ``event.record(stream)`` ...).

The import guard also lives here: `load_torch_npu()` imports torch_npu once per process
and turns every way that can fail (not installed, CANN or driver missing, torch's
backend autoload error) into a one-line reason that says what to do.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from functools import lru_cache
from types import ModuleType
from typing import Any, Callable, Optional

__all__ = [
    "NpuApi",
    "TorchNpu",
    "APIS",
    "TORCH_NPU_VERSION",
    "load_torch_npu",
    "torch_npu_namespace",
    "unavailable_reason",
    "disable_backend_autoload",
    "captures_by_dispatch",
]

# The torch_npu release this backend is written and contract-tested against (torch 2.13).
TORCH_NPU_VERSION = "2.13.0"
AUTOLOAD_VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"

KINDS = ("python", "op", "atb")
ROLES = ("call", "read", "protocol")


@dataclass(frozen=True)
class NpuApi:
    """One torch_npu attribute hw/ depends on and the way hw/ calls it."""

    path: str  # dotted path from the top package, as hw reaches it at run time
    positional: int = 0  # the most positional arguments hw passes (``self`` counts for methods)
    keywords: tuple[str, ...] = ()  # every keyword name hw passes
    kind: str = "python"
    role: str = "call"
    optional: bool = False  # feature-detected: absence means a fallback, not an error
    why: str = ""

    def __post_init__(self) -> None:
        if not self.path.startswith("torch_npu."):
            raise ValueError(f"NpuApi path must start with 'torch_npu.': {self.path!r}")
        if self.kind not in KINDS or self.role not in ROLES:
            raise ValueError(f"NpuApi {self.path}: kind must be one of {KINDS}, role one of {ROLES}")
        if self.kind == "atb" and self.keywords:
            raise ValueError(f"NpuApi {self.path}: ATB ops have no readable schema; pass positional arguments only")

    @property
    def attribute_path(self) -> tuple[str, ...]:
        """The path below ``torch_npu`` (``("npu", "graph")``)."""
        return tuple(self.path.split(".")[1:])


def _api(path: str, positional: int = 0, *keywords: str, **options: Any) -> NpuApi:
    return NpuApi(path, positional, tuple(keywords), **options)


# --------------------------------------------------------------------------- the surface
# Device, streams, events (torch_npu/npu/__init__.py, utils.py, streams.py, memory.py).
NPU_MODULE = _api("torch_npu.npu", role="read", why="torch.npu.graph looks empty_cache up on it (see NpuDevice.graph)")
IS_AVAILABLE = _api("torch_npu.npu.is_available")
DEVICE_COUNT = _api("torch_npu.npu.device_count")
SET_DEVICE = _api("torch_npu.npu.set_device", 1)
CURRENT_DEVICE = _api("torch_npu.npu.current_device")
GET_DEVICE_NAME = _api("torch_npu.npu.get_device_name", why="names the SoC; returns the *current* device's name")
MEM_GET_INFO = _api("torch_npu.npu.mem_get_info", 0, "device")
GET_CANN_VERSION = _api("torch_npu.utils.get_cann_version", 0, "module", optional=True)
VERSION = _api("torch_npu.version.__version__", role="read")
CURRENT_STREAM = _api("torch_npu.npu.current_stream", 0, "device")
DEFAULT_STREAM = _api("torch_npu.npu.default_stream", 0, "device")
STREAM = _api("torch_npu.npu.Stream", 0, "device")
STREAM_CONTEXT = _api("torch_npu.npu.stream", 1)
SET_STREAM = _api("torch_npu.npu.set_stream", 1)
SYNCHRONIZE = _api("torch_npu.npu.synchronize", 0, "device")
EVENT = _api("torch_npu.npu.Event")
EXTERNAL_EVENT = _api("torch_npu.npu.ExternalEvent", why="wait may precede record; reset before reuse")
EMPTY_CACHE = _api("torch_npu.npu.empty_cache", why="also patched during capture, see NpuDevice.graph")
MEMORY_ALLOCATED = _api("torch_npu.npu.memory_allocated", 0, "device")
MEMORY_RESERVED = _api("torch_npu.npu.memory_reserved", 0, "device")
WEAK_REF_TENSOR = _api("torch_npu._C._weak_ref_tensor", 1, optional=True, why="non-owning alias of a tensor")

# Graphs (torch_npu/npu/graphs.py). torch.npu.graph's 4th positional parameter is
# auto_dispatch_capture, not CUDA's capture_error_mode: hw always passes keywords.
NPU_GRAPH = _api("torch_npu.npu.NPUGraph", why="NPUGraph() takes no arguments")
GRAPH = _api("torch_npu.npu.graph", 1, "pool", "stream", "capture_error_mode")
GRAPH_POOL_HANDLE = _api("torch_npu.npu.graph_pool_handle")
IS_CURRENT_STREAM_CAPTURING = _api("torch_npu.npu.is_current_stream_capturing")
TASK_GROUP_BEGIN = _api("torch_npu.npu.graph_task_group_begin", 1)
TASK_GROUP_END = _api("torch_npu.npu.graph_task_group_end", 1)
TASK_UPDATE_BEGIN = _api("torch_npu.npu.graph_task_update_begin", 2)
TASK_UPDATE_END = _api("torch_npu.npu.graph_task_update_end", 1)
NPU_GRAPH_UPDATE = _api("torch_npu.npu.NPUGraph.update", role="read", optional=True,
                        why="torch_npu's own parameter update (auto_dispatch_capture); detected, not used")
NPU_GRAPH_SUPER_KERNEL_OPTIMIZE = _api("torch_npu.npu.NPUGraph.super_kernel_optimize", 1, "optimize_options",
                                       optional=True)
SUPER_KERNEL_SCOPE_BEGIN = _api("torch_npu.npu.super_kernel_scope_begin", 1, optional=True,
                                why="vLLM Ascend opens super_kernel_scope('full_model') around FULL captures")
SUPER_KERNEL_SCOPE_END = _api("torch_npu.npu.super_kernel_scope_end", 1, optional=True)

# What the core calls on the graph / event / stream objects hw hands out (Device protocol).
NPU_GRAPH_CAPTURE_BEGIN = _api("torch_npu.npu.NPUGraph.capture_begin", 1, "pool", "capture_error_mode",
                               role="protocol")
NPU_GRAPH_CAPTURE_END = _api("torch_npu.npu.NPUGraph.capture_end", 1, role="protocol")
NPU_GRAPH_REPLAY = _api("torch_npu.npu.NPUGraph.replay", 1, role="protocol")
NPU_GRAPH_RESET = _api("torch_npu.npu.NPUGraph.reset", 1, role="protocol")
NPU_GRAPH_POOL = _api("torch_npu.npu.NPUGraph.pool", 1, role="protocol")
EVENT_RECORD = _api("torch_npu.npu.Event.record", 2, "stream", role="protocol")
EVENT_WAIT = _api("torch_npu.npu.Event.wait", 2, "stream", role="protocol")
EXTERNAL_EVENT_RECORD = _api("torch_npu.npu.ExternalEvent.record", 2, "stream", role="protocol")
EXTERNAL_EVENT_WAIT = _api("torch_npu.npu.ExternalEvent.wait", 2, "stream", role="protocol")
EXTERNAL_EVENT_RESET = _api("torch_npu.npu.ExternalEvent.reset", 2, "stream", role="protocol")
STREAM_SYNCHRONIZE = _api("torch_npu.npu.Stream.synchronize", 1, role="protocol")

# Profiler (torch_npu/profiler/).
PROFILE = _api("torch_npu.profiler.profile", 0, "activities", "on_trace_ready", "record_shapes",
               "profile_memory", "with_stack", "experimental_config")
PROFILE_STEP = _api("torch_npu.profiler.profile.step", 1, role="protocol")
TRACE_HANDLER = _api("torch_npu.profiler.tensorboard_trace_handler", 0, "dir_name", "worker_name",
                     "analyse_flag", "async_mode")
EXPERIMENTAL_CONFIG = _api("torch_npu.profiler._ExperimentalConfig", 0, "profiler_level", "aic_metrics",
                           "export_type", "record_op_args")
ACTIVITY_CPU = _api("torch_npu.profiler.ProfilerActivity.CPU", role="read")
ACTIVITY_NPU = _api("torch_npu.profiler.ProfilerActivity.NPU", role="read")
PROFILER_LEVEL_0 = _api("torch_npu.profiler.ProfilerLevel.Level0", role="read")
PROFILER_LEVEL_1 = _api("torch_npu.profiler.ProfilerLevel.Level1", role="read",
                        why="op_statistic.csv exists only at Level1 / Level2")
PROFILER_LEVEL_2 = _api("torch_npu.profiler.ProfilerLevel.Level2", role="read")
AIC_METRICS_NONE = _api("torch_npu.profiler.AiCMetrics.AiCoreNone", role="read")
AIC_METRICS_PIPE = _api("torch_npu.profiler.AiCMetrics.PipeUtilization", role="read")
EXPORT_TEXT = _api("torch_npu.profiler.ExportType.Text", role="read")

# Fused kernels behind the ascendgraph ops (hw/kernels.py).
NPU_RMS_NORM = _api("torch_npu.npu_rms_norm", 2, "epsilon", kind="op", optional=True)
NPU_ADD_RMS_NORM = _api("torch_npu.npu_add_rms_norm", 3, "epsilon", kind="op", optional=True)
NPU_DYNAMIC_QUANT = _api("torch_npu.npu_dynamic_quant", 1, kind="op", optional=True)
NPU_QUANTIZE = _api("torch_npu.npu_quantize", 4, "axis", "div_mode", kind="op", optional=True)
NPU_ADD_RMS_NORM_DYNAMIC_QUANT = _api("torch_npu.npu_add_rms_norm_dynamic_quant", 3, "epsilon", "output_mask",
                                      kind="op", optional=True)
NPU_ADD_RMS_NORM_QUANT = _api("torch_npu.npu_add_rms_norm_quant", 5, "epsilon", kind="op", optional=True)
NPU_ROTARY_EMBEDDING = _api("torch_npu._npu_rotary_embedding", 6, kind="atb", optional=True,
                            why="vLLM's rotary contract (positions + cos_sin_cache), in place")
NPU_RESHAPE_AND_CACHE = _api("torch_npu._npu_reshape_and_cache", 5, kind="atb", optional=True,
                             why="the KV write on 310P (vLLM Ascend's Ascend310PDeviceAdaptor)")
NPU_SCATTER_PA_KV_CACHE = _api("torch_npu.npu_scatter_pa_kv_cache", 5, "cache_mode", kind="op", optional=True,
                               why="the KV write on A2/A3/A5 (vLLM Ascend's BaseDeviceAdaptor), cache_mode='Norm'")
_FIA_KEYWORDS = ("atten_mask", "actual_seq_lengths", "actual_seq_lengths_kv", "block_table", "num_heads",
                 "scale", "input_layout", "num_key_value_heads", "sparse_mode", "block_size")
NPU_FIA_OUT = _api("torch_npu.npu_fused_infer_attention_score.out", 3, *_FIA_KEYWORDS, "workspace", "out",
                   kind="op", optional=True, why="paged attention with host actual_seq_lengths; out= keeps addresses")
NPU_FIA_MAX_WORKSPACE = _api("torch_npu._npu_fused_infer_attention_score_get_max_workspace", 3, *_FIA_KEYWORDS,
                             kind="op", optional=True)
NPU_FIA_INFER_OUTPUT = _api("torch_npu._npu_fused_infer_attention_score_infer_output", 2, "input_layout",
                            "block_table", "num_heads", "num_key_value_heads", kind="op", optional=True)


APIS: tuple[NpuApi, ...] = tuple(value for value in list(globals().values()) if isinstance(value, NpuApi))


# --------------------------------------------------------------------------- the namespace


class TorchNpu:
    """Resolves declared `NpuApi` paths on a torch_npu module (or a stand-in with the same shape).

    hw/ calls torch_npu only through ``call``/``get``/``has``, so every use is declared.
    Calls are checked against the declaration: a keyword that ``APIS`` does not list is a
    bug in hw/ (the contract test would not have checked it), reported as TypeError.
    """

    def __init__(self, module: Any) -> None:
        self.module = module
        self._cache: dict[NpuApi, Any] = {}

    def get(self, api: NpuApi) -> Any:
        """The attribute itself; AttributeError naming the torch_npu path when absent."""
        try:
            return self._cache[api]
        except KeyError:
            pass
        value = self.module
        walked = ["torch_npu"]
        for part in api.attribute_path:
            walked.append(part)
            try:
                value = getattr(value, part)
            except AttributeError:
                # A subpackage torch_npu did not import eagerly (torch_npu.profiler, ...).
                if not isinstance(value, ModuleType):
                    raise AttributeError(f"{'.'.join(walked)} is not available in this torch_npu") from None
                try:
                    value = importlib.import_module(".".join(walked))
                except ImportError:
                    raise AttributeError(f"{'.'.join(walked)} is not available in this torch_npu") from None
        self._cache[api] = value
        return value

    def has(self, api: NpuApi) -> bool:
        """Feature detection by attribute (never by version string)."""
        try:
            self.get(api)
        except AttributeError:
            return False
        return True

    def call(self, api: NpuApi, *args: Any, **kwargs: Any) -> Any:
        if len(args) > api.positional or not set(kwargs) <= set(api.keywords):
            raise TypeError(
                f"hw/ calls {api.path} with {len(args)} positional arguments and keywords {sorted(kwargs)}, "
                f"but hw/api.py declares at most {api.positional} positional and keywords {list(api.keywords)}: "
                "declare it there so the torch_npu contract test checks it"
            )
        return self.get(api)(*args, **kwargs)


# --------------------------------------------------------------------------- the import guard


def disable_backend_autoload() -> None:
    """Ask torch not to auto-import torch_npu when torch is first imported.

    With torch_npu installed but CANN missing, torch's autoload turns a plain ``import
    torch`` into RuntimeError. Only effective before torch's first import; an explicit
    user setting is respected, and the variable is set only while torch's import runs
    (`ascendgraph.torch_autoload`), so the caller's environment is left as it was.
    """
    from ascendgraph import torch_autoload

    torch_autoload.install()


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    cause = exc.__cause__ or exc.__context__
    if isinstance(exc, RuntimeError) and cause is not None and str(cause):
        text += f" (caused by {type(cause).__name__}: {' '.join(str(cause).split())})"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def import_failure_reason(exc: BaseException) -> str:
    """What an import failure of torch_npu means and what to do about it (one line)."""
    if isinstance(exc, ModuleNotFoundError) and exc.name == "torch_npu":
        return (
            f"torch_npu is not installed ({exc}); install CANN and torch-npu=={TORCH_NPU_VERSION}, "
            "or use --device sim"
        )
    return (
        f"torch_npu is installed but cannot be imported ({_one_line(exc)}); source the CANN environment "
        "(e.g. `source /usr/local/Ascend/ascend-toolkit/set_env.sh`), check the driver with `npu-smi info`, "
        "or use --device sim"
    )


def _import_torch_npu(importer: Callable[[str], ModuleType] = importlib.import_module) -> tuple[Optional[ModuleType], str]:
    disable_backend_autoload()
    try:
        return importer("torch_npu"), ""
    except (ImportError, OSError, RuntimeError) as exc:
        return None, import_failure_reason(exc)


@lru_cache(maxsize=1)
def _load_once() -> tuple[Optional[ModuleType], str]:
    return _import_torch_npu()


def load_torch_npu() -> tuple[Optional[ModuleType], str]:
    """(torch_npu, "") or (None, why it cannot be used). Imports at most once per process;
    a torch_npu already in ``sys.modules`` (the real one, or the simulator's facade put in
    place by ``sim.facade.install()``) is used as it is."""
    module = sys.modules.get("torch_npu")
    if module is not None:
        return module, ""
    return _load_once()


# The one seam between a real torch_npu and the simulator's facade (sim.facade, which marks
# its modules with this attribute). Both make "npu" tensors; the facade's graph capture is a
# dispatch mode, which captures the kernels an ascendgraph op issues only when the op is
# declared a wrapper op (ascendgraph.ops.register_wrapper_op), as a card's graph captures the
# torch_npu kernels.
FACADE_ATTRIBUTE = "__ascendgraph_facade__"


def captures_by_dispatch(module: Any) -> bool:
    """Whether ``module`` is the simulator's facade, whose captures record dispatched ops."""
    return bool(getattr(module, FACADE_ATTRIBUTE, False))


def torch_npu_namespace() -> TorchNpu:
    """The real torch_npu behind a `TorchNpu`; DeviceUnavailable-style RuntimeError if absent."""
    module, reason = load_torch_npu()
    if module is None:
        from ascendgraph.errors import DeviceUnavailable

        raise DeviceUnavailable(f"device 'npu' is not usable here: {reason}")
    return TorchNpu(module)


def unavailable_reason(npu: Optional[TorchNpu] = None) -> str:
    """'' when an NPU is usable through torch_npu, else a one-line reason with what to do."""
    if npu is None:
        module, reason = load_torch_npu()
        if module is None:
            return reason
        npu = TorchNpu(module)
    try:
        if not npu.call(IS_AVAILABLE):
            return (
                "torch_npu is installed but no NPU is visible (torch.npu.is_available() is False); check the "
                "driver with `npu-smi info` and ASCEND_RT_VISIBLE_DEVICES, or use --device sim"
            )
        count = int(npu.call(DEVICE_COUNT))
    except Exception as exc:  # availability must never raise
        return f"torch_npu could not query the NPUs ({_one_line(exc)}); check `npu-smi info`, or use --device sim"
    if count < 1:
        return "torch_npu sees 0 NPUs (check ASCEND_RT_VISIBLE_DEVICES and `npu-smi info`), or use --device sim"
    return ""
