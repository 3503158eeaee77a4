"""The facade's npu device end to end (docs/facade.md): tensors on the simulated NPU, the
simulator's memory figures, host reads as synchronisations (refused inside a capture), host
work outside the graph, copies across the host boundary inside a capture, an eager
ExternalEvent wait holding a stream's later work, torch_npu's kernels refusing host tensors,
and the seeding vLLM Ascend's sampler relies on."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ascendgraph.errors import CaptureConstraintError, GraphHang, StreamOrderError


def test_npu_tensors_live_in_the_simulated_npus_memory(torch_npu: Any) -> None:
    npu = torch_npu.npu
    start = npu.memory_allocated()
    x = torch.zeros(1024, device="npu")
    assert x.device == torch.device("npu", 0) and x.is_npu
    assert npu.memory_allocated() - start >= 4096
    assert npu.memory_allocated() == torch_npu.npu.memory_stats()["allocated_bytes.all.current"]
    y = x.cpu().npu()
    assert y.device.type == "npu" and y.data_ptr() != x.data_ptr()
    del x, y
    assert npu.memory_allocated() == start


def test_a_capture_output_kept_past_its_graphs_reset_is_freed_quietly_when_it_dies(torch_npu: Any) -> None:
    # The graph's private pool loses its last graph at the reset; the output the caller kept
    # still holds its block, which goes back (and out of memory_allocated) when the tensor dies.
    npu = torch_npu.npu
    x = torch.ones(1024, device="npu")
    start = npu.memory_allocated()
    graph = npu.NPUGraph()
    with npu.graph(graph):
        kept = x * 2
    graph.reset()
    assert npu.memory_allocated() - start >= 4096
    del kept
    assert npu.memory_allocated() == start


@pytest.mark.parametrize("read", ["item", "tolist", "cpu", "bool", "print"])
def test_a_host_read_of_an_npu_tensor_inside_a_capture_is_refused_with_the_host_sync_text(
    torch_npu: Any, read: str, capsys: pytest.CaptureFixture[str]
) -> None:
    reads = {"item": lambda t: t.sum().item(), "tolist": lambda t: t.tolist(), "cpu": lambda t: t.cpu(),
             "bool": lambda t: bool(t.sum() > 0), "print": lambda t: print(t)}
    npu = torch_npu.npu
    x = torch.ones(4, device="npu")
    with pytest.raises(CaptureConstraintError, match="synchronizes with the host, which is not allowed while a "
                                                     "stream is captured"):
        with npu.graph(npu.NPUGraph()):
            reads[read](x * 2)
    reads[read](x * 2)  # outside a capture it is an ordinary synchronisation


def test_host_work_on_cpu_tensors_runs_during_a_capture_and_stays_out_of_the_graph(torch_npu: Any) -> None:
    npu = torch_npu.npu
    x = torch.ones(4, device="npu")
    graph = npu.NPUGraph()
    with npu.graph(graph):
        lengths = torch.tensor([3, 5]).cumsum(0)  # host bookkeeping, as vLLM Ascend's metadata builder does
        assert lengths.tolist() == [3, 8]  # a host read of host memory: no synchronisation
        y = x * 2
    names = [str(getattr(record, "func", "")) for record in graph.sim_graph.program.records]
    assert names == ["aten.mul.Tensor"]  # the cumsum is not a task of the graph
    graph.replay()
    assert y.tolist() == [2.0] * 4


def test_copies_across_the_host_boundary_inside_a_capture(torch_npu: Any) -> None:
    npu = torch_npu.npu
    pinned = torch.arange(4.0).pin_memory()
    device = torch.zeros(4, device="npu")
    graph = npu.NPUGraph()
    with npu.graph(graph):
        device.copy_(pinned, non_blocking=True)  # captured: the replay reads the pinned buffer then
        out = device + 1
    pinned.fill_(10.0)
    graph.replay()
    assert out.tolist() == [11.0] * 4
    for copy in (lambda: device.copy_(torch.arange(4.0)), lambda: torch.arange(4.0).to("npu"),
                 lambda: torch.empty(4).copy_(device)):
        with pytest.raises(CaptureConstraintError, match="synchronizes with the host"):
            with npu.graph(npu.NPUGraph()):
                copy()


def test_an_eager_external_event_wait_holds_later_work_on_its_stream_until_the_record(torch_npu: Any) -> None:
    npu = torch_npu.npu
    event = npu.ExternalEvent()
    side = npu.Stream()
    x = torch.ones(4, device="npu")
    with npu.stream(side):
        event.wait(side)
        y = x * 3  # queued behind the wait: the device has not run it
        assert not side.query()
    event.record(npu.current_stream())
    side.synchronize()
    assert side.query() and y.tolist() == [3.0] * 4
    never = npu.ExternalEvent()
    with npu.stream(side):
        never.wait(side)
        z = x * 5
        with pytest.raises(GraphHang, match="external event"):
            z.tolist()  # a read on the stream waits for a record nothing will make: a card hangs


def test_torch_npus_kernels_refuse_host_tensors(torch_npu: Any) -> None:
    x, weight = torch.randn(3, 64).bfloat16(), torch.ones(64, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match=r"Could not run 'npu::npu_rms_norm' with arguments from the 'CPU' "
                                                  r"backend"):
        torch_npu.npu_rms_norm(x, weight)
    with pytest.raises(RuntimeError, match=r"Expected all tensors to be on the same device, but got gamma is on cpu, "
                                           r"different from other tensors on npu:0"):
        torch_npu.npu_rms_norm(x.npu(), weight)
    out, _ = torch_npu.npu_rms_norm(x.npu(), weight.npu())
    assert out.device.type == "npu" and out.shape == (3, 64)


def test_torch_npu_seeding_reaches_the_npu_generators(torch_npu: Any) -> None:
    torch_npu.npu.manual_seed(11)
    first = torch.randn(8, device="npu").tolist()
    torch.manual_seed(11)  # torch seeds the accelerator's generators too (torch.npu.manual_seed_all)
    assert torch.randn(8, device="npu").tolist() == first
    generator = torch.Generator(device="npu").manual_seed(5)  # the sampler's own generator
    probs = torch.softmax(torch.randn(2, 16, device="npu"), -1)
    picked = torch.multinomial(probs, 1, generator=generator)
    assert picked.device.type == "npu"
    assert torch.equal(torch.multinomial(probs, 1, generator=torch.Generator(device="npu").manual_seed(5)), picked)
    state = torch_npu.npu.get_rng_state()
    again = torch.rand(3, device="npu").tolist()
    torch_npu.npu.set_rng_state(state)
    assert torch.rand(3, device="npu").tolist() == again


def test_non_blocking_from_pinned_memory_is_queued_and_from_pageable_memory_is_synchronous(torch_npu: Any) -> None:
    # torch's rule: a non_blocking host-to-device copy is asynchronous only from pinned memory;
    # from pageable memory the host waits for the copy (the stream's earlier work first).
    npu = torch_npu.npu
    event = npu.ExternalEvent()
    side = npu.Stream()
    target = torch.zeros(4, device="npu")
    with npu.stream(side):
        event.wait(side)  # the side stream is held until the record
        target.copy_(torch.ones(4).pin_memory(), non_blocking=True)  # queued behind the wait: no waiting
        assert not side.query()
        with pytest.raises(GraphHang, match="external event"):
            target.copy_(torch.full((4,), 2.0), non_blocking=True)  # pageable: the host waits for the stream
    event.record(npu.current_stream())
    side.synchronize()
    assert target.tolist() == [1.0] * 4


HOST_READS = {
    "tolist": lambda t: t.tolist(),
    "item": lambda t: t[0].item(),
    "sum": lambda t: t.sum(),
    "print": lambda t: str(t),
    "numpy": lambda t: t.numpy(),
    "clone": lambda t: t.clone(),
}


@pytest.mark.parametrize("read", HOST_READS.values(), ids=list(HOST_READS))
def test_a_host_read_of_pinned_memory_a_queued_device_to_host_copy_fills_is_a_named_race(
        torch_npu: Any, read: Any) -> None:
    # torch's rule: a non_blocking copy into pinned memory returns before the device copied; on a
    # card the host reads stale bytes until it waits for the stream (or an event after the copy).
    npu = torch_npu.npu
    source = torch.arange(4.0, device="npu")
    destination = torch.zeros(4).pin_memory()
    destination.copy_(source, non_blocking=True)
    assert destination.shape == (4,) and destination[:2].shape == (2,)  # metadata and views are no reads
    with pytest.raises(StreamOrderError, match=r"reads host memory that copy \(device to host.*fills"):
        read(destination)
    npu.current_stream().synchronize()
    assert destination.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_an_event_recorded_after_the_copy_and_synchronized_makes_the_read_safe(torch_npu: Any) -> None:
    npu = torch_npu.npu
    destination = torch.zeros(4).pin_memory()
    destination.copy_(torch.ones(4, device="npu"), non_blocking=True)
    done = npu.Event()
    done.record()
    done.synchronize()
    assert destination.tolist() == [1.0] * 4
    destination.copy_(torch.full((4,), 2.0, device="npu"), non_blocking=True)
    with pytest.raises(StreamOrderError):
        destination.sum()
    npu.synchronize()
    assert float(destination.sum()) == 8.0
    from sim.mode_stack import on_stack
    from sim.npu_device import host_guard

    guard = host_guard.guard()
    assert guard is not None and not on_stack(guard)  # off torch's stack once the host waited


def test_a_host_write_of_pinned_memory_a_queued_host_to_device_copy_reads_is_a_named_race(torch_npu: Any) -> None:
    npu = torch_npu.npu
    source = torch.ones(4).pin_memory()
    target = torch.zeros(4, device="npu")
    target.copy_(source, non_blocking=True)
    assert source.sum().item() == 4.0  # reading the source races with nothing
    with pytest.raises(StreamOrderError, match=r"writes host memory that copy \(host to device.*reads"):
        source.fill_(2.0)
    with pytest.raises(StreamOrderError, match="writes host memory"):
        source[0] = 3.0
    npu.synchronize()
    source.fill_(2.0)  # the copy has run: the buffer is the host's again
    assert target.tolist() == [1.0] * 4


def test_a_replay_takes_no_block_the_host_freed_behind_work_still_queued(torch_npu: Any) -> None:
    # A replay allocates nothing on a card: its kernels write where the capture put them. The host
    # runs ahead of the device and frees a tensor whose reader is still queued (stream order makes
    # that safe); a replay that ran its kernels' results through the caching allocator would be
    # handed that block and overwrite it before the reader runs (vLLM's async scheduling freed
    # logits_indices so, and the FULL replay's npu_swiglu result landed on it).
    npu = torch_npu.npu
    x = torch.full((4096,), 3.0, device="npu")
    graph = npu.NPUGraph()
    with npu.graph(graph):
        doubled = x * 2
    npu.synchronize()
    held = torch.full((4096,), 7.0, device="npu")  # the same size as the replay's result
    graph.replay()
    read = held.clone()  # queued behind the replay, reads held
    del held  # the host frees it; its block is the allocator's again
    npu.synchronize()
    assert torch.equal(read.cpu(), torch.full((4096,), 7.0))
    assert torch.equal(doubled.cpu(), torch.full((4096,), 6.0))


def test_a_fullgraph_compile_while_a_host_copy_is_queued_traces_past_the_host_guard(torch_npu: Any) -> None:
    # vLLM compiles its model (fullgraph) while the runner's non_blocking copies into pinned
    # memory are still queued, so the host guard is on torch's function-mode stack; Dynamo traces
    # through function modes, and the guard's checks are nothing it can trace.
    npu = torch_npu.npu
    destination = torch.zeros(4).pin_memory()
    destination.copy_(torch.ones(4, device="npu"), non_blocking=True)  # queued: the guard is on the stack

    @torch.compile(backend="eager", fullgraph=True)
    def double(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    assert torch.equal(double(torch.arange(3.0)), torch.tensor([0.0, 2.0, 4.0]))
    npu.synchronize()
    assert destination.tolist() == [1.0] * 4


@torch.library.custom_op("ascendgraph_hwtest::triple_into", mutates_args=("out",))
def triple_into(x: torch.Tensor, out: torch.Tensor) -> None:
    out.copy_(x * 3)


@triple_into.register_fake
def _(x: torch.Tensor, out: torch.Tensor) -> None:
    return None


def test_a_compiled_mutating_op_runs_while_the_host_guard_watches_a_queued_copy(torch_npu: Any) -> None:
    # A compiled graph calls a mutating op through auto_functionalized_v2 (vLLM's attention op in
    # its compiled model), a higher-order op that asks every dispatch mode on the stack for an
    # implementation, the host guard's op checker among them while a pinned copy is queued.
    npu = torch_npu.npu
    destination = torch.zeros(4).pin_memory()
    destination.copy_(torch.ones(4, device="npu"), non_blocking=True)  # the guard watches

    @torch.compile(backend="aot_eager", fullgraph=True)
    def step(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        triple_into(x + 1, out)
        return out * 2

    out = torch.zeros(3)
    assert torch.equal(step(torch.arange(3.0), out), torch.tensor([6.0, 12.0, 18.0]))
    npu.synchronize()
    assert destination.tolist() == [1.0] * 4


def test_a_tensor_made_on_the_npu_from_values_while_a_host_copy_is_queued(torch_npu: Any) -> None:
    # vLLM's logits processors make torch.tensor(-inf, device=...) while the runner's copies into
    # pinned memory are queued; a call given no tensor touches no host buffer, and the guard
    # leaves it alone (torch cannot construct it under a dispatch mode on this device).
    npu = torch_npu.npu
    destination = torch.zeros(4).pin_memory()
    destination.copy_(torch.ones(4, device="npu"), non_blocking=True)
    made = torch.tensor(-float("inf"), dtype=torch.float32, device="npu")  # a synchronous copy: waits for the stream
    npu.synchronize()
    assert made.item() == -float("inf") and destination.tolist() == [1.0] * 4


def test_a_replaced_simulated_npu_leaves_no_queued_copy_for_the_host_to_race_with(torch_npu: Any) -> None:
    # facade.configure() replaces the NPU; copies still queued on the old one never run, and the
    # next test's host work on its own buffers must not be checked against them.
    from sim import facade

    source = torch.ones(4).pin_memory()
    torch.zeros(4, device="npu").copy_(source, non_blocking=True)  # queued on the NPU being replaced
    facade.configure()
    source.fill_(2.0)  # the old NPU's copy will never read it
    assert source.tolist() == [2.0] * 4
