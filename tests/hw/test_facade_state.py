"""The facade keeps torch_npu's state where graph code depends on it (docs/facade.md,
"Deviations from torch_npu"): weak references that do not own their storage, reserved vs
allocated memory as a caching allocator reports them, RNG captured as torch_npu 2.13 does,
super kernel only on Atlas A3, and declared strictness that says "simulator".

A tensor's block goes back to the allocator when its last reference goes (``del``), as torch
frees it on a card: no test here collects garbage first, so a reference cycle in the facade
that kept a freed tensor's storage alive would fail them."""

from __future__ import annotations

from typing import Any

import pytest
import torch


def readable(weak: torch.Tensor) -> bool:
    """Whether an op on a weak reference runs (the facade refuses one on memory that is gone)."""
    from sim.pool_memory import DeadWeakReference

    try:
        weak.sum()
    except DeadWeakReference:
        return False
    return True


def test_a_weak_reference_is_a_plain_npu_tensor_that_does_not_keep_its_storage_alive(torch_npu: Any) -> None:
    x = torch.arange(8.0, device="npu")
    weak = torch_npu._C._weak_ref_tensor(x)
    assert type(weak) is torch.Tensor and weak.device == x.device  # torch_npu's is a plain tensor too
    assert weak.data_ptr() == x.data_ptr() and weak.shape == x.shape and weak.dtype == x.dtype
    x.add_(1)
    assert weak.tolist() == torch.arange(1.0, 9.0).tolist()  # reads see the owner's writes
    weak.mul_(2)
    torch.testing.assert_close(x.cpu(), torch.arange(1.0, 9.0) * 2)  # and writes reach the owner
    del x
    assert not readable(weak)  # the weak reference alone did not keep the storage


def test_a_read_through_a_dead_weak_reference_is_detected(torch_npu: Any) -> None:
    from sim.pool_memory import DeadWeakReference

    weak = torch_npu._C._weak_ref_tensor(torch.ones(4, dtype=torch.bfloat16, device="npu"))
    with pytest.raises(DeadWeakReference, match="simulator: .*use-after-free"):
        weak + 1
    with pytest.raises(DeadWeakReference):
        torch.empty(4, dtype=torch.bfloat16, device="npu").copy_(weak)
    with pytest.raises(DeadWeakReference):
        weak.tolist()


def test_a_weak_reference_to_memory_handed_out_again_is_detected(torch_npu: Any) -> None:
    # The caching allocator gives a freed block to the next request of its size on the stream:
    # a card reads the new owner's data through the old weak reference.
    from sim.pool_memory import DeadWeakReference

    x = torch.ones(64, device="npu")
    weak = torch_npu._C._weak_ref_tensor(x)
    address = x.data_ptr()
    del x
    y = torch.full((64,), 7.0, device="npu")
    assert y.data_ptr() == address  # the same block, handed out again
    with pytest.raises(DeadWeakReference, match="freed and handed to another tensor"):
        weak.tolist()


def test_a_weak_reference_lives_as_long_as_any_owner_of_the_storage(torch_npu: Any) -> None:
    x = torch.arange(8.0, device="npu")
    view = x[2:]
    weak = torch_npu._C._weak_ref_tensor(x)
    del x
    assert readable(weak)  # the view still owns the storage, as on a card
    torch.testing.assert_close((weak[2:] + 0).cpu(), view.cpu())


def test_a_weak_reference_to_a_capture_allocation_lives_as_long_as_the_graph(torch_npu: Any) -> None:
    # torch_npu's private graph pool keeps the blocks a capture allocated until the graph is reset
    # (a block Python frees goes back to the pool, not to the device): vLLM Ascend's attention
    # weak-references its capture-allocated `softmax_lse` and re-issues `.out` into it at every
    # update (attention_v1.py@182b75ea full_graph_fia). Outside the graph's lifetime it is dead.
    npu = torch_npu.npu
    x = torch.ones(16, device="npu")
    graph = npu.NPUGraph()
    with npu.graph(graph):
        scratch = torch.empty(1, device="npu")  # allocated inside the capture: a block of the graph's pool
        weak = torch_npu._C._weak_ref_tensor(scratch)
        y = x * 2
    del scratch
    assert readable(weak)  # the graph's pool holds the block
    weak.fill_(3.0)
    assert weak.tolist() == [3.0]
    graph.reset()
    assert not readable(weak)  # reset gave the pool's blocks back
    del y


def test_memory_reserved_keeps_what_the_allocator_held_until_empty_cache(torch_npu: Any) -> None:
    npu = torch_npu.npu
    start = npu.memory_allocated()
    x = torch.ones(1 << 18, device="npu")  # 1 MiB of the device's own pool
    allocated = npu.memory_allocated()
    assert allocated - start >= 1 << 20 and npu.memory_reserved() >= allocated
    del x
    assert npu.memory_allocated() == start
    assert npu.memory_reserved() >= allocated  # the freed block stays cached (reserved) ...
    npu.empty_cache()
    assert npu.memory_reserved() == npu.memory_allocated()  # ... until empty_cache
    free, total = npu.mem_get_info()
    assert free == total - npu.memory_reserved()


def test_rng_inside_a_capture_is_captured_as_torch_npu_2_13_does(torch_npu: Any) -> None:
    npu = torch_npu.npu
    graph = npu.NPUGraph()
    with npu.graph(graph):
        noise = torch.rand(4, device="npu")
    graph.replay()
    npu.synchronize()
    assert noise.shape == (4,) and bool(((noise >= 0) & (noise < 1)).all())


def test_an_allocation_inside_a_task_group_is_a_declared_strictness(torch_npu: Any) -> None:
    npu = torch_npu.npu
    graph = npu.NPUGraph()
    with pytest.raises(RuntimeError) as info:
        with npu.graph(graph):
            stream = npu.current_stream()
            npu.graph_task_group_begin(stream)
            try:
                torch.empty(16, device="npu")
            finally:
                npu.graph_task_group_end(stream)
    assert "simulator strictness" in str(info.value) and "dangling address" in str(info.value)


def test_an_external_event_recorded_twice_is_a_declared_strictness(torch_npu: Any) -> None:
    npu = torch_npu.npu
    event = npu.ExternalEvent()
    stream = npu.Stream()
    event.record(stream)
    with pytest.raises(RuntimeError, match="simulator strictness: .*stale parameters"):
        event.record(stream)


def test_the_device_name_follows_the_profile_and_super_kernel_is_a3_only(torch_npu: Any) -> None:
    from sim import facade

    assert torch_npu.npu.get_device_name() == "Ascend910B3"
    with pytest.raises(RuntimeError, match="Atlas A3 products only"):
        torch_npu.npu.super_kernel_scope_begin("full_model")
    facade.configure(profile="A3")
    assert torch_npu.npu.get_device_name().startswith("Ascend910_93")
    torch_npu.npu.super_kernel_scope_begin("full_model")
    torch_npu.npu.super_kernel_scope_end("full_model")


def test_a_kernel_first_launched_inside_a_capture_is_accepted(torch_npu: Any) -> None:
    # A card sets up the kernel's tiling and workspace from the capture's pool; the plain
    # simulator's lazy-initialisation refusal is not torch_npu's.
    from hw.device import NpuDevice
    from ascendgraph import ops

    npu = NpuDevice()
    x, weight = torch.randn(3, 64).bfloat16().npu(), torch.ones(64, dtype=torch.bfloat16, device="npu")
    graph = npu.new_graph()
    with npu.graph(graph):
        out = ops.rms_norm(x, weight, 1e-6)
    graph.replay()
    npu.synchronize()
    assert out.shape == (3, 64) and bool(torch.isfinite(out.float()).all())


def test_a_weak_reference_read_after_the_capture_handed_its_block_to_another_tensor_fails_the_capture(
    torch_npu: Any,
) -> None:
    # The pool hands a block freed inside a capture to the next allocation of that capture; a weak
    # reference to the freed tensor then reads the new tensor's bytes (a card does so silently).
    from sim.pool_memory import PoolBlockReused

    npu = torch_npu.npu
    x = torch.ones(256, device="npu")
    with pytest.raises(PoolBlockReused, match="weak reference"):
        with npu.graph(npu.NPUGraph()):
            first = x * 2
            weak = torch_npu._C._weak_ref_tensor(first)
            address = first.data_ptr()
            del first
            second = x * 3  # handed the freed block
            assert second.data_ptr() == address
            weak + 1  # reads the second tensor's bytes through the first one's weak reference


def test_a_tensor_of_a_replaced_npu_does_not_meet_the_hang_its_npu_was_left_with(torch_npu: Any) -> None:
    # a process global (vLLM Ascend's mask builder, its graph params) keeps npu tensors across
    # tests; the test before left a replay behind an event nothing records (it saw GraphHang)
    from sim import facade

    kept = torch.ones(4, device="npu")
    old = facade.runtime()
    event = old.device.new_external_event()
    event.wait(old.device.current_stream())
    facade.configure()
    assert old.device.queues.pending() == 0
    torch.testing.assert_close((kept + 1).cpu(), torch.full((4,), 2.0))
