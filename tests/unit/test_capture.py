"""GraphWrapper (docs/semantics.md §6) and capture-error rewriting (§8) on the simulator."""

from __future__ import annotations

import gc
import logging

import pytest
import torch

from ascendgraph.compile.graph_wrapper import CaptureNotAllowed, CaptureState, GraphOptions, GraphWrapper
from ascendgraph.device import get_device
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import ADDRESS_MISMATCH, GraphHang, StreamResourceExhausted
from ascendgraph.forward_context import ForwardContext, set_forward_context
from ascendgraph.modes import GraphMode

KEY = BatchDescriptor(4)


def _context(mode: GraphMode, key: BatchDescriptor = KEY) -> ForwardContext:
    return ForwardContext(runtime_mode=mode, batch_descriptor=key, attn_metadata=None, kv_caches={})


def _double_plus(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor]:
    return (x * 2 + y,)


@pytest.fixture
def state(sim_device) -> CaptureState:
    return CaptureState(sim_device, allowed=True)


@pytest.fixture
def inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.arange(4.0), torch.ones(4)


@pytest.mark.parametrize("runtime_mode", [None, GraphMode.NONE, GraphMode.PIECEWISE])
def test_a_full_wrapper_calls_the_runnable_directly_outside_its_mode(state, inputs, runtime_mode):
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, state)
    if runtime_mode is None:
        (out,) = wrapper(*inputs)
    else:
        with set_forward_context(_context(runtime_mode)):
            (out,) = wrapper(*inputs)
    assert torch.equal(out, torch.tensor([1.0, 3.0, 5.0, 7.0]))
    assert wrapper.entries == {} and state.graphs_captured == 0


@pytest.mark.parametrize("mode", [GraphMode.PIECEWISE, GraphMode.FULL])
def test_first_sight_captures_and_later_calls_replay_on_the_captured_tensors(state, inputs, mode, sim_device):
    x, y = inputs
    wrapper = GraphWrapper(_double_plus, mode, state)
    with set_forward_context(_context(mode)):
        wrapper(x, y)  # capture: outputs are garbage until the first replay
        assert state.graphs_captured == 1 and sim_device.stats().graphs_alive == 1
        x.copy_(torch.tensor([10.0, 20.0, 30.0, 40.0]))
        (out,) = wrapper(x, y)
    sim_device.synchronize()
    assert torch.equal(out, torch.tensor([21.0, 41.0, 61.0, 81.0]))
    assert wrapper.entries[KEY].replays == 1
    assert state.graphs_captured == 1


def test_each_descriptor_gets_its_own_graph(state, inputs):
    wrapper = GraphWrapper(_double_plus, GraphMode.PIECEWISE, state)
    for key in (BatchDescriptor(4), BatchDescriptor(8)):
        with set_forward_context(_context(GraphMode.PIECEWISE, key)):
            wrapper(*inputs)
    assert set(wrapper.entries) == {BatchDescriptor(4), BatchDescriptor(8)}
    assert state.graphs_captured == 2


def test_a_new_descriptor_outside_the_capture_phase_is_refused(sim_device, inputs):
    state = CaptureState(sim_device)  # capture not allowed
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, state)
    with set_forward_context(_context(GraphMode.FULL)), pytest.raises(CaptureNotAllowed, match="never captured"):
        wrapper(*inputs)
    with state.capturing(), set_forward_context(_context(GraphMode.FULL)):
        wrapper(*inputs)
    assert not state.allowed


def test_debug_mode_checks_input_addresses_with_the_vllm_ascend_message(state, inputs):
    x, y = inputs
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, state, options=GraphOptions(debug=True))
    with set_forward_context(_context(GraphMode.FULL)):
        wrapper(x, y)
        moved = x.clone()
        expected = ADDRESS_MISMATCH.format(expected=[x.data_ptr(), y.data_ptr()], got=[moved.data_ptr(), y.data_ptr()])
        with pytest.raises(AssertionError) as excinfo:
            wrapper(moved, y)
    assert str(excinfo.value) == expected
    assert str(excinfo.value).startswith("Input addresses for aclgraphs are different during replay. Expected ")


def test_gc_and_empty_cache_are_stubbed_only_where_asked(state, inputs, sim_device):
    seen = {}

    def probe(name):
        def runnable(x, y):
            seen[name] = (gc.collect, sim_device.empty_cache)
            return (x + y,)

        return runnable

    real_collect = gc.collect
    for name, disable in (("first piece", False), ("later piece", True)):
        wrapper = GraphWrapper(probe(name), GraphMode.PIECEWISE, state, options=GraphOptions(gc_disable=disable))
        with set_forward_context(_context(GraphMode.PIECEWISE)):
            wrapper(*inputs)
    assert seen["first piece"][0] is real_collect
    assert seen["later piece"][0] is not real_collect and seen["later piece"][0]() == 0
    assert gc.collect is real_collect
    assert "empty_cache" not in vars(sim_device)
    # empty_cache: the device's own method where not asked, a stub (not bound to the device) where asked
    real_empty, stub_empty = seen["first piece"][1], seen["later piece"][1]
    assert getattr(real_empty, "__self__", None) is sim_device and real_empty.__func__ is type(sim_device).empty_cache
    assert getattr(stub_empty, "__self__", None) is not sim_device and stub_empty() is None
    assert sim_device.empty_cache.__func__ is type(sim_device).empty_cache  # restored


def test_the_stored_output_is_a_weak_reference_and_capture_returns_the_strong_one(state, inputs):
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, state)
    with set_forward_context(_context(GraphMode.FULL)):
        (captured,) = wrapper(*inputs)
    (stored,) = wrapper.entries[KEY].output
    assert stored is not captured and stored.data_ptr() == captured.data_ptr()


def test_stream_exhaustion_during_capture_is_rewritten_and_leaves_nothing_behind(inputs):
    device = get_device("sim", stream_limit=1)
    state = CaptureState(device, allowed=True, stream_budget=1)
    wrapper = GraphWrapper(_double_plus, GraphMode.PIECEWISE, state)
    with set_forward_context(_context(GraphMode.PIECEWISE, BatchDescriptor(4))):
        wrapper(*inputs)
    before = device.stats()
    with set_forward_context(_context(GraphMode.PIECEWISE, BatchDescriptor(8))):
        with pytest.raises(StreamResourceExhausted) as excinfo:
            wrapper(*inputs)
    error = excinfo.value
    assert str(error).startswith("ACL graph capture failed with a known stream-resource exhaustion signature.")
    assert "207008" in str(error.__cause__)
    assert (error.graphs_captured, error.streams_in_use, error.stream_budget) == (1, 1, 1)
    after = device.stats()
    assert (after.graphs_alive, after.streams_in_use, after.pool_bytes) == (
        before.graphs_alive, before.streams_in_use, before.pool_bytes
    )
    assert list(wrapper.entries) == [BatchDescriptor(4)]


def test_an_unknown_capture_failure_is_re_raised_unchanged(state, inputs):
    def broken(x, y):
        raise RuntimeError("something else entirely")

    wrapper = GraphWrapper(broken, GraphMode.FULL, state)
    with set_forward_context(_context(GraphMode.FULL)), pytest.raises(RuntimeError) as excinfo:
        wrapper(*inputs)
    assert type(excinfo.value) is RuntimeError and str(excinfo.value) == "something else entirely"
    assert wrapper.entries == {}


@pytest.mark.parametrize("mode, hangs", [(GraphMode.FULL, True), (GraphMode.PIECEWISE, False)])
def test_only_full_wrappers_synchronize_before_replay(mode, hangs, inputs):
    device = get_device("sim", faults="replay=1*hang->off")
    state = CaptureState(device, allowed=True)
    wrapper = GraphWrapper(_double_plus, mode, state)
    with set_forward_context(_context(mode)):
        wrapper(*inputs)
        wrapper(*inputs)  # this replay hangs (injected)
        if hangs:
            with pytest.raises(GraphHang):
                wrapper(*inputs)
        else:
            wrapper(*inputs)  # queued behind the hung replay: no host synchronisation


def test_release_resets_every_graph(state, inputs, sim_device):
    wrappers = [GraphWrapper(_double_plus, GraphMode.PIECEWISE, state) for _ in range(3)]
    with set_forward_context(_context(GraphMode.PIECEWISE)):
        for wrapper in wrappers:
            wrapper(*inputs)
    assert sim_device.stats().graphs_alive == 3
    assert state.release() == 3
    assert sim_device.stats().graphs_alive == 0 and sim_device.stats().streams_in_use == 0
    assert all(w.entries == {} for w in wrappers)


def test_after_capture_hooks_see_each_new_graph_and_a_failing_hook_undoes_the_capture(state, inputs, sim_device):
    seen = []
    state.after_capture.append(lambda wrapper, entry: seen.append((wrapper.runtime_mode, entry.descriptor)))
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, state)
    with set_forward_context(_context(GraphMode.FULL)):
        wrapper(*inputs)
    assert seen == [(GraphMode.FULL, KEY)]

    def refuse(wrapper, entry):
        raise RuntimeError("post-capture step failed")

    state.after_capture.append(refuse)
    with set_forward_context(_context(GraphMode.FULL, BatchDescriptor(8))), pytest.raises(RuntimeError, match="post-capture"):
        wrapper(*inputs)
    assert list(wrapper.entries) == [KEY] and sim_device.stats().graphs_alive == 1


def test_a_wrapper_can_be_given_a_bare_device(sim_device, inputs):
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, sim_device)
    with set_forward_context(_context(GraphMode.FULL)):
        wrapper(*inputs)
        (out,) = wrapper(*inputs)
    sim_device.synchronize()
    assert torch.equal(out, torch.tensor([1.0, 3.0, 5.0, 7.0]))
    assert wrapper.state.device is sim_device and wrapper.state.graphs_captured == 1


# --------------------------------------------------------------------------- mutation survivors
# Written against survivors of the mutmut run over this module (docs/testing.md, "Mutation
# testing"); each asserts what the code is for, the comment names the mutant.


def _double(x: torch.Tensor) -> tuple[torch.Tensor]:
    return (x * 2,)


def test_release_gives_the_pool_back_and_the_next_capture_takes_a_fresh_one(sim_device):
    # CaptureState.release: `self.pool = None` -> `self.pool = ""` kept a non-pool as the pool
    state = CaptureState(sim_device, allowed=True)
    wrapper = GraphWrapper(_double, GraphMode.PIECEWISE, state)
    x = torch.ones(4)
    with set_forward_context(_context(GraphMode.PIECEWISE)):
        wrapper(x)
    first_pool = state.pool
    assert first_pool is not None
    state.release()
    assert state.pool is None
    with set_forward_context(_context(GraphMode.PIECEWISE)):
        wrapper(x)  # captured again, into a pool of its own
        (out,) = wrapper(x)  # replayed
    sim_device.synchronize()
    assert type(state.pool) is type(first_pool) and state.pool != first_pool
    assert torch.equal(out, torch.full((4,), 2.0))


def test_release_counts_every_graph_of_a_wrapper(sim_device):
    # GraphWrapper.release: `count += 1` -> `count = 1` reported one graph for a wrapper holding three
    state = CaptureState(sim_device, allowed=True)
    wrapper = GraphWrapper(_double, GraphMode.FULL, state)
    for size in (1, 2, 4):
        with set_forward_context(_context(GraphMode.FULL, BatchDescriptor(size))):
            wrapper(torch.ones(size))
    assert sim_device.stats().graphs_alive == 3
    assert wrapper.release() == 3
    assert wrapper.entries == {} and sim_device.stats().graphs_alive == 0


@pytest.mark.parametrize("label, expected", [("layer0.attn", "layer0.attn"), ("", "_double")])
def test_a_wrapper_names_its_label_or_else_its_runnable_with_mode_and_graph_count(sim_device, label, expected):
    # GraphWrapper.__repr__ (logs and errors name wrappers by it): `label or runnable` -> `and`
    wrapper = GraphWrapper(_double, GraphMode.FULL, sim_device, options=GraphOptions(label=label))
    with set_forward_context(_context(GraphMode.FULL, BatchDescriptor(2))):
        wrapper(torch.ones(2))
    text = repr(wrapper)
    assert text.startswith("GraphWrapper(") and text.endswith(", FULL, 1 graphs)")
    assert expected in text


@pytest.mark.parametrize("engine_budget, reported", [(None, 1), (7, 7)])
def test_a_capture_error_reports_the_engines_stream_budget_or_else_the_devices_limit(inputs, engine_budget, reported):
    # GraphWrapper._capture_context: the engine's planned budget when it has one, the device's
    # stream limit otherwise (mutants inverted or short-circuited the choice)
    device = get_device("sim", stream_limit=1)
    state = CaptureState(device, allowed=True, stream_budget=engine_budget)
    wrapper = GraphWrapper(_double_plus, GraphMode.PIECEWISE, state)
    with set_forward_context(_context(GraphMode.PIECEWISE, BatchDescriptor(4))):
        wrapper(*inputs)
    with set_forward_context(_context(GraphMode.PIECEWISE, BatchDescriptor(8))):
        with pytest.raises(StreamResourceExhausted) as excinfo:
            wrapper(*inputs)
    assert (excinfo.value.graphs_captured, excinfo.value.streams_in_use, excinfo.value.stream_budget) == (1, 1, reported)


@pytest.mark.parametrize("mode, kind", [(GraphMode.PIECEWISE, "piecewise"), (GraphMode.FULL, "full")])
def test_the_device_is_told_which_kind_of_graph_it_captures(sim_device, inputs, mode, kind):
    # CaptureState.graph_context: graph_kind goes to devices that charge streams by kind (the
    # simulator's StreamPlan); mutants of the signature check dropped it (every graph "full")
    state = CaptureState(sim_device, allowed=True)
    wrapper = GraphWrapper(_double_plus, mode, state)
    with set_forward_context(_context(mode)):
        wrapper(*inputs)
    assert wrapper.entries[KEY].graph.kind == kind


def test_a_list_output_is_handed_back_and_stored_as_weak_references_to_the_same_storage(sim_device):
    # weak_ref_tensors' list branch and GraphOptions(weak_ref_output=True) (the last piece)
    state = CaptureState(sim_device, allowed=True)
    x = torch.arange(4.0)
    wrapper = GraphWrapper(lambda t: [t * 2, t + 1], GraphMode.PIECEWISE, state,
                           options=GraphOptions(weak_ref_output=True))
    with set_forward_context(_context(GraphMode.PIECEWISE)):
        captured = wrapper(x)
        assert isinstance(captured, list) and len(captured) == 2
        stored = wrapper.entries[KEY].output
        assert isinstance(stored, list)
        assert [t.data_ptr() for t in stored] == [t.data_ptr() for t in captured]
        x.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        replayed = wrapper(x)
    sim_device.synchronize()
    assert torch.equal(replayed[0], torch.tensor([2.0, 4.0, 6.0, 8.0]))
    assert torch.equal(replayed[1], torch.tensor([2.0, 3.0, 4.0, 5.0]))


@pytest.mark.parametrize("label, named", [("model.layers.0", "model.layers.0"), ("", "wrapper")])
def test_refusing_a_capture_outside_the_capture_phase_says_it_is_a_bug_and_names_the_wrapper(sim_device, inputs,
                                                                                            label, named):
    # GraphWrapper._capture's CaptureNotAllowed text (mutants garbled it)
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, CaptureState(sim_device), options=GraphOptions(label=label))
    with set_forward_context(_context(GraphMode.FULL)), pytest.raises(CaptureNotAllowed) as excinfo:
        wrapper(*inputs)
    assert str(excinfo.value) == (
        f"FULL graph for batch ({KEY}) was never captured and capture is not allowed outside the engine's capture "
        f"phase ({named}); the dispatcher returned a key the engine did not capture — this is an ascendgraph bug, "
        "please report it"
    )


def test_a_wrapper_for_a_mode_without_graphs_is_refused_naming_the_mode(sim_device):
    # GraphWrapper.__init__'s ValueError text (mutant: None)
    with pytest.raises(ValueError) as excinfo:
        GraphWrapper(_double_plus, GraphMode.NONE, sim_device)
    assert str(excinfo.value) == "a GraphWrapper captures PIECEWISE or FULL graphs, not NONE"


def test_capture_scopes_are_opened_around_the_runnable_with_the_wrapper(state, inputs):
    # GraphWrapper._capture: `scope(self)` (mutants: the scope not entered, or given None)
    import contextlib

    events = []

    @contextlib.contextmanager
    def scope(wrapper):
        events.append(("enter", wrapper))
        yield
        events.append(("exit", wrapper))

    def runnable(x, y):
        events.append(("run", None))
        return (x + y,)

    state.capture_scopes.append(scope)
    wrapper = GraphWrapper(runnable, GraphMode.FULL, state)
    with set_forward_context(_context(GraphMode.FULL)):
        wrapper(*inputs)
    assert events == [("enter", wrapper), ("run", None), ("exit", wrapper)]


def test_every_replay_is_counted(state, inputs):
    # GraphWrapper._replay: `entry.replays += 1` (mutant: `= 1`)
    wrapper = GraphWrapper(_double_plus, GraphMode.PIECEWISE, state)
    with set_forward_context(_context(GraphMode.PIECEWISE)):
        for _ in range(4):
            wrapper(*inputs)
    assert wrapper.entries[KEY].replays == 3


def test_debug_logging_alone_turns_the_address_check_on_and_each_capture_is_logged(state, inputs, caplog):
    # GraphWrapper._replay: `options.debug or state.debug or log.isEnabledFor(DEBUG)` (mutant: `and`
    # before the logging test), and _capture's debug record (mutants garbled it)
    caplog.set_level(logging.DEBUG, logger="ascendgraph.compile.graph_wrapper")
    x, y = inputs
    wrapper = GraphWrapper(_double_plus, GraphMode.FULL, state, options=GraphOptions(label="lm_head"))
    with set_forward_context(_context(GraphMode.FULL)):
        wrapper(x, y)
        assert [r.getMessage() for r in caplog.records if r.name == "ascendgraph.compile.graph_wrapper"] == [
            f"captured FULL graph lm_head for {KEY}"
        ]
        with pytest.raises(AssertionError, match="Input addresses for aclgraphs are different during replay"):
            wrapper(x.clone(), y)


def test_a_full_replay_waits_for_its_own_stream_only(inputs):
    # _synchronize_current_stream: the FULL replay synchronises the current stream, not the whole
    # device (mutants fell back to device.synchronize(), which waits for every stream's work)
    device = get_device("sim", faults="replay=1*hang->off")
    state = CaptureState(device, allowed=True)
    side = device.new_stream()
    x = torch.ones(4)
    piece = GraphWrapper(lambda t: (t + 1,), GraphMode.PIECEWISE, state)
    full = GraphWrapper(lambda t: (t * 3,), GraphMode.FULL, state)
    with set_forward_context(_context(GraphMode.FULL)):
        full(x)
    with device.stream(side), set_forward_context(_context(GraphMode.PIECEWISE)):
        piece(x)
        piece(x)  # this replay hangs (injected), on the side stream
    with set_forward_context(_context(GraphMode.FULL)):
        (out,) = full(x)  # synchronises the current stream: not blocked by the side stream
    device.current_stream().synchronize()
    assert torch.equal(out, torch.full((4,), 3.0))
    with pytest.raises(GraphHang):
        device.synchronize()  # the side stream's replay is still hung
