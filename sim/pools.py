"""Graph memory pools of the simulator: the handle users see and the pool's accounting.

Pool-memory model: a graph's footprint is the bytes of the fresh storages allocated while
it was captured (no reuse inside a capture). A pool costs the largest footprint of the
graphs alive in it (graphs sharing a pool reuse its blocks, as vLLM captures the largest
size first), and the device's pool bytes are the sum over pools.

The host memory behind those bytes is the pool's `sim.pool_memory.PoolArena` (created on
the first real allocation; meta-tensor devices have none): a block whose tensors are all
gone is handed to the next capture into the pool, so the memory the process holds tracks
the largest graph as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sim.pool_memory import PoolArena

__all__ = ["SimPoolHandle", "SimPool"]


@dataclass(frozen=True)
class SimPoolHandle:
    """Opaque graph memory-pool handle (graph_pool_handle() or graph.pool())."""

    device_uid: int
    pool_id: int


class SimPool:
    __slots__ = ("handle", "shared", "footprints", "_arena")

    def __init__(self, handle: SimPoolHandle, shared: bool) -> None:
        self.handle = handle
        self.shared = shared
        self.footprints: dict[int, int] = {}
        self._arena: Optional[PoolArena] = None

    @property
    def arena(self) -> PoolArena:
        """The pool's host memory (made on first use)."""
        if self._arena is None:
            self._arena = PoolArena()
        return self._arena

    def trim(self) -> None:
        """No graph is alive in the pool: give its host memory back once no tensor holds a block
        (an alias still alive keeps its own segment's memory, never the pool's bookkeeping)."""
        if self._arena is not None and not self.footprints:
            self._arena.sweep()
            if not self._arena.live:
                self._arena = None

    @property
    def arena_if_made(self) -> Optional[PoolArena]:  # None before the first real allocation (sim.memory_ledger)
        return self._arena

    @property
    def arena_bytes(self) -> int:
        """Host memory the pool reserves (0 before its first real allocation)."""
        return self._arena.reserved_bytes if self._arena is not None else 0

    @property
    def bytes(self) -> int:
        return max(self.footprints.values(), default=0)

