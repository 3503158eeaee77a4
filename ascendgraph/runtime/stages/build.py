"""Build stage: the device, the dispatcher and the persistent input buffers of an engine.

`Engine.__init__` (ascendgraph.runtime.engine) builds in this order: resolve the configuration,
make the device (`_make_device`), the dispatcher (`_make_dispatcher`), the workload (and check
that every request fits the model, `_check_requests_fit`), the model with its two KV caches,
the persistent input buffers (`_make_inputs`), the capture state and the compile backend.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

import torch

from ascendgraph.config import GraphConfig
from ascendgraph.device import Device, get_device, resolve_device_name
from ascendgraph.dispatch import GraphDispatcher
from ascendgraph.errors import ConfigError
from ascendgraph.leniency import FLOAT32_ATTENTION_WARNING, FLOAT32_ON_NPU, LENIENT_FLOAT32
from ascendgraph.models.presets import ModelSpec
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Resolution
from ascendgraph.runtime.stages.records import Inputs
from ascendgraph.runtime.workload import Request

if TYPE_CHECKING:
    from ascendgraph.runtime.engine import EngineOptions

__all__ = ["BuildStage", "FLOAT32_ATTENTION_WARNING", "LENIENT_FLOAT32"]

log = logging.getLogger("ascendgraph.runtime.engine")


class BuildStage:
    """The engine's construction helpers (a part of `Engine`, readable on its own)."""

    config: GraphConfig
    options: "EngineOptions"
    resolution: Resolution
    device: Device
    spec: ModelSpec
    query_len: int
    requests: list[Request]
    dtype: torch.dtype
    lenient: list[str]

    def _declare_float32(self) -> None:
        """float32 on the simulator is a declared leniency (docs/decisions.md): one warning, listed as lenient."""
        log.warning("%s", FLOAT32_ATTENTION_WARNING)
        self.lenient.append(LENIENT_FLOAT32)

    def _make_device(self) -> Device:
        device = self.options.device
        if not isinstance(device, str):
            if self.options.faults is not None:
                set_plan = getattr(device, "set_fault_plan", None)
                if set_plan is None:
                    raise ConfigError("--faults needs the sim device (fault injection is simulated)", key="faults")
                set_plan(self.options.faults)
            allow = getattr(device, "allow_float32_attention_now", None)
            if self.dtype is torch.float32 and allow is not None:  # the simulator, made by the caller
                allow()
                self._declare_float32()
            return device
        name = device.strip().lower()
        sim_only = self.options.faults is not None or self.options.sim_profile is not None
        if name == "auto":
            # fault injection only exists on the simulator; otherwise the backend auto lands on,
            # so the simulator's options (profile, seed, stream limit) apply to `auto` too
            name = "sim" if sim_only else resolve_device_name(name)
        if name == "npu" and sim_only:
            raise ConfigError(
                "--faults and --sim-profile need --device sim (they configure the simulator)", key="device"
            )
        float32 = self.dtype is torch.float32
        if name == "npu" and float32:
            raise ConfigError(FLOAT32_ON_NPU, key="dtype")
        device_options: dict[str, Any] = {}
        if name == "sim":
            device_options = {"seed": self.options.seed, "profile": self.options.sim_profile or self.config.soc}
            if float32:
                device_options["allow_float32_attention"] = True
                self._declare_float32()
            if self.options.stream_limit is not None:
                device_options["stream_limit"] = self.options.stream_limit
            if self.options.faults is not None:
                device_options["faults"] = self.options.faults
            if self.options.env is not None:
                device_options["env"] = self.options.env
        return get_device(name, **device_options)

    def _make_dispatcher(self, mode: GraphMode) -> GraphDispatcher:
        config = self.config
        return GraphDispatcher(
            mode,
            capture_sizes=self.resolution.capture_sizes if mode is not GraphMode.NONE else [],
            max_num_seqs=config.max_num_seqs,
            uniform_decode_query_len=config.uniform_decode_query_len,
            max_loras=config.max_loras,
            specialize_lora=config.cudagraph_specialize_lora,
        )

    def _check_requests_fit(self) -> None:
        limit = self.spec.max_position_embeddings
        for request in self.requests:
            longest = request.prompt_len + request.max_tokens + self.query_len
            if longest > limit:
                raise ConfigError(
                    f"request {request.request_id} needs {longest} positions (prompt {request.prompt_len} + "
                    f"{request.max_tokens} outputs + {self.query_len}) but the model has {limit}",
                    key="requests",
                )

    def _make_inputs(self) -> Inputs:
        config = self.config
        device = self.device.torch_device
        max_tokens = max(config.max_num_batched_tokens, self.resolution.max_capture_size, 1)
        rows = max(config.max_num_seqs, 1) + 1  # a spare zero row: the FULL-graph dummy request
        width = max(1, math.ceil(self.spec.max_position_embeddings / config.block_size))
        return Inputs(
            input_ids=torch.zeros(max_tokens, dtype=torch.long, device=device),
            positions=torch.zeros(max_tokens, dtype=torch.long, device=device),
            slot_mapping=torch.full((max_tokens,), -1, dtype=torch.long, device=device),
            block_table=torch.zeros((rows, width), dtype=torch.int32, device=device),
        )

