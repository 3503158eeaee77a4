"""The memory ledger over a graph pool that also holds raw blocks (the npu device's memory)."""

from __future__ import annotations

import torch

from sim import SimDevice
from sim.memory_ledger import _live_blocks
from sim.pool_memory import GraphMemory


def test_live_blocks_are_the_tensor_blocks_and_a_raw_block_is_skipped() -> None:
    # A raw block (PoolArena.take(raw=True): what allocate_raw hands the npu device while it
    # captures) has no user tensor to weigh; the ledger walked the arena's address keys and
    # then called the raw block's missing user_storage.
    device = SimDevice()
    pool = device._pools[device.graph_pool_handle().pool_id]
    owner = GraphMemory("graph#1")
    held = pool.arena.allocate(torch.empty(64, device="meta"), owner, stamp=1)
    pool.arena.take(256, owner, stamp=2, stream_id=0, raw=True)
    blocks = _live_blocks(device)
    assert [allocation.user_storage() for _, allocation in blocks] == [held.untyped_storage()]
