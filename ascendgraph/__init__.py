"""ascendgraph: vLLM's graph mode on Ascend NPUs, against a pluggable device layer.

The public API is small; everything here is re-exported from its own module.
"""

import os as _os
import sys as _sys
import types as _types

# torch_npu registers itself for torch's device-backend autoload; with torch_npu installed
# but the CANN libraries missing, a plain `import torch` then fails. ascendgraph never
# relies on autoload (hw/ imports torch_npu explicitly, behind a guard), so it is switched
# off for torch's first import only, unless the user chose a value; the caller's os.environ
# is as it was once torch is imported (ascendgraph.torch_autoload). The user's own value is
# kept here for `doctor`.
ORIGINAL_TORCH_DEVICE_BACKEND_AUTOLOAD = _os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
if "torch" not in _sys.modules:
    from ascendgraph import torch_autoload as _torch_autoload

    _torch_autoload.install()

__version__ = "0.1.0"

# Public name -> the module that defines it. Imported on first use (PEP 562), so the console
# script starts with nothing heavy loaded and can settle Ctrl-C before any import runs.
_EXPORTS: dict[str, str] = {
    "explain": "ascendgraph.api",
    "run": "ascendgraph.api",
    "GraphConfig": "ascendgraph.config",
    "BatchDescriptor": "ascendgraph.dispatch",
    "GraphDispatcher": "ascendgraph.dispatch",
    "CaptureConstraintError": "ascendgraph.errors",
    "CaptureError": "ascendgraph.errors",
    "ConfigError": "ascendgraph.errors",
    "DeviceLost": "ascendgraph.errors",
    "DeviceUnavailable": "ascendgraph.errors",
    "GraphHang": "ascendgraph.errors",
    "GraphModeError": "ascendgraph.errors",
    "NumericalMismatch": "ascendgraph.errors",
    "OldHdkStack": "ascendgraph.errors",
    "ResourceAllocFailed": "ascendgraph.errors",
    "StreamResourceExhausted": "ascendgraph.errors",
    "XliteConfigError": "ascendgraph.errors",
    "rewrite_capture_error": "ascendgraph.errors",
    "AttentionGraphSupport": "ascendgraph.modes",
    "CompilationMode": "ascendgraph.modes",
    "GraphMode": "ascendgraph.modes",
    "Decision": "ascendgraph.resolve",
    "Resolution": "ascendgraph.resolve",
    "narrow_for_attention": "ascendgraph.resolve",
    "resolve": "ascendgraph.resolve",
    "compute_capture_sizes": "ascendgraph.sizes",
    "plan_stream_budget": "ascendgraph.sizes",
    "select_sizes": "ascendgraph.sizes",
    "Report": "ascendgraph.runtime.report",
    # many ranks (docs/ranks.md)
    "CollectiveDeadlock": "ascendgraph.errors",
    "CollectiveMismatch": "ascendgraph.errors",
    "CollectiveTimeout": "ascendgraph.errors",
    "RankOptions": "ascendgraph.runtime.ranks",
    "run_ranks": "ascendgraph.runtime.ranks",
}


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ascendgraph' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


# `resolve` is both a public function and the submodule defining it. Importing the submodule
# (`import ascendgraph.resolve`, `from ascendgraph.resolve import ...`) makes Python set the
# package attribute to the module, which would shadow the function for every later
# `from ascendgraph import resolve`: the package keeps the function instead, as an eager
# `from ascendgraph.resolve import resolve` did. (Use `importlib.import_module` for the module.)
_SHADOWED = frozenset(name for name, module in _EXPORTS.items() if module.rsplit(".", 1)[-1] == name)


class _Package(_types.ModuleType):
    def __setattr__(self, name: str, value: object) -> None:
        if name in _SHADOWED and isinstance(value, _types.ModuleType):
            value = getattr(value, name)
        super().__setattr__(name, value)


_sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


__all__ = [*_EXPORTS, "__version__"]
