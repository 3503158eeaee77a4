"""Graph memory pools of the simulator: the handle users see and the pool's accounting.

Pool-memory model: a graph's footprint is the bytes of the fresh storages allocated while
it was captured (no reuse inside a capture). A pool costs the largest footprint of the
graphs alive in it (graphs sharing a pool reuse its blocks, as vLLM captures the largest
size first), and the device's pool bytes are the sum over pools.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SimPoolHandle", "SimPool"]


@dataclass(frozen=True)
class SimPoolHandle:
    """Opaque graph memory-pool handle (graph_pool_handle() or graph.pool())."""

    device_uid: int
    pool_id: int


class SimPool:
    __slots__ = ("handle", "shared", "footprints")

    def __init__(self, handle: SimPoolHandle, shared: bool) -> None:
        self.handle = handle
        self.shared = shared
        self.footprints: dict[int, int] = {}

    @property
    def bytes(self) -> int:
        return max(self.footprints.values(), default=0)

