"""ascendgraph: vLLM's graph mode on Ascend NPUs, against a pluggable device layer.

The public API is small; everything here is re-exported from its own module.
"""

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
    "__version__",
]
