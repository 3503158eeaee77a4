"""Pinned host memory on the facade: ``Tensor.pin_memory()`` / ``Tensor.is_pinned()``.

With torch_npu, ``tensor.pin_memory()`` copies a CPU tensor into page-locked host memory
taken from torch_npu's host allocator (the NPU's PrivateUse1 hooks answer torch's
``getPinnedMemoryAllocator``; torch-npu 2.13.0 ``torch_npu/npu/memory.py`` reports that
allocator's statistics as the "host pinned allocator"), and returns the copy; a tensor that
is already pinned is returned itself. vLLM Ascend's metadata builder pins
``query_start_loc_cpu`` before its host-to-device copy (vllm_ascend/attention/
attention_v1.py:347 at 182b75ea).

CPU torch cannot do this for a Python-registered PrivateUse1 backend: the hook object
Python may register (``torch._C._acc.PrivateUse1Hooks``) offers only ``is_available``,
``has_primary_context`` and ``is_built``, and torch refuses with "implement
getPinnedMemoryAllocator" (a C++ method). So under the ``npu`` device spelling the facade
replaces the two tensor methods: ``pin_memory()`` makes the same copy (same sizes, strides
and values) in ordinary host memory and remembers it as pinned; ``is_pinned()`` answers for
such copies and their views while the copy lives. Factory arguments (``torch.empty(...,
pin_memory=True)``) are not modelled: they still raise torch's error.

Pinned copies are the facade's host memory (`is_host_memory`, the SimDevice's
``host_memory``): a capture lets code read their values (host work: vLLM Ascend's sinks path
binds a pinned host ``seq_lens`` as a kernel's integer-list argument), while a read of any
other tensor is still refused as a host synchronisation.
"""

from __future__ import annotations

import functools
import weakref
from typing import Any, Optional

import torch

__all__ = ["install_pinned_memory", "pinned_memory_installed", "pin_memory", "is_pinned", "is_host_memory"]


class _PinnedHostMemory:
    """The storages this process pinned, by data pointer, each held weakly through its copy."""

    def __init__(self) -> None:
        self._by_pointer: dict[int, weakref.ref] = {}

    def add(self, tensor: torch.Tensor) -> None:
        pointer = tensor.untyped_storage().data_ptr()
        self._by_pointer[pointer] = weakref.ref(tensor, functools.partial(self._forget, pointer))

    def _forget(self, pointer: int, _ref: object) -> None:
        self._by_pointer.pop(pointer, None)

    def holds(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type != "cpu" or tensor.untyped_storage().nbytes() == 0:
            return False
        ref = self._by_pointer.get(tensor.untyped_storage().data_ptr())
        return ref is not None and ref() is not None


_HOST = _PinnedHostMemory()  # one host per process, as torch_npu has one host allocator per process
_ORIGINAL: dict[str, Any] = {}


def is_pinned(self: torch.Tensor, device: Optional[Any] = None) -> bool:
    return _HOST.holds(self)


def is_host_memory(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` lives in host memory on the facade: a pinned host copy or a view of
    one. Every other tensor stands for NPU memory (the facade's tensors are CPU tensors), so
    reading its value during a capture stays a host synchronisation."""
    return _HOST.holds(tensor)


def pin_memory(self: torch.Tensor, device: Optional[Any] = None) -> torch.Tensor:
    if self.device.type != "cpu" or self.layout != torch.strided:
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    if _HOST.holds(self):
        return self
    copy = torch.empty_strided(self.size(), self.stride(), dtype=self.dtype)
    copy.copy_(self)
    _HOST.add(copy)
    return copy


def install_pinned_memory() -> None:
    """Give tensors the facade's pin_memory / is_pinned (idempotent)."""
    for name, function in (("pin_memory", pin_memory), ("is_pinned", is_pinned)):
        current = getattr(torch.Tensor, name)
        if current is not function:
            _ORIGINAL.setdefault(name, current)
            setattr(torch.Tensor, name, function)


def pinned_memory_installed() -> bool:
    return torch.Tensor.pin_memory is pin_memory
