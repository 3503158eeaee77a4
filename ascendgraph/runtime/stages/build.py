"""Build stage: the device, the dispatcher, the workload check and the persistent input buffers.

`Engine.__init__` (ascendgraph.runtime.engine) builds in this order: make the device
(`make_device`), resolve the configuration against it, the dispatcher (`make_dispatcher`), the
workload (and check that every request fits the model, `check_requests_fit`), the model with
its two KV caches, the persistent input buffers (`make_inputs`), the capture state and the
compile backend; then it composes the stages over them. Everything here is a plain function of
what it is given.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Sequence

import torch

from ascendgraph.config import GraphConfig
from ascendgraph.device import Device, FaultInjection, Float32Attention, get_device, resolve_device_name
from ascendgraph.dispatch import GraphDispatcher
from ascendgraph.errors import ConfigError
from ascendgraph.leniency import FLOAT32_ATTENTION_WARNING, FLOAT32_ON_NPU, LENIENT_FLOAT32
from ascendgraph.models.presets import ModelSpec
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Resolution
from ascendgraph.runtime.options import EngineOptions
from ascendgraph.runtime.stages.records import Inputs
from ascendgraph.runtime.workload import Request

__all__ = [
    "make_device",
    "make_dispatcher",
    "check_requests_fit",
    "make_inputs",
    "FLOAT32_ATTENTION_WARNING",
    "LENIENT_FLOAT32",
]

log = logging.getLogger("ascendgraph.runtime.engine")


def _declare_float32(lenient: list[str]) -> None:
    """float32 on the simulator is a declared leniency (docs/decisions.md): one warning, listed as lenient."""
    log.warning("%s", FLOAT32_ATTENTION_WARNING)
    lenient.append(LENIENT_FLOAT32)


def make_device(options: EngineOptions, dtype: torch.dtype, soc: str, lenient: list[str]) -> Device:
    """The engine's device: the caller's Device object (its fault plan and float32 leniency
    applied), or one made by backend name with the simulator's options. A declared leniency is
    appended to ``lenient``."""
    device = options.device
    if not isinstance(device, str):
        if options.faults is not None:
            if not isinstance(device, FaultInjection):
                raise ConfigError("--faults needs the sim device (fault injection is simulated)", key="faults")
            device.set_fault_plan(options.faults)
        if dtype is torch.float32 and isinstance(device, Float32Attention):  # the simulator, made by the caller
            device.allow_float32_attention_now()
            _declare_float32(lenient)
        return device
    name = device.strip().lower()
    sim_only = options.faults is not None or options.sim_profile is not None
    if name == "auto":
        # fault injection only exists on the simulator; otherwise the backend auto lands on,
        # so the simulator's options (profile, seed, stream limit) apply to `auto` too
        name = "sim" if sim_only else resolve_device_name(name)
    if name == "npu" and sim_only:
        raise ConfigError(
            "--faults and --sim-profile need --device sim (they configure the simulator)", key="device"
        )
    float32 = dtype is torch.float32
    if name == "npu" and float32:
        raise ConfigError(FLOAT32_ON_NPU, key="dtype")
    device_options: dict[str, Any] = {}
    if name == "sim":
        device_options = {"seed": options.seed, "profile": options.sim_profile or soc}
        if float32:
            device_options["allow_float32_attention"] = True
            _declare_float32(lenient)
        if options.stream_limit is not None:
            device_options["stream_limit"] = options.stream_limit
        if options.faults is not None:
            device_options["faults"] = options.faults
        if options.env is not None:
            device_options["env"] = options.env
    return get_device(name, **device_options)


def make_dispatcher(config: GraphConfig, resolution: Resolution, mode: GraphMode) -> GraphDispatcher:
    """The dispatcher of a mode: the resolved capture sizes as keys (none in NONE)."""
    return GraphDispatcher(
        mode,
        capture_sizes=resolution.capture_sizes if mode is not GraphMode.NONE else [],
        max_num_seqs=config.max_num_seqs,
        uniform_decode_query_len=config.uniform_decode_query_len,
        max_loras=config.max_loras,
        specialize_lora=config.cudagraph_specialize_lora,
    )


def check_requests_fit(requests: Sequence[Request], spec: ModelSpec, query_len: int) -> None:
    """Every request's prompt, outputs and one query fit the model's positions (ConfigError naming it)."""
    limit = spec.max_position_embeddings
    for request in requests:
        longest = request.prompt_len + request.max_tokens + query_len
        if longest > limit:
            raise ConfigError(
                f"request {request.request_id} needs {longest} positions (prompt {request.prompt_len} + "
                f"{request.max_tokens} outputs + {query_len}) but the model has {limit}",
                key="requests",
            )


def make_inputs(config: GraphConfig, resolution: Resolution, spec: ModelSpec, device: Device) -> Inputs:
    """The persistent input buffers, sized for the largest batch and capture size."""
    torch_device = device.torch_device
    max_tokens = max(config.max_num_batched_tokens, resolution.max_capture_size, 1)
    rows = max(config.max_num_seqs, 1) + 1  # a spare zero row: the FULL-graph dummy request
    width = max(1, math.ceil(spec.max_position_embeddings / config.block_size))
    return Inputs(
        input_ids=torch.zeros(max_tokens, dtype=torch.long, device=torch_device),
        positions=torch.zeros(max_tokens, dtype=torch.long, device=torch_device),
        slot_mapping=torch.full((max_tokens,), -1, dtype=torch.long, device=torch_device),
        block_table=torch.zeros((rows, width), dtype=torch.int32, device=torch_device),
    )
