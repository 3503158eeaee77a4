"""Graph memory pools of the simulator: the handles users see, each pool's accounting, and the
device's set of pools (``device.pools``).

Theory of operation. A graph is captured into a pool: a shared one (``graph_pool_handle()``, or
``graph.pool()`` of an earlier graph) or a private one made for the capture. A graph's footprint
is the bytes of the fresh storages its capture allocated (every request: an upper bound of the
real pool's footprint). A pool costs the largest footprint of the graphs alive in it (graphs
sharing a pool reuse its blocks, as vLLM captures the largest size first), and the device's
pool bytes are the sum over pools. A private pool lives while one of its graphs does; a shared
one as long as the device. A private pool whose last graph went (reset, freed, or a capture that
was aborted) while blocks of it are still held (a tensor the caller kept; an npu tensor's block
is freed by address through `sim.memory`) is kept aside until the last of them is freed, as the
NPU caching allocator keeps a graph's private pool while a tensor uses it: its held blocks are
no graph's bytes any more, but the allocator's allocated memory until then
(`held_without_graphs`).

The memory behind those bytes is the pool's `sim.pool_memory.PoolArena` (created on the first
real allocation; meta-tensor devices have none): the caching allocator's blocks (`sim.memory`),
handed out again within a capture and to later captures into the pool, so the memory the
process holds tracks the largest graph as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import count
from typing import Optional

import torch

from ascendgraph.errors import ConfigError
from sim.pool_memory import PoolAllocation, PoolArena

__all__ = ["SimPoolHandle", "SimPool", "GraphPools"]


@dataclass(frozen=True)
class SimPoolHandle:
    """Opaque graph memory-pool handle (graph_pool_handle() or graph.pool())."""

    device_uid: int
    pool_id: int


class SimPool:
    __slots__ = ("handle", "shared", "footprints", "_arena", "_largest")

    def __init__(self, handle: SimPoolHandle, shared: bool) -> None:
        self.handle = handle
        self.shared = shared
        # graph token -> footprint; change it through `hold` / `drop` (they keep `bytes` current)
        self.footprints: dict[int, int] = {}
        self._arena: Optional[PoolArena] = None
        self._largest: Optional[int] = 0  # max(footprints), None when it must be recomputed

    def hold(self, token: int, nbytes: int) -> None:
        """A graph's footprint in the pool."""
        self.footprints[token] = nbytes
        if self._largest is not None and nbytes > self._largest:
            self._largest = nbytes

    def drop(self, token: int) -> None:
        """A graph's footprint goes."""
        nbytes = self.footprints.pop(token, None)
        if nbytes is not None and nbytes == self._largest:
            self._largest = None

    @property
    def has_arena(self) -> bool:
        """Whether the pool has host memory yet (its first real allocation made it)."""
        return self._arena is not None

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
            if not self._arena.live:  # raw blocks (freed by address) and tensors still alive keep it
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
        """The pool's cost: its largest footprint (kept up to date, as every capture's
        allocation asks for it)."""
        largest = self._largest
        if largest is None:
            largest = self._largest = max(self.footprints.values(), default=0)
        return largest


class GraphPools:
    """``device.pools``: the device's graph pools by id (module docstring)."""

    def __init__(self, device_uid: int) -> None:
        self.device_uid = device_uid
        self._pools: dict[int, SimPool] = {}
        # private pools without graphs whose raw blocks a caller still holds (module docstring)
        self._orphans: dict[int, SimPool] = {}
        self._ids = count(1)
        self._tokens = count(1)

    def new_shared(self) -> SimPoolHandle:
        """A shared pool (``graph_pool_handle()``)."""
        handle = SimPoolHandle(self.device_uid, next(self._ids))
        self._pools[handle.pool_id] = SimPool(handle, shared=True)
        return handle

    def for_capture(self, handle: Optional[SimPoolHandle]) -> SimPool:
        """The pool a capture allocates from: ``handle``'s, or a private one (None)."""
        if handle is None:
            return SimPool(SimPoolHandle(self.device_uid, next(self._ids)), shared=False)
        if not isinstance(handle, SimPoolHandle) or handle.device_uid != self.device_uid:
            raise ConfigError(
                f"pool {handle!r} does not belong to this device; use device.graph_pool_handle() "
                "or graph.pool() of a graph of this device",
                key="pool",
            )
        pool = self._pools.get(handle.pool_id)
        if pool is None:  # the handle of a private pool whose graphs were all reset
            pool = self._pools[handle.pool_id] = SimPool(handle, shared=True)
        return pool

    def hold(self, pool: SimPool, nbytes: int) -> int:
        """A captured graph's footprint in ``pool`` (a private pool is kept from now on); its token."""
        if not pool.shared:
            self._pools[pool.handle.pool_id] = pool
        token = next(self._tokens)
        pool.hold(token, nbytes)
        return token

    def release(self, pool: SimPool, token: int) -> None:
        """A graph's footprint goes (reset or freed); a private pool without graphs goes too."""
        pool.drop(token)
        pool.trim()
        if not pool.shared and not pool.footprints:
            self._pools.pop(pool.handle.pool_id, None)
            self._keep_while_held(pool)

    def abandon(self, pool: SimPool) -> None:
        """A capture into ``pool`` was aborted: a private pool it made is never kept, but the raw
        blocks it handed out stay the caller's until freed."""
        if not self.is_kept(pool):
            pool.trim()
            self._keep_while_held(pool)

    def _keep_while_held(self, pool: SimPool) -> None:
        if pool.has_arena and pool.arena.live:
            self._orphans[pool.handle.pool_id] = pool

    def get(self, handle: SimPoolHandle) -> Optional[SimPool]:
        return self._pools.get(handle.pool_id)

    def is_kept(self, pool: SimPool) -> bool:
        return self._pools.get(pool.handle.pool_id) is pool

    def all(self) -> list[SimPool]:
        # A copy: a graph's finalizer (garbage collection during a sum) may drop its pool.
        return list(self._pools.values())

    def __len__(self) -> int:
        return len(self._pools)

    @property
    def bytes(self) -> int:
        """What the pools cost: the sum over pools of their largest live footprint."""
        pools = self.all()
        if len(pools) == 1:  # the engine's one shared pool: asked at every capture allocation
            return pools[0].bytes
        return sum(pool.bytes for pool in pools)

    def held_without_graphs(self) -> int:
        """Bytes of blocks still held in private pools whose graphs all went (the caching
        allocator's, not a graph's: `sim.memory` counts them as allocated until freed)."""
        held = 0
        for pool in list(self._orphans.values()):
            pool.trim()  # blocks of tensors (not raw) go back when their tensor dies
            if not pool.has_arena:
                self._orphans.pop(pool.handle.pool_id, None)
                continue
            held += sum(allocation.size for allocation in pool.arena.live.values())
        return held

    @property
    def host_bytes(self) -> int:
        """Host memory behind the pools (shared blocks: about the largest graph)."""
        return sum(pool.arena_bytes for pool in self.all())

    def allocation_of(self, tensor: torch.Tensor, also: Optional[SimPool] = None) -> Optional[PoolAllocation]:
        """The live graph-pool block ``tensor`` lies on (``also``: a capture's pool not kept yet)."""
        pools = self.all() + ([also] if also is not None else [])
        for pool in pools:
            if pool.has_arena:
                allocation = pool.arena.allocation_of(tensor)
                if allocation is not None:
                    return allocation
        return None

    def release_raw(self, address: int, also: Optional[SimPool] = None) -> bool:
        """Free a raw block of a graph pool by address; False when no pool holds it."""
        for pool in self.all() + ([also] if also is not None else []):
            if pool.has_arena and pool.arena.release_raw(address):
                return True
        for pool in list(self._orphans.values()):
            if pool.has_arena and pool.arena.release_raw(address):
                pool.trim()
                if not pool.has_arena:  # its last held block: the pool goes
                    self._orphans.pop(pool.handle.pool_id, None)
                return True
        return False
