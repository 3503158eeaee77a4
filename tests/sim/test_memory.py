"""``device.memory`` (`sim.memory`): the caching allocator a device type allocates through — sizes
rounded like torch_npu's NPU caching allocator, small and large pools, best fit per stream, freed
blocks handed out again, graph pools while a stream captures, torch_npu's OOM text."""

from __future__ import annotations

import contextlib
import ctypes

import pytest
import torch

from ascendgraph.errors import ConfigError
from sim import SimDevice
from sim.memory import LARGE_SEGMENT, SMALL_SEGMENT, BlockPool, round_size, segment_size

MiB = 1 << 20


def small_device(memory_bytes: int) -> SimDevice:
    return SimDevice(profile={"base": "A2", "name": "A2-small", "memory_bytes": memory_bytes})


def test_sizes_round_to_512_bytes_and_segments_follow_the_npu_allocator():
    assert [round_size(n) for n in (1, 512, 513, 4096)] == [512, 512, 1024, 4096]
    assert segment_size(round_size(1)) == SMALL_SEGMENT == 2 * MiB  # small requests share 2 MiB segments
    assert segment_size(MiB + 512) == LARGE_SEGMENT == 20 * MiB  # 1-10 MiB: a 20 MiB segment
    assert segment_size(11 * MiB + 512) == 12 * MiB  # from 10 MiB on: its own size, rounded to 2 MiB


def test_blocks_are_rounded_packed_and_counted():
    memory = SimDevice().memory
    a = memory.allocate(1)
    b = memory.allocate(1000)
    assert b - a == 512  # one small segment, blocks of 512-byte units back to back
    assert memory.allocated_bytes() == 512 + 1024
    assert memory.reserved_bytes() == SMALL_SEGMENT
    ctypes.memset(b, 7, 1000)  # the bytes are writable host memory
    assert ctypes.string_at(b, 4) == b"\x07" * 4


def test_a_freed_block_is_handed_out_again_best_fit():
    memory = SimDevice().memory
    big = memory.allocate(4096)
    separator = memory.allocate(512)
    small = memory.allocate(1024)
    memory.allocate(512)  # keeps `small` from merging with the free rest of the segment
    memory.free(big)
    memory.free(small)
    assert memory.allocate(1000) == small  # the smallest free block that fits, not the first
    assert memory.allocate(4096) == big
    assert separator


def test_small_and_large_requests_come_from_different_pools():
    memory = SimDevice().memory
    large = memory.allocate(2 * MiB)
    assert memory.reserved_bytes() == LARGE_SEGMENT
    memory.free(large)
    small = memory.allocate(4096)  # a 20 MiB large segment is free, but small requests never use it
    assert memory.reserved_bytes() == LARGE_SEGMENT + SMALL_SEGMENT
    assert not large <= small < large + LARGE_SEGMENT


def test_large_blocks_split_only_when_more_than_a_mebibyte_is_left():
    memory = SimDevice().memory
    memory.allocate(5 * MiB)
    memory.allocate(14 * MiB + 512 * 1024)  # the rest of the 20 MiB segment is 512 KiB: not split off
    assert memory.allocated_bytes() == LARGE_SEGMENT
    assert memory.reserved_bytes() == LARGE_SEGMENT


def test_freed_neighbours_merge_and_empty_cache_gives_whole_segments_back():
    memory = SimDevice().memory
    blocks = [memory.allocate(100_000) for _ in range(3)]
    for address in (blocks[0], blocks[2], blocks[1]):
        memory.free(address)
    assert memory.allocated_bytes() == 0
    assert memory.allocate(300_000) == blocks[0]  # the three merged into one run
    memory.free(blocks[0])
    memory.empty_cache()
    assert memory.reserved_bytes() == 0


def test_a_block_freed_on_one_stream_is_not_handed_to_another():
    device = SimDevice()
    memory = device.memory
    side = device.new_stream()
    first = memory.allocate(4096)
    memory.free(first)
    on_side = memory.allocate(4096, stream=side)
    assert on_side != first
    assert memory.allocate(4096) == first


def test_out_of_memory_has_torch_npus_text_after_the_cache_was_released():
    memory = small_device(3 * MiB).memory
    first = memory.allocate(4096)  # a 2 MiB small segment
    memory.free(first)  # cached: released below to make room, then still too little
    with pytest.raises(torch.OutOfMemoryError, match=r"^NPU out of memory\. Tried to allocate 1\.00 MiB"):
        memory.allocate(MiB + 1)  # needs a 20 MiB segment
    assert memory.reserved_bytes() == 0  # the free cached segment was given back before giving up
    assert memory.allocate(MiB) != 0  # a small request still fits


def test_bad_calls_are_refused_with_the_fix():
    device = SimDevice()
    memory = device.memory
    assert memory.allocate(0) == 0
    memory.free(0)  # nothing to free, as c10 for a null pointer
    address = memory.allocate(64)
    memory.free(address)
    with pytest.raises(ConfigError, match="freed twice"):
        memory.free(address)
    with pytest.raises(ConfigError, match="byte count"):
        memory.allocate(-1)
    with pytest.raises(ConfigError, match="meta_tensors"):
        SimDevice(meta_tensors=True).memory.allocate(64)


def test_the_malloc_failpoint_applies_to_device_allocations():
    device = SimDevice(faults="malloc=1*raise(oom)->off")
    with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory"):
        device.memory.allocate(64)
    assert device.memory.allocate(64)


def test_a_capturing_stream_allocates_from_its_graph_pool_and_reuses_freed_blocks_in_the_capture():
    device = SimDevice()
    memory = device.memory
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        first = memory.allocate(4096)
        assert ctypes.string_at(first, 2) == b"\xff\xff"  # poisoned: uninitialised device memory
        assert memory.allocated_bytes() == 4096  # the capture's pool, as it stands
        memory.free(first)
        assert memory.allocate(4096) == first  # handed out again inside the same capture
        off_capture = device.new_stream()
        outside = memory.allocate(4096, stream=off_capture)  # not capturing: the device's own pool
        assert stream is device.current_stream()
    assert memory.block_at(outside) is not None
    assert memory.block_at(first) is None
    assert graph.pool_bytes == 8192  # both requests count for the graph (an upper bound of its pool)


def test_captures_sharing_a_pool_reuse_each_others_freed_blocks():
    device = SimDevice()
    pool = device.graph_pool_handle()
    held, graphs = [], []
    for _ in range(2):
        graphs.append(device.new_graph())  # alive: a pool whose graphs are all gone gives its memory back
        with device.graph(graphs[-1], pool=pool):
            held.append(device.memory.allocate(4096))
        device.memory.free(held[-1])  # freed after the capture: back to the pool, not the device
    assert held[0] == held[1]
    assert device.memory.pool.reserved_bytes == 0


def test_a_block_pool_alone_keeps_its_books():
    pool = BlockPool("test")
    grown = []

    def grow(size: int, small: bool):
        from sim.memory import Segment

        grown.append(size)
        return Segment(size, small)

    blocks = [pool.take(700, 0, grow) for _ in range(3)]
    assert grown == [SMALL_SEGMENT] and pool.allocated_bytes == 3 * 1024
    for block in blocks:
        pool.give_back(block)
    assert pool.allocated_bytes == 0 and pool.release_cached() == SMALL_SEGMENT


def _reset(device: SimDevice, graph) -> None:
    graph.reset()


def _aborted(device: SimDevice, graph) -> None:
    pass  # the capture below raised: its pool was never kept


@pytest.mark.parametrize("how", [_reset, _aborted], ids=["graph reset", "capture aborted"])
def test_a_graph_pool_block_freed_after_its_pool_went_is_released_and_accounted_quietly(how):
    # A caller keeps a tensor a capture allocated (an output) beyond its private pool's last
    # graph: the NPU caching allocator keeps that block until it is freed, then lets it go.
    device = SimDevice()
    memory = device.memory
    graph = device.new_graph()
    with contextlib.suppress(RuntimeError):
        with device.graph(graph):
            kept = memory.allocate(4096)
            if how is _aborted:
                raise RuntimeError("the capture fails")
    how(device, graph)
    assert memory.allocated_bytes() == 4096  # still held by the caller
    memory.free(kept)
    assert memory.allocated_bytes() == 0 and memory.reserved_bytes() == 0
    with pytest.raises(ConfigError, match="freed twice"):
        memory.free(kept)
