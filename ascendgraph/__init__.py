"""ascendgraph: vLLM's graph mode on Ascend NPUs, against a pluggable device layer.

The public API is small; everything here is re-exported from its own module.
"""

import os as _os
import sys as _sys

# torch_npu registers itself for torch's device-backend autoload; with torch_npu installed
# but the CANN libraries missing, a plain `import torch` then fails. ascendgraph never
# relies on autoload (hw/ imports torch_npu explicitly, behind a guard), so it is switched
# off unless the user chose a value. The user's own value is kept here for `doctor`.
ORIGINAL_TORCH_DEVICE_BACKEND_AUTOLOAD = _os.environ.get("TORCH_DEVICE_BACKEND_AUTOLOAD")
if "torch" not in _sys.modules:
    _os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")

from ascendgraph.api import explain, run
from ascendgraph.config import GraphConfig
from ascendgraph.dispatch import BatchDescriptor, GraphDispatcher
from ascendgraph.errors import (
    CaptureConstraintError,
    CaptureError,
    ConfigError,
    DeviceLost,
    DeviceUnavailable,
    GraphHang,
    GraphModeError,
    NumericalMismatch,
    OldHdkStack,
    ResourceAllocFailed,
    StreamResourceExhausted,
    XliteConfigError,
    rewrite_capture_error,
)
from ascendgraph.modes import AttentionGraphSupport, CompilationMode, GraphMode
from ascendgraph.resolve import Decision, Resolution, narrow_for_attention, resolve
from ascendgraph.sizes import compute_capture_sizes, plan_stream_budget, select_sizes

__version__ = "0.1.0"


def __getattr__(name: str):
    # The report module imports nothing heavy, but keep the package import minimal.
    if name == "Report":
        from ascendgraph.runtime.report import Report

        return Report
    raise AttributeError(f"module 'ascendgraph' has no attribute {name!r}")

__all__ = [
    "AttentionGraphSupport",
    "BatchDescriptor",
    "CaptureConstraintError",
    "CaptureError",
    "CompilationMode",
    "ConfigError",
    "Decision",
    "DeviceLost",
    "DeviceUnavailable",
    "GraphConfig",
    "GraphDispatcher",
    "GraphHang",
    "GraphMode",
    "GraphModeError",
    "NumericalMismatch",
    "OldHdkStack",
    "Resolution",
    "ResourceAllocFailed",
    "StreamResourceExhausted",
    "XliteConfigError",
    "compute_capture_sizes",
    "narrow_for_attention",
    "plan_stream_budget",
    "resolve",
    "rewrite_capture_error",
    "select_sizes",
    "explain",
    "run",
    "Report",
    "__version__",
]
