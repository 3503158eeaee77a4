"""The static-address check of a replay: every tensor a graph was captured with is still where it was.

A graph replays the addresses it captured (torch_npu's NPUGraph, like torch's CUDA graphs,
keeps no tensor, only the kernels' arguments). The simulator's program holds the tensor
objects, so a tensor whose storage was replaced after capture (``resize_`` to a larger size,
``set_``) would be read at its *new* storage here while a card reads the old address: a
replay refuses that (`StaticAddresses.check`). Refilling a tensor in place (``copy_``,
``fill_``) keeps its address and is the fix. Pool blocks are seen through the program's own
aliases (`sim.pool_memory`), which nothing outside the program can move.
"""

from __future__ import annotations

from typing import Any

import torch

from ascendgraph.errors import CaptureConstraintError

__all__ = ["MOVED_ADDRESS", "StaticAddresses", "tensors_in"]

Tensor = torch.Tensor

MOVED_ADDRESS = (
    "simulator: replay of {graph}: a tensor the graph was captured with ({what}) is no longer at its captured address "
    "(0x{captured:x}, now 0x{now:x}; its storage was replaced, e.g. by resize_ or set_). A card replays the captured "
    "address and reads or writes stale memory there, silently. Keep a graph's inputs and outputs at their captured "
    "addresses: copy new values into them (copy_) instead of rebinding or resizing them"
)


_HOST_VALUES = frozenset({int, float, bool, str, type(None), torch.dtype, torch.device})


def tensors_in(values: Any) -> list[Tensor]:
    """The tensors in nested tuples, lists and dicts."""
    found: list[Tensor] = []
    stack = [values]
    while stack:
        value = stack.pop()
        if type(value) in _HOST_VALUES:  # sizes and scalars: most items
            continue
        if isinstance(value, Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
        elif isinstance(value, dict):
            stack.extend(value.values())
    return found


def _addresses(values: Any) -> list[tuple[Tensor, int]]:
    return [(t, t.data_ptr()) for t in tensors_in(values) if type(t) is Tensor and t.device.type != "meta"]


class StaticAddresses:
    """The addresses of a program's tensors, per record, as captured (or as a task update set them)."""

    __slots__ = ("per_record", "pairs")

    def __init__(self, records: dict[int, Any]) -> None:
        self.per_record = {index: _addresses(values) for index, values in records.items()}
        self.pairs = self._unique()

    def _unique(self) -> list[tuple[Tensor, int]]:
        seen: dict[int, tuple[Tensor, int]] = {}
        for pairs in self.per_record.values():
            for pair in pairs:
                seen.setdefault(id(pair[0]), pair)
        return list(seen.values())

    def update(self, index: int, values: Any) -> None:
        """A task update gave record ``index`` new arguments: their addresses now are the captured ones."""
        self.per_record[index] = _addresses(values)
        self.pairs = self._unique()

    def check(self, graph: str) -> None:
        """Refuse a replay when a captured tensor moved (a card would use the captured address)."""
        for tensor, address in self.pairs:
            if tensor.data_ptr() != address:
                what = f"shape {tuple(tensor.shape)}, {str(tensor.dtype).replace('torch.', '')}"
                raise CaptureConstraintError(
                    MOVED_ADDRESS.format(graph=graph, what=what, captured=address, now=tensor.data_ptr())
                )
