"""How to run a configuration: `EngineOptions` (everything that is not the vLLM configuration
itself), its validation and the run-wide defaults and bounds.

The engine (`ascendgraph.runtime.engine`) and its stages read the options; nothing here builds
anything, so the stages can name the options without importing the engine.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence, Union

import torch

from ascendgraph.compile.pass_manager import PassManager
from ascendgraph.device import Device
from ascendgraph.errors import ConfigError
from ascendgraph.models.build import parse_dtype
from ascendgraph.runtime.threads import AUTO, ThreadRequest, resolve_num_threads
from ascendgraph.runtime.workload import Request, ScheduledBatch, WorkloadSpec

__all__ = [
    "EngineOptions",
    "validate_engine_options",
    "default_atol",
    "DEFAULT_REQUESTS",
    "ON_CAPTURE_ERROR",
    "MAX_REQUESTS",
    "MAX_SIMULATED_REQUESTS",
    "MAX_SEED",
]

DEFAULT_REQUESTS = 16
ON_CAPTURE_ERROR = ("raise", "eager")
# Upper bounds (the CLI's `ascendgraph.cli.args.LIMITS` say the same; a test keeps them equal).
MAX_REQUESTS = 1_000_000
# Requests one run simulates at most: every step runs the model on the CPU simulator (about 0.2 to
# 0.4 s of CPU a request for the default tiny model on a 2-core laptop, measured with
# `ascendgraph run --requests 16` and `--requests 160`), so a million requests would run for days.
# Larger workloads are for `ascendgraph plan --workload FILE`, which models the scheduler only.
MAX_SIMULATED_REQUESTS = 1_000
MAX_SEED = 2**63 - 1
_ATOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def default_atol(dtype: Union[str, torch.dtype]) -> float:
    """docs/semantics.md "Checking against eager": 1e-4 for float32, 2e-2 for bfloat16."""
    return _ATOL[parse_dtype(dtype)]


@dataclass(frozen=True)
class EngineOptions:
    """How to run a configuration (everything that is not the vLLM configuration itself)."""

    device: Union[str, Device] = "auto"
    requests: int = DEFAULT_REQUESTS
    seed: int = 0
    workload: Optional[Sequence[Request]] = None  # overrides requests / seed-generated prompts
    workload_spec: Optional[WorkloadSpec] = None
    on_capture_error: str = "raise"
    stream_limit: Optional[int] = None
    hccl_op_expansion_mode: Optional[str] = None
    faults: Optional[str] = None
    sim_profile: Optional[str] = None  # sim only: a profile name or calibration JSON; default: config.soc
    dtype: str = "bfloat16"  # what torch_npu's fused attention takes; float32 is a declared sim leniency
    atol: Optional[float] = None
    check_eager: bool = True
    debug: bool = False  # check input addresses at every replay
    progress: Optional[bool] = None  # None: when stderr is a terminal
    env: Optional[dict[str, str]] = None
    # torch intra-op threads, process-wide (ascendgraph.runtime.threads): "auto" is the CLI's policy
    # (1 unless OMP_NUM_THREADS is set), None leaves torch alone, an int asks for exactly that many.
    num_threads: ThreadRequest = AUTO
    pass_manager: Optional[PassManager] = None
    quantization: Optional[str] = None  # None | "w8a8" | "w8a8_dynamic": the W8A8-like model variant
    profile_dir: Optional[str] = None  # `run()` profiles capture + serving into this directory
    # Failure-mode switches for tests of docs/semantics.md §7 (never use them to "fix" a run).
    skip_param_update: bool = False  # the kernel is not re-issued: stale lengths -> wrong results
    record_update_events: bool = True  # False: replays wait for ever -> GraphHang
    # Simulated data parallelism (the engine is one process): the token counts of the OTHER
    # dp-1 ranks for each batch; xlite routes on the maximum over all ranks. None: they are idle.
    dp_peer_tokens: Optional[Callable[[ScheduledBatch], Sequence[int]]] = None

    def __post_init__(self) -> None:
        validate_engine_options(self)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_int(name: str, value: Any, low: int, high: int, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not _is_int(value) or not low <= value <= high:
        upper = "2**63 - 1" if high == 2**63 - 1 else str(high)
        raise ConfigError(f"{name} must be an integer from {low} to {upper}, got {value!r}", key=name)


def validate_engine_options(options: EngineOptions) -> None:
    """Every EngineOptions value has the right type and range (ConfigError naming it)."""
    device = options.device  # a backend name (checked by get_device) or a Device object
    if not isinstance(device, (str, Device)):
        raise ConfigError(f"device must be a backend name (sim, npu, auto) or a Device object, got {device!r}",
                          key="device")
    if options.on_capture_error not in ON_CAPTURE_ERROR:
        raise ConfigError(
            f"on_capture_error must be one of {', '.join(ON_CAPTURE_ERROR)}, got {options.on_capture_error!r}",
            key="on_capture_error",
        )
    _check_int("requests", options.requests, 1, MAX_REQUESTS)
    if options.requests > MAX_SIMULATED_REQUESTS:
        raise ConfigError(
            f"requests {options.requests} is more than a run simulates ({MAX_SIMULATED_REQUESTS} at most: every step "
            f"runs the model on the simulator, about 0.2-0.4 s of CPU a request, so this would take hours); "
            f"run at most {MAX_SIMULATED_REQUESTS} requests, or size a large workload with "
            f"`ascendgraph plan --workload FILE`",
            key="requests",
        )
    _check_int("seed", options.seed, 0, MAX_SEED)
    _check_int("stream_limit", options.stream_limit, 1, 2**63 - 1, optional=True)  # planning uses 2**30
    atol = options.atol
    if atol is not None and (isinstance(atol, bool) or not isinstance(atol, (int, float))
                             or not (atol >= 0 and math.isfinite(atol))):
        raise ConfigError(f"atol must be a finite number >= 0, got {atol!r}", key="atol")
    if options.profile_dir is not None and not (isinstance(options.profile_dir, (str, os.PathLike))
                                                and str(options.profile_dir).strip()):
        raise ConfigError(f"profile_dir must be a directory path, got {options.profile_dir!r}", key="profile_dir")
    if options.env is not None and not isinstance(options.env, Mapping):
        raise ConfigError(f"env must be a mapping of variable names to values, got {options.env!r}", key="env")
    parse_dtype(options.dtype)
    resolve_num_threads(options.num_threads)
