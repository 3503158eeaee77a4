"""What a SimDevice asks about the npu device type it backs (``SimDevice.device_type``).

The simulator's own tensors are CPU tensors that stand for device memory. When a SimDevice
backs the npu device (the torch_npu facade's), tensors say where they live: an npu tensor is
device memory, a CPU tensor is host memory (pinned or not). The capture and the task update
ask this object three things:

* `allocate_like` — a capture's output: an npu tensor from the device's allocator, which hands
  out a block of the capture's graph pool while the stream captures (`sim.memory`);
* `route` — what an op is by where its tensors live: host work (no npu tensor, no npu target:
  it runs now, the graph does not see it, as a card's host code), a host synchronisation (a
  blocking or pageable copy between host and device: a card cannot capture it, and the
  capture fails with the simulator's host-sync text), or None (a device op, captured);
* `program_alias` — the alias of a graph-pool tensor a recorded program keeps: non-owning, so
  the block goes back to the pool when the captured code drops its tensor and a later capture
  may be handed it, as on a card (`sim.capture.Capture._bind`).
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.utils._pytree import tree_flatten

__all__ = ["NpuDeviceType", "HOST_WORK"]

HOST_WORK = "host work"
NPU = "npu"
D2H_SYNC = ("{op}: a copy from the device into host memory that is blocking or pageable (Tensor.cpu(), "
            ".to('cpu'), copy_ into an unpinned tensor)")
H2D_SYNC = ("{op}: a copy from host memory to the device that is blocking or from pageable memory (use a pinned "
            "source and non_blocking=True, or copy before the capture)")


def _device_of(value: Any) -> Optional[torch.device]:
    if value is None:
        return None
    if isinstance(value, torch.device):
        return value
    if isinstance(value, (str, int)):
        return torch.device(value)
    return None


class NpuDeviceType:
    """The npu device type as a SimDevice sees it (module docstring)."""

    def __init__(self, extension: Any, index: int = 0) -> None:
        self._ext = extension
        self.torch_device = torch.device(NPU, index)

    @staticmethod
    def host_memory(tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` lives in host memory: a CPU tensor (reading it waits for nothing)."""
        return tensor.device.type == "cpu"

    def allocate_like(self, meta: torch.Tensor) -> torch.Tensor:
        return torch.empty_strided(meta.size(), meta.stride(), dtype=meta.dtype, device=self.torch_device)

    def program_alias(self, tensor: torch.Tensor) -> torch.Tensor:
        """A recorded npu tensor on a graph-pool block, as the program keeps it: non-owning and
        unchecked (the program's own view of the block)."""
        if tensor.device.type != NPU:
            return tensor
        return self._ext.weak_alias(tensor, -1)

    def route(self, func: Any, args: tuple, kwargs: dict) -> Optional[str]:
        leaves, _ = tree_flatten((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        name = func._schema.name
        if name == "aten::_to_copy":
            source, target = args[0], _device_of(kwargs.get("device"))
            non_blocking = bool(kwargs.get("non_blocking", False))
            if source.device.type == NPU and target is not None and target.type == "cpu":
                return D2H_SYNC.format(op=func)
            if source.device.type == "cpu" and target is not None and target.type == NPU:
                return None if non_blocking and source.is_pinned() else H2D_SYNC.format(op=func)
        if name == "aten::copy_" and len(args) >= 2:
            destination, source = args[0], args[1]
            non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if destination.device.type == "cpu" and source.device.type == NPU:
                return None if non_blocking and destination.is_pinned() else D2H_SYNC.format(op=func)
            if destination.device.type == NPU and source.device.type == "cpu" and source.dim() > 0:
                return None if non_blocking and source.is_pinned() else H2D_SYNC.format(op=func)
        if any(t.device.type == NPU for t in tensors):
            return None
        target = _device_of(kwargs.get("device"))
        if target is not None and target.type == NPU:
            return None
        return HOST_WORK
