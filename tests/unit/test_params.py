"""FULL-graph attention parameter update (docs/semantics.md §7) on the simulator."""

from __future__ import annotations

import pytest
import torch

from ascendgraph import ops
from ascendgraph.compile.graph_wrapper import CaptureState, GraphWrapper
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import GRAPH_PARAMS_ALREADY_SET, CaptureConstraintError, GraphHang, StaleGraphParams
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, set_forward_context
from ascendgraph.models.attention import AttentionCall
from ascendgraph.modes import GraphMode
from ascendgraph.runtime.params import GraphParams, GraphParamsNotSet, padded_attention_lengths
from sim import SimDevice

SCALE = 0.35


def _metadata(ends, seq_lens, *, tokens, uniform=False, q=1, block_table=None) -> AttentionMetadata:
    if block_table is None:  # one zero row per possible request (and the dummy one)
        block_table = torch.zeros(tokens + 1, 1, dtype=torch.int32)
    return AttentionMetadata(
        num_reqs=len(ends),
        num_actual_tokens=ends[-1] if ends else 0,
        num_tokens=tokens,
        query_start_loc=list(ends),
        seq_lens=list(seq_lens),
        block_table=block_table,
        slot_mapping=torch.zeros(tokens, dtype=torch.long),
        uniform_decode=uniform,
        query_len=q,
    )


# --------------------------------------------------------------------------- padding rules


@pytest.mark.parametrize(
    "ends, seq_lens, key, q, captured, expected",
    [
        # uniform decode, q = 1: one request per token, ends 1..N, KV lengths padded with zeros
        ([1, 2], [7, 9], BatchDescriptor(4, 4, True), 1, 4, ([1, 2, 3, 4], [7, 9, 0, 0])),
        # spec decode, m = k + 1 = 2: N // m requests, ends [m, 2m, ...]
        ([2, 4], [5, 6], BatchDescriptor(8, 4, True), 2, 4, ([2, 4, 6, 8], [5, 6, 0, 0])),
        ([3], [4], BatchDescriptor(9, 3, True), 3, 3, ([3, 6, 9], [4, 0, 0])),
        # mixed batch (vLLM Ascend's _pad_query_start_loc_for_fia): the real ends plus ONE dummy
        # request ending at the graph's token count, KV length 0 -- so the last end equals T
        ([3, 4, 6], [3, 10, 2], BatchDescriptor(8, 8, False), 1, 8, ([3, 4, 6, 8], [3, 10, 2, 0])),
        ([5], [5], BatchDescriptor(8, 2, False), 1, 2, ([5, 8], [5, 0])),
        # no padding tokens: no dummy request
        ([3, 8], [3, 9], BatchDescriptor(8, 2, False), 1, 2, ([3, 8], [3, 9])),
    ],
)
def test_padded_lengths_follow_the_captured_request_count(ends, seq_lens, key, q, captured, expected):
    metadata = _metadata(ends, seq_lens, tokens=key.num_tokens, uniform=key.uniform, q=q)
    padded = padded_attention_lengths(metadata, key, captured_num_reqs=captured, query_len=q)
    assert padded == expected
    assert padded[0][-1] == key.num_tokens  # T == last end: the TND rule of the fused attention


def test_more_requests_than_the_graph_holds_is_refused():
    metadata = _metadata([1, 2, 3], [1, 1, 1], tokens=4)
    with pytest.raises(ValueError, match="captured for 2"):
        padded_attention_lengths(metadata, BatchDescriptor(4, 2), captured_num_reqs=2, query_len=1)


def test_a_non_uniform_batch_on_a_uniform_graph_is_refused():
    metadata = _metadata([1, 3], [4, 4], tokens=4, uniform=True, q=2)
    with pytest.raises(ValueError, match="uniform decode"):
        padded_attention_lengths(metadata, BatchDescriptor(4, 2, True), captured_num_reqs=2, query_len=2)


# --------------------------------------------------------------------------- ownership


def test_parameters_may_be_set_once_per_engine(sim_device):
    params = GraphParams(sim_device)
    params.set_sizes([4, 1, 2])
    assert params.sizes == (1, 2, 4)
    with pytest.raises(ValueError) as excinfo:
        params.set_sizes([1, 2])
    assert str(excinfo.value) == GRAPH_PARAMS_ALREADY_SET == "Graph parameters have already been set!"
    other = GraphParams(sim_device)  # another engine's parameters are independent
    other.set_sizes([8])
    assert other.sizes == (8,) and params.sizes == (1, 2, 4)


def test_capture_and_update_need_the_sizes_first(sim_device):
    params = GraphParams(sim_device)
    with pytest.raises(GraphParamsNotSet):
        params.update(BatchDescriptor(4), _metadata([1], [1], tokens=4))


# --------------------------------------------------------------------------- capture / replay / update


class _Setup:
    """One FULL graph around one attention launch: 4 tokens, up to 4 requests, 2 heads.

    Legal for the fused attention (bfloat16, head_dim 16, block size 128 — a mixed batch has a
    request of several query tokens, Q_S > 1, op docs :8219 — one block-table row per request)."""

    def __init__(self, device) -> None:
        generator = torch.Generator().manual_seed(0)
        self.device = device
        self.key_cache = torch.randn(4, 128, 1, 16, generator=generator).bfloat16()
        self.value_cache = torch.randn(4, 128, 1, 16, generator=generator).bfloat16()
        self.block_table = torch.tensor([[0, 1], [2, 3], [1, 0], [3, 2]], dtype=torch.int32)
        self.query = torch.randn(4, 2, 16, generator=generator).bfloat16()
        self.descriptor = BatchDescriptor(4, 4, True)
        self.params = GraphParams(device)
        self.params.set_sizes([4])
        self.state = CaptureState(device, allowed=True, graph_params=self.params)
        self.wrapper = GraphWrapper(self._attention, GraphMode.FULL, self.state)
        self.captured_lengths = ([1, 2, 3, 4], [1, 1, 1, 1])

    def _attention(self, query: torch.Tensor) -> tuple[torch.Tensor]:
        out = torch.empty_like(query)
        ends, lens = self.captured_lengths
        call = AttentionCall("layer", query, self.key_cache, self.value_cache, self.block_table, ends, lens, SCALE, out)
        self.params.capture_attention(self.descriptor, call)
        return (out,)

    def context(self) -> ForwardContext:
        return ForwardContext(GraphMode.FULL, self.descriptor, None, {}, graph_params=self.params)

    def capture(self) -> None:
        self.eager(*self.captured_lengths)  # the warm-up (a kernel's first launch is refused in a capture)
        with set_forward_context(self.context()):
            self.wrapper(self.query)

    def replay(self, seq_lens, **update) -> torch.Tensor:
        metadata = _metadata([1, 2, 3, 4][: len(seq_lens)], seq_lens, tokens=4, uniform=True, block_table=self.block_table)
        with set_forward_context(self.context()):
            (out,) = self.wrapper(self.query)
        self.params.update(self.descriptor, metadata, query_len=1, **update)
        self.device.synchronize()
        return out.clone()

    def eager(self, ends, seq_lens) -> torch.Tensor:
        out = torch.empty_like(self.query)
        ops.paged_attention(self.query, self.key_cache, self.value_cache, self.block_table, ends, seq_lens, SCALE, out)
        return out


def test_capture_records_one_task_group_and_event_per_attention_call(sim_device):
    setup = _Setup(sim_device)
    setup.capture()
    records = setup.params.records(setup.descriptor)
    assert len(records) == 1
    assert records[0].captured_num_reqs == 4
    assert records[0].call.seq_lens == [1, 1, 1, 1]


def test_the_update_gives_the_replay_the_new_sequence_lengths(sim_device):
    setup = _Setup(sim_device)
    setup.capture()
    result = setup.replay([5, 3, 8])
    expected = setup.eager([1, 2, 3, 4], [5, 3, 8, 0])
    torch.testing.assert_close(result, expected, rtol=0, atol=0)
    assert setup.params.updates == 1


def test_skipping_the_update_is_caught_by_the_device_naming_graph_group_layer_and_replay(sim_device):
    setup = _Setup(sim_device)
    setup.capture()
    with pytest.raises(StaleGraphParams) as excinfo:
        setup.replay([5, 3, 8], skip_kernel=True)
    message = str(excinfo.value)
    assert "replay 1 of graph#1 executed task group 0 (ascendgraph.paged_attention.default)" in message
    assert "layer layer" in message and "without a task update since that replay began" in message
    # the event was recorded anyway: nothing hangs, and the next replay with its update is right
    sim_device.synchronize()
    torch.testing.assert_close(setup.replay([5, 3, 8]), setup.eager([1, 2, 3, 4], [5, 3, 8, 0]), rtol=0, atol=0)


def test_an_update_for_an_earlier_replay_does_not_count_for_the_next_one(sim_device):
    setup = _Setup(sim_device)
    setup.capture()
    setup.replay([5, 3, 8])
    with pytest.raises(StaleGraphParams, match="replay 2 of graph#1"):
        setup.replay([5, 3, 8], skip_kernel=True)


def test_skipping_the_update_replays_the_frozen_lengths_and_gives_wrong_results():
    # require_task_updates=False: the device lets stale parameters through (the numeric path)
    setup = _Setup(SimDevice(require_task_updates=False))
    setup.capture()
    stale = setup.replay([5, 3, 8], skip_kernel=True)
    torch.testing.assert_close(stale, setup.eager([1, 2, 3, 4], [1, 1, 1, 1]), rtol=0, atol=0)
    assert (stale - setup.eager([1, 2, 3, 4], [5, 3, 8, 0])).abs().max() > 0.1


def test_never_recording_the_event_is_reported_as_a_hang(sim_device):
    setup = _Setup(sim_device)
    setup.capture()
    with pytest.raises(GraphHang, match="waiting on external event"):
        setup.replay([5, 3, 8], record_events=False)


def test_updates_track_successive_batches(sim_device):
    setup = _Setup(sim_device)
    setup.capture()
    for seq_lens in ([2, 2, 2, 2], [7], [8, 1]):
        padded = seq_lens + [0] * (4 - len(seq_lens))
        torch.testing.assert_close(setup.replay(seq_lens), setup.eager([1, 2, 3, 4], padded), rtol=0, atol=0)


def test_a_failed_capture_discards_its_records(sim_device):
    setup = _Setup(sim_device)

    def failing(query):
        setup._attention(query)
        raise RuntimeError("capture went wrong")

    setup.wrapper.runnable = failing
    with pytest.raises(RuntimeError, match="capture went wrong"):
        setup.capture()
    assert setup.params.records(setup.descriptor) == []
    assert sim_device.stats().graphs_alive == 0


def test_a_failing_update_ends_the_update_records_every_event_and_raises(sim_device, monkeypatch):
    setup = _Setup(sim_device)
    setup.capture()
    original = AttentionCall.launch

    def fail_when_updating(self, *args, **kwargs):
        if args:  # the update re-issues with new lengths
            raise RuntimeError("kernel launch failed")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(AttentionCall, "launch", fail_when_updating)
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        setup.replay([5, 3, 8])
    monkeypatch.setattr(AttentionCall, "launch", original)
    sim_device.synchronize()  # every event was recorded: no GraphHang
    # the update was ended: the next one can begin, and the replay after it is right
    torch.testing.assert_close(setup.replay([2, 2]), setup.eager([1, 2, 3, 4], [2, 2, 0, 0]), rtol=0, atol=0)


def test_an_update_refused_before_any_kernel_still_records_every_event(sim_device):
    # The padding of a batch the graph cannot take raises before any task update: the
    # replay already launched waits on every layer's event, so they are recorded anyway
    # (before the fix the padding ran outside the try/finally and synchronize hung).
    setup = _Setup(sim_device)
    setup.capture()
    with set_forward_context(setup.context()):
        setup.wrapper(setup.query)  # the replay, waiting on its event
    metadata = _metadata([2, 4], [5, 5], tokens=4, uniform=True, block_table=setup.block_table)
    with pytest.raises(ValueError, match="uniform decode"):
        setup.params.update(setup.descriptor, metadata, query_len=1)
    sim_device.synchronize()  # no GraphHang: the events were recorded
    torch.testing.assert_close(setup.replay([2, 2]), setup.eager([1, 2, 3, 4], [2, 2, 0, 0]), rtol=0, atol=0)


def test_the_workspace_and_softmax_lse_are_made_before_the_task_group_and_reused_by_updates(sim_device):
    setup = _Setup(sim_device)
    setup.capture()
    (record,) = setup.params.records(setup.descriptor)
    assert record.call.workspace is not None and record.call.workspace.dtype == torch.uint8
    assert record.call.softmax_lse is not None and record.call.softmax_lse.dtype == setup.query.dtype
    workspace = record.call.workspace
    setup.replay([5, 3, 8])
    assert setup.params.records(setup.descriptor)[0].call.workspace is workspace


def test_a_capture_failing_inside_the_task_group_closes_it_gives_everything_back_and_restores_the_stream(
    sim_device, monkeypatch
):
    setup = _Setup(sim_device)
    before = sim_device.stats()
    stream = sim_device.current_stream()

    def fail(self, *args, **kwargs):
        raise RuntimeError("kernel launch failed")

    monkeypatch.setattr(AttentionCall, "launch", fail)
    with pytest.raises(RuntimeError, match="kernel launch failed"):
        setup.capture()
    after = sim_device.stats()
    assert (after.streams_in_use, after.pool_bytes, after.graphs_alive, after.extra["capturing"]) == (
        before.streams_in_use, before.pool_bytes, before.graphs_alive, False
    )
    assert sim_device.current_stream() is stream
    assert setup.params.records(setup.descriptor) == []
    monkeypatch.undo()
    setup.capture()  # the wrapper captures again
    assert len(setup.params.records(setup.descriptor)) == 1


def test_allocating_the_output_inside_the_task_group_is_refused(sim_device):
    device = sim_device
    x = torch.ones(4)
    graph = device.new_graph()
    with pytest.raises(CaptureConstraintError, match="only single-operator kernel tasks"):
        with device.graph(graph):
            stream = device.current_stream()
            device.task_group_begin(stream)
            x + 1
    assert not graph.is_captured


# --------------------------------------------------------------------------- mutation survivors
# Written against survivors of the mutmut run over ascendgraph/runtime/params.py (docs/testing.md,
# "Mutation testing"); each asserts what the code is for, the comment names the mutant.


def test_the_refusals_say_what_went_wrong():
    # padded_attention_lengths' messages (mutants dropped or garbled them; `//` -> `/` printed 4.0)
    too_many = _metadata([1, 2, 3], [1, 1, 1], tokens=4)
    with pytest.raises(ValueError) as excinfo:
        padded_attention_lengths(too_many, BatchDescriptor(4, 2), captured_num_reqs=2, query_len=1)
    assert str(excinfo.value) == (
        f"batch of 3 requests replays a graph captured for 2 ({BatchDescriptor(4, 2)}); "
        "the dispatcher padded to a key that is too small"
    )
    uniform = _metadata([2], [5], tokens=8, uniform=True, q=2)
    key = BatchDescriptor(8, 4, True)
    with pytest.raises(ValueError) as excinfo:
        padded_attention_lengths(uniform, key, captured_num_reqs=3, query_len=2)
    assert str(excinfo.value) == f"uniform graph {key} holds 4 requests of 2 tokens, but it was captured with 3"


def test_an_update_before_the_sizes_or_for_an_uncaptured_key_names_the_cause(sim_device):
    # GraphParams.update's GraphParamsNotSet and KeyError texts (mutants dropped or garbled them)
    params = GraphParams(sim_device)
    with pytest.raises(GraphParamsNotSet) as excinfo:
        params.update(BatchDescriptor(4), _metadata([1], [1], tokens=4))
    assert str(excinfo.value) == "GraphParams.update before set_sizes: nothing was captured"
    setup = _Setup(sim_device)
    setup.capture()
    with pytest.raises(KeyError) as excinfo:
        setup.params.update(BatchDescriptor(2, 2, True), _metadata([1, 2], [1, 1], tokens=2, uniform=True))
    message = excinfo.value.args[0]
    assert message.startswith(f"no FULL-graph attention parameters were captured for {BatchDescriptor(2, 2, True)}; ")
    assert message.endswith(f"captured keys: {[str(setup.descriptor)]}")


def test_an_update_defaults_to_one_query_token_per_request_and_counts_every_update(sim_device):
    # update(query_len=1) default (mutant: 2) and `self.updates += 1` (mutant: `= 1`)
    setup = _Setup(sim_device)
    setup.capture()
    for count, seq_lens in enumerate(([5, 3, 8], [2, 2, 2, 2]), start=1):
        metadata = _metadata([1, 2, 3, 4][: len(seq_lens)], seq_lens, tokens=4, uniform=True,
                             block_table=setup.block_table)
        with set_forward_context(setup.context()):
            (out,) = setup.wrapper(setup.query)
        assert setup.params.update(setup.descriptor, metadata) == 1  # no query_len: decode, q = 1
        sim_device.synchronize()
        padded = seq_lens + [0] * (4 - len(seq_lens))
        torch.testing.assert_close(out, setup.eager([1, 2, 3, 4], padded), rtol=0, atol=0)
        assert setup.params.updates == count


def test_the_update_runs_on_its_own_stream_not_the_replaying_one(sim_device):
    # the task updates run on the update stream, read from their trace spans (an update on the
    # replay's stream would queue behind the replay that waits for it: a hang on a device). Where
    # the update records its events is not observable on the simulator (docs/testing.md).
    setup = _Setup(sim_device)
    setup.capture()
    sim_device.set_record_kernels(True)
    replay_stream = sim_device.current_stream()
    setup.replay([5, 3, 8])
    updates = [span for span in sim_device.trace_spans if span.kind == "task_update"]
    assert [span.stream_id for span in updates] == [setup.params.update_stream.stream_id]
    assert updates[0].stream_id != replay_stream.stream_id


def test_the_update_gives_a_mixed_batch_its_query_ends_and_block_table(sim_device):
    # update / _update_one: the real query ends (mutant: None kept the captured ones, equal
    # for uniform decode) and the batch's block table (mutant: None kept the captured one)
    setup = _Setup(sim_device)
    setup.descriptor = BatchDescriptor(4, 4, False)  # a mixed batch graph of 4 tokens
    setup.capture()
    block_table = torch.tensor([[3, 2], [1, 0], [0, 0]], dtype=torch.int32)  # the batch's blocks + a spare row
    metadata = _metadata([3], [20], tokens=4, block_table=block_table)  # one request of 3 tokens, 20 in KV
    with set_forward_context(setup.context()):
        (out,) = setup.wrapper(setup.query)
    setup.params.update(setup.descriptor, metadata, query_len=1)
    sim_device.synchronize()
    # the real end 3, then one dummy request ending at the graph's 4 tokens with KV length 0
    expected = torch.empty_like(setup.query)
    ops.paged_attention(setup.query, setup.key_cache, setup.value_cache, block_table[:2], [3, 4], [20, 0], SCALE,
                        expected)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_a_capture_before_the_sizes_or_of_another_size_names_the_cause(sim_device):
    # GraphParams.capture_attention's GraphParamsNotSet and ValueError texts (mutants garbled them)
    setup = _Setup(sim_device)
    setup.eager(*setup.captured_lengths)
    setup.params = GraphParams(sim_device)  # sizes never set
    setup.state.graph_params = setup.params
    with pytest.raises(GraphParamsNotSet) as excinfo:
        setup.capture()
    assert str(excinfo.value) == (
        "FULL-graph capture needs GraphParams.set_sizes(capture_sizes) first (the engine does it before capturing)"
    )
    setup.params.set_sizes([1, 2])
    with pytest.raises(ValueError) as excinfo:
        setup.capture()
    assert str(excinfo.value) == (
        f"FULL graph for {setup.descriptor} captured, but 4 is not one of the capture sizes [1, 2] its parameters "
        "were set for"
    )


def test_a_failing_post_capture_step_discards_the_graphs_parameters(sim_device):
    # GraphWrapper._capture: a failing after_capture hook discards the FULL graph's records for
    # its own key (mutant: `_discard_failed(graph, None)`)
    setup = _Setup(sim_device)

    def refuse(wrapper, entry):
        raise RuntimeError("post-capture step failed")

    setup.state.after_capture.append(refuse)
    with pytest.raises(RuntimeError, match="post-capture step failed"):
        setup.capture()
    assert setup.params.records(setup.descriptor) == [] and setup.params.descriptors == []


def test_the_parameters_describe_their_sizes_graphs_and_attention_calls(sim_device):
    # GraphParams.__repr__ (had no test)
    setup = _Setup(sim_device)
    assert repr(setup.params) == "GraphParams(sizes=[4], graphs=0, attention_calls=0)"
    setup.capture()
    assert repr(setup.params) == "GraphParams(sizes=[4], graphs=1, attention_calls=1)"
