"""The keyword options of `sim.device.SimDevice` besides profile / stream_limit / faults /
cost_model: one table of names and meanings (unknown options are refused listing it), and the
checks of their values."""

from __future__ import annotations

from typing import Any, Mapping

from ascendgraph.errors import ConfigError

__all__ = ["OPTIONS", "STREAM_ERROR_VARIANTS", "check_option_names", "stream_error"]

# Keyword options SimDevice accepts besides profile / stream_limit / faults / cost_model.
OPTIONS = {
    "env": "mapping read for TASK_QUEUE_ENABLE at capture_begin (default: os.environ)",
    "seed": "seed of the fault plan's percentage draws (default 0)",
    "allow_rng_in_capture": "record RNG ops instead of rejecting them (default False)",
    "poison_capture_outputs": "fill fresh capture outputs with NaN until the first replay (default True)",
    "stream_error": "'207008' (default) or 'el0009': which CANN line a stream exhaustion carries",
    "record_kernels": "keep a KernelRecord per executed task from the start (default False)",
    "allow_float32_attention": "declared leniency (docs/decisions.md, 'float32 on the simulator'): accept float32 where the kernels take only "
    "float16/bfloat16 (an NPU would refuse it; default False)",
    "lazy_kernel_init": "model the workspace allocation of a kernel's first launch per shape, refused "
    "inside a capture (so captures need warm-ups; default True)",
    "require_task_updates": "a replay that executes a task group not updated since that replay began raises "
    "StaleGraphParams (default True; False leaves stale parameters to the check against eager)",
    "hccl_op_expansion_mode": "HCCL's collective expansion (AIV, or anything else: FFTS+) pricing captured "
    "collectives in streams (default: HCCL_OP_EXPANSION_MODE of env)",
    "meta_tensors": "tensors live on the meta device: captures still count streams, pool bytes and "
    "virtual time, but no memory is held and nothing computes (planning only; default False)",
    "torch_device": "the torch device the device's tensors live on: 'cpu' (default: CPU tensors stand for device "
    "memory) or 'npu' (the torch_npu facade's simulated NPU, sim.npu_device; set device_type too)",
    "lag": "when queued device work runs (sim.queues): 'device' (default, what a card does: when the host waits for "
    "it), 'immediate' (as soon as it is issued; the host still waits only when asked, so the ordering hazards are "
    "the same) or 'synchronous' (as soon as it is issued, and the host waits for every item)",
}
STREAM_ERROR_VARIANTS = ("207008", "el0009")


def check_option_names(options: Mapping[str, Any]) -> None:
    """Refuse unknown option names, listing the valid ones with their meaning."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(
            f"unknown SimDevice option(s) {', '.join(unknown)}; valid options: "
            + "; ".join(f"{k} ({v})" for k, v in OPTIONS.items()),
            key="device",
        )


def stream_error(options: Mapping[str, Any]) -> str:
    """Which CANN line a stream exhaustion carries (``stream_error``)."""
    value = str(options.get("stream_error", "207008")).lower()
    if value not in STREAM_ERROR_VARIANTS:
        raise ConfigError(
            f"stream_error must be one of {', '.join(STREAM_ERROR_VARIANTS)}, got {value!r}", key="stream_error"
        )
    return value
