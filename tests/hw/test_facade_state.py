"""The facade keeps torch_npu's state where graph code depends on it (docs/facade.md,
"Deviations from torch_npu"): weak references that do not own their storage, reserved vs
allocated memory as a caching allocator reports them, RNG captured as torch_npu 2.13 does,
super kernel only on Atlas A3, and declared strictness that says "simulator"."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch


def test_a_weak_reference_does_not_keep_its_storage_alive(torch_npu: Any) -> None:
    x = torch.arange(8.0)
    weak = torch_npu._C._weak_ref_tensor(x)
    assert weak.data_ptr() == x.data_ptr() and weak.shape == x.shape and weak.dtype == x.dtype
    x.add_(1)
    torch.testing.assert_close(weak + 0, torch.arange(1.0, 9.0))  # reads see the owner's writes
    weak.mul_(2)
    torch.testing.assert_close(x, torch.arange(1.0, 9.0) * 2)  # and writes reach the owner
    del x
    gc.collect()
    assert not weak.alive  # the weak reference alone did not keep the storage


def test_a_read_through_a_dead_weak_reference_is_detected(torch_npu: Any) -> None:
    from sim.facade.weak_refs import DeadWeakReference

    weak = torch_npu._C._weak_ref_tensor(torch.ones(4, dtype=torch.bfloat16))
    gc.collect()
    with pytest.raises(DeadWeakReference, match="simulator: .*use-after-free"):
        weak + 1
    with pytest.raises(DeadWeakReference):
        torch.empty(4, dtype=torch.bfloat16).copy_(weak)


def test_a_weak_reference_lives_as_long_as_any_owner_of_the_storage(torch_npu: Any) -> None:
    x = torch.arange(8.0)
    view = x[2:]
    weak = torch_npu._C._weak_ref_tensor(x)
    del x
    gc.collect()
    assert weak.alive  # the view still owns the storage, as on a card
    torch.testing.assert_close(weak[2:] + 0, view)


def test_a_weak_reference_to_a_capture_allocation_lives_as_long_as_the_graph(torch_npu: Any) -> None:
    # torch_npu's private graph pool keeps the blocks a capture allocated until the graph is reset
    # (a block Python frees goes back to the pool, not to the device): vLLM Ascend's attention
    # weak-references its capture-allocated `softmax_lse` and re-issues `.out` into it at every
    # update (attention_v1.py@182b75ea full_graph_fia). Outside the graph's lifetime it is dead.
    npu = torch_npu.npu
    x = torch.ones(16)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        scratch = torch.empty(1)  # allocated inside the capture: a block of the graph's pool
        weak = torch_npu._C._weak_ref_tensor(scratch)
        y = x * 2
    del scratch
    gc.collect()
    assert weak.alive  # the graph's pool holds the block
    weak.fill_(3.0)
    graph.reset()
    gc.collect()
    assert not weak.alive  # reset gave the pool's blocks back
    del y


def test_memory_reserved_keeps_what_the_allocator_held_until_empty_cache(torch_npu: Any) -> None:
    npu = torch_npu.npu
    x = torch.ones(1024)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        y = x * 2 + 1
    allocated = npu.memory_allocated()
    assert allocated > 0 and npu.memory_reserved() >= allocated
    graph.reset()
    del y
    assert npu.memory_allocated() < allocated
    assert npu.memory_reserved() >= allocated  # freed blocks stay cached (reserved) ...
    npu.empty_cache()
    assert npu.memory_reserved() == npu.memory_allocated()  # ... until empty_cache


def test_rng_inside_a_capture_is_captured_as_torch_npu_2_13_does(torch_npu: Any) -> None:
    npu = torch_npu.npu
    graph = npu.NPUGraph()
    with npu.graph(graph):
        noise = torch.rand(4)
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
                torch.empty(16)
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
    x, weight = torch.randn(3, 64).bfloat16(), torch.ones(64, dtype=torch.bfloat16)
    graph = npu.new_graph()
    with npu.graph(graph):
        out = ops.rms_norm(x, weight, 1e-6)
    graph.replay()
    npu.synchronize()
    assert out.shape == (3, 64) and bool(torch.isfinite(out.float()).all())
