"""Graph-pool memory on the simulator (`sim.pool_memory`): a later capture into a pool reuses the
blocks an earlier one freed, and the checks that reuse makes necessary fire — a weak reference
read after another graph wrote its block, after its graph was reset, and a replay whose captured
tensors moved."""

from __future__ import annotations

import pytest
import torch

from ascendgraph.errors import CaptureConstraintError
from sim import SimDevice
from sim.pool_memory import DeadWeakReference, PoolArena, PoolBlockReused, PoolWeakTensor

# Devices here run every replay when it is issued and wait for it (lag="synchronous"): the tests read the pool
# memory right after a replay, which on a card is itself a synchronising read of device memory.
N = 4096  # elements per test tensor: 16 KiB in float32


def capture(device, fn, **options):
    graph = device.new_graph()
    with device.graph(graph, **options):
        out = fn()
    return graph, out


def block_range(tensor: torch.Tensor) -> tuple[int, int]:
    start = tensor.untyped_storage().data_ptr()
    return start, start + tensor.untyped_storage().nbytes()


def overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def test_a_later_capture_reuses_the_blocks_an_earlier_one_freed():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    first, out = capture(device, lambda: x * 2, pool=pool)
    first_output = block_range(out)
    weak = device.weak_ref(out)
    del out  # as vLLM does: only a weak reference to the output is kept
    second, out2 = capture(device, lambda: x * 3, pool=pool)
    assert overlaps(block_range(out2), first_output)
    arena = device.pools.get(pool).arena
    assert arena.reserved_bytes == arena.segments[0].nbytes  # one segment served both graphs
    first.replay()
    assert torch.equal(weak, torch.full((N,), 2.0))
    second.replay()
    assert torch.equal(out2, torch.full((N,), 3.0))


def test_a_block_still_held_is_not_handed_out_again():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    _, out = capture(device, lambda: x * 2, pool=pool)
    _, out2 = capture(device, lambda: x * 3, pool=pool)
    assert not overlaps(block_range(out), block_range(out2))
    assert torch.isnan(out).all()  # held, so never poisoned again by the second capture


def test_reading_a_graph_output_after_another_graph_reused_its_block_is_detected():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    first, out = capture(device, lambda: x * 2, pool=pool)
    weak = device.weak_ref(out)
    assert isinstance(weak, PoolWeakTensor)
    del out
    second, out2 = capture(device, lambda: x * 3, pool=pool)
    first.replay()
    assert weak.sum().item() == 2 * N  # right after its own replay the output is first's
    second.replay()  # writes 3s over the same bytes
    with pytest.raises(PoolBlockReused, match="simulator: .* wrote it .* after graph#1 last did"):
        weak.sum()
    first.replay()  # the owner wrote it again: readable
    assert weak.sum().item() == 2 * N


def test_a_capture_poisoning_a_reused_block_makes_the_old_reference_stale():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    first, out = capture(device, lambda: x * 2, pool=pool)
    first.replay()
    weak = device.weak_ref(out)
    del out
    capture(device, lambda: x * 3, pool=pool)  # handed the block, fills it with NaN
    with pytest.raises(PoolBlockReused):
        weak.clone()


def test_a_graph_of_another_part_of_the_pool_leaves_the_reference_readable():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    first, out = capture(device, lambda: x * 2, pool=pool)
    weak = device.weak_ref(out)
    del out
    held = []
    second, _ = capture(device, lambda: held.append(x * 3) or held[0], pool=pool)  # takes first's block
    third, _ = capture(device, lambda: x * 5, pool=pool)  # second holds it: a fresh block
    first.replay()
    third.replay()
    assert weak.sum().item() == 2 * N


def test_a_weak_reference_into_a_reset_graph_is_dead():
    device = SimDevice(lag="synchronous")
    x = torch.ones(N)
    graph, out = capture(device, lambda: x * 2)
    graph.replay()
    weak = device.weak_ref(out)
    del out
    assert weak.sum().item() == 2 * N
    graph.reset()
    with pytest.raises(DeadWeakReference, match="simulator: .* which was reset"):
        weak.sum()


def test_a_weak_reference_keeps_the_graph_data_after_the_strong_tensor_goes():
    # vLLM Ascend's full_graph_fia keeps only a weak reference to its capture-allocated
    # softmax_lse and writes into it at every update: the block is its graph's until reset.
    device = SimDevice(lag="synchronous")
    x = torch.ones(N)
    graph, out = capture(device, lambda: x * 2)
    weak = device.weak_ref(out)
    del out
    graph.replay()
    weak.mul_(0.5)  # a write through the weak reference lands in the graph's block
    assert weak.sum().item() == N


def test_a_replay_whose_captured_input_moved_is_refused():
    device = SimDevice(lag="synchronous")
    static_input = torch.ones(N)
    graph, _ = capture(device, lambda: static_input * 2)
    graph.replay()
    static_input.resize_(4 * N)  # a new, larger storage: the graph's address is stale
    with pytest.raises(CaptureConstraintError, match="simulator: replay of graph#1: .* no longer at its captured"):
        graph.replay()


def test_a_replay_whose_input_was_refilled_in_place_runs():
    device = SimDevice(lag="synchronous")
    static_input = torch.ones(N)
    graph, out = capture(device, lambda: static_input * 2)
    static_input.copy_(torch.full((N,), 4.0))
    graph.replay()
    assert torch.equal(out, torch.full((N,), 8.0))


def test_the_pool_of_graphs_captured_largest_first_costs_the_largest_graph():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    total = 0
    for size in (768 * N, 384 * N, 192 * N, 96 * N):  # the first graph: two 12 MiB blocks, a segment each
        x = torch.ones(size)
        _, out = capture(device, lambda: (x * 2) + 1, pool=pool)
        device.weak_ref(out)
        total += 2 * 4 * size
        del out
    arena = device.pools.get(pool).arena
    assert arena.reserved_bytes == 2 * 4 * 768 * N  # the first graph's two blocks, split for every later one
    assert arena.reserved_bytes < total / 1.8


def test_an_arena_sweep_frees_only_blocks_whose_tensors_are_gone():
    from sim.pool_memory import GraphMemory

    arena = PoolArena()
    owner = GraphMemory("g")
    kept = arena.allocate(torch.empty(N, device="meta"), owner, 1)
    dropped = arena.allocate(torch.empty(N, device="meta"), owner, 2)
    view = dropped[:10]
    del dropped
    assert arena.sweep() == 0  # a view still holds the block
    del view
    assert arena.sweep() == 4 * N
    assert arena.allocation_of(kept) is not None


def test_a_pool_whose_graphs_are_all_reset_gives_its_memory_back():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    first, out = capture(device, lambda: x * 2, pool=pool)
    del out
    second, out2 = capture(device, lambda: x * 3, pool=pool)
    first.reset()
    assert device.pools.get(pool).arena_bytes > 0  # second still lives
    second.reset()
    assert device.pools.get(pool).arena_bytes > 0  # out2 still holds its block
    del out2
    third = capture(device, lambda: x * 4, pool=pool)[0]  # its output is dropped at once
    third.reset()
    assert device.pools.get(pool).arena_bytes == 0


@torch.library.custom_op("agtest_pool::use_scratch", mutates_args=("workspace",))
def _use_scratch(x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
    workspace.fill_(x.sum().item())  # written before it is read: a kernel's workspace
    return x + workspace[: x.numel()].view_as(x)


@_use_scratch.register_fake
def _use_scratch_fake(x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def test_a_workspace_is_written_before_it_is_read_so_only_whoever_else_held_the_bytes_loses():
    # vLLM Ascend shares one attention workspace per capture size among the graphs of that size
    # (attention_v1.py@182b75ea full_graph_fia: graph_params.workspaces.get(num_tokens)): the kernel
    # writes its workspace before reading it, so whose data was there does not matter to it; the
    # graph whose block it was loses its data, and reading that data afterwards is refused.
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    first, out = capture(device, lambda: x * 2, pool=pool)
    weak = device.weak_ref(out)
    del out
    second, out2 = capture(device, lambda: x * 3, pool=pool)
    weak2 = device.weak_ref(out2)
    del out2
    first.replay()
    second.replay()  # the block now holds second's data
    with pytest.raises(PoolBlockReused):
        torch.ops.agtest_pool.use_scratch(weak, torch.empty(N))  # as the input: a stale read
    assert weak2.sum().item() == 3 * N
    got = torch.ops.agtest_pool.use_scratch(torch.ones(4), weak)  # positional workspace: written first
    assert torch.equal(got, torch.full((4,), 5.0))
    got = torch.ops.agtest_pool.use_scratch(torch.ones(4), workspace=weak)
    assert torch.equal(got, torch.full((4,), 5.0))
    with pytest.raises(PoolBlockReused, match="graph#1 .* wrote it"):
        weak2.sum()  # the workspace write overwrote second's output: reading it now is a stale read
    first.reset()
    with pytest.raises(DeadWeakReference):
        torch.ops.agtest_pool.use_scratch(torch.ones(4), workspace=weak)


def test_a_block_freed_inside_a_capture_is_handed_out_again_in_that_capture():
    device = SimDevice(lag="synchronous")
    x = torch.ones(N)
    addresses = []

    def body():
        a = x * 2
        addresses.append(block_range(a))
        b = a + 1
        del a  # freed inside the capture: its block goes back to the pool at once
        c = b * 3
        addresses.append(block_range(c))
        return c

    graph, out = capture(device, body)
    assert addresses[0] == addresses[1]  # the same bytes: a card's caching allocator does the same
    graph.replay()
    assert torch.equal(out, torch.full((N,), 9.0))  # program order keeps a's last use before c's write
    assert graph.pool_bytes == 3 * 4 * N  # every request still counts (an upper bound of the pool)


def test_a_weak_reference_read_after_its_block_was_handed_to_another_allocation_fails_the_capture():
    device = SimDevice(lag="synchronous")
    x = torch.ones(N)
    kept = {}

    def body():
        a = x * 2
        kept["weak"] = device.weak_ref(a)
        del a  # only the weak reference is left: the block is free
        b = x * 3  # handed a's block (and written: its fresh block is poisoned)
        return kept["weak"] + b  # reads a's bytes, which hold b's data now

    graph = device.new_graph()
    with pytest.raises(PoolBlockReused, match=r"simulator: .* \(op \d+ of the capture of graph#1\) reads a weak "
                                             r"reference .* handed to graph#1's allocation at op 1"):
        with device.graph(graph):
            body()
    assert graph.state == "idle"  # the failed capture left nothing behind


def test_a_workspace_weak_referenced_too_early_is_caught_when_another_layers_tensor_is_read():
    # The workspace of the fused attention, weak-referenced right after the query that allocated it
    # (vLLM Ascend weak-references its workspaces only after the capture: acl_graph.py
    # weak_ref_workspaces): the next layer's allocation is handed its block, the next attention call
    # writes its workspace over that tensor, and the tensor's next read would be garbage on a card.
    device = SimDevice(lag="synchronous")
    x = torch.ones(N)

    def layers():
        workspace = torch.empty(N)  # the workspace query
        scratch = device.weak_ref(workspace)
        del workspace  # too early: the capture still uses it
        h = torch.ops.agtest_pool.use_scratch(x, scratch)  # layer 1: fine, the kernel writes it first
        residual = h * 2  # layer 2's allocation: handed the workspace's block
        h = torch.ops.agtest_pool.use_scratch(h, scratch)  # writes the workspace over `residual`
        return h + residual  # reads `residual`: someone else wrote its bytes since it was written

    graph = device.new_graph()
    with pytest.raises(PoolBlockReused, match=r"reads the .* block graph#1 was handed at op \d+ .* agtest_pool"
                                             r".*write through a weak reference"):
        with device.graph(graph):
            layers()


def test_a_workspace_held_until_the_capture_ends_is_fine_and_its_graph_replays_right():
    device = SimDevice(lag="synchronous")
    x = torch.ones(N)

    def layers():
        workspace = torch.empty(N)
        h = torch.ops.agtest_pool.use_scratch(x, workspace)
        residual = h * 2
        h = torch.ops.agtest_pool.use_scratch(h, workspace)
        return h + residual

    expected = layers()  # eagerly
    graph, out = capture(device, layers)
    graph.replay()
    assert torch.equal(out, expected)


def test_a_graph_output_taken_over_later_in_its_own_capture_is_refused_after_the_replay():
    device = SimDevice(lag="synchronous")
    x = torch.ones(N)
    kept = {}

    def body():
        a = x * 2
        kept["weak"] = device.weak_ref(a)  # as a graph output held weakly too early
        b = a + 1
        del a
        return b * 3  # handed a's block

    graph, _ = capture(device, body)
    graph.replay()
    with pytest.raises(PoolBlockReused, match="took over later in the same capture"):
        kept["weak"].sum()


def first_graph_of_a_size(device, pool, x: torch.Tensor, elements: int):
    """A graph that makes the size's workspace and runs a kernel with it; then, as vLLM Ascend's
    weak_ref_workspaces after the capture, only a weak reference to the workspace is kept."""
    held = {}

    def body():
        held["workspace"] = torch.empty(elements)
        return torch.ops.agtest_pool.use_scratch(x, held["workspace"]) * 1

    graph, out = capture(device, body, pool=pool)
    return graph, out, device.weak_ref(held.pop("workspace"))


def test_the_shared_workspace_of_one_size_stays_legitimate_across_graphs():
    # The second graph of a size passes the first graph's (weakly held) workspace; its own tensors
    # may be handed the workspace's block, and that is fine while none of them lives across a
    # kernel writing the workspace. A workspace over 1 MiB sits in the large pool, the small
    # activations of a decode step in the small one (sim.memory): they never share bytes.
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    first, out1, workspace = first_graph_of_a_size(device, pool, x, 128 * N)  # 2 MiB

    def second_graph():
        h = torch.ops.agtest_pool.use_scratch(x * 3, workspace)
        return h + 1

    second, out2 = capture(device, second_graph, pool=pool)
    first.replay()
    second.replay()
    assert torch.equal(out2, torch.full((N,), 3.0 + 3 * N + 1))
    assert torch.equal(out1, torch.full((N,), 1.0 + N))


def test_a_tensor_living_across_a_write_of_the_shared_workspace_is_refused():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    _, _, workspace = first_graph_of_a_size(device, pool, x, N)

    def second_graph():
        residual = x * 5  # handed the (freed) workspace's block
        h = torch.ops.agtest_pool.use_scratch(x, workspace)  # writes over `residual`
        return h + residual

    graph = device.new_graph()
    with pytest.raises(PoolBlockReused, match="write through a weak reference"):
        with device.graph(graph, pool=pool):
            second_graph()


def test_a_kernel_writing_its_workspace_over_its_own_input_is_refused():
    device = SimDevice(lag="synchronous")
    pool = device.graph_pool_handle()
    x = torch.ones(N)
    _, _, workspace = first_graph_of_a_size(device, pool, x, N)
    graph = device.new_graph()
    with pytest.raises(PoolBlockReused, match="its own write through a weak reference"):
        with device.graph(graph, pool=pool):
            torch.ops.agtest_pool.use_scratch(x * 3, workspace)  # x * 3 was handed the workspace's block
