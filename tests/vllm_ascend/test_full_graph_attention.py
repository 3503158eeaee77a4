"""vLLM Ascend's attention backend captured in a FULL graph on the facade, driven by its own
code: ACLGraphWrapper (compilation/acl_graph.py) captures AscendAttentionBackendImpl.forward
of two layers (the KV write through npu_scatter_pa_kv_cache, then full_graph_fia: workspace
query, ExternalEvent wait/reset, task group around npu_fused_infer_attention_score.out);
each step then runs in the model runner's order (worker/model_runner_v1.py:2650-2657:
replay, then update_full_graph_params -> AscendAttentionBackendImpl.update_graph_params:
task update, .out re-issued with the step's lengths, event record).

8 query heads over 2 KV heads of 128, bf16, 16 blocks of 128: the shapes of the
feasibility run. Eager reference: the same layers on copies of the caches, without graph
and without padding; outputs and caches must be bitwise equal."""

from __future__ import annotations

import harness

harness.require()

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.compilation.cuda_graph import CUDAGraphOptions  # noqa: E402
from vllm.compilation.monitor import set_cudagraph_capturing_enabled  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402

import vllm_ascend.ops  # noqa: E402,F401  (before attention_v1, as the model runner imports it)
from ascendgraph.errors import CaptureConstraintError, GraphHang, KernelContractError  # noqa: E402
from sim import facade  # noqa: E402
from vllm_ascend.attention.attention_v1 import AscendAttentionBackend  # noqa: E402
from vllm_ascend.compilation import acl_graph  # noqa: E402

SIZE = 8


def reset_for_a_test() -> None:
    """What every test starts from: a fresh simulated NPU and vLLM Ascend's module state reset."""
    facade.configure()
    harness.reset_vllm_ascend_state()
    set_cudagraph_capturing_enabled(True)


@pytest.fixture(autouse=True)
def fresh() -> None:
    reset_for_a_test()


class FullGraphRun:
    """One FULL graph of SIZE tokens over TwoLayers, and its eager twin."""

    def __init__(self, mode: str = "FULL", *, sinks: bool = False, **additional: object) -> None:
        self.config = harness.vllm_config(mode, **additional)
        self.sinks = sinks
        options = {}
        if sinks:  # one learnable sink logit per query head (bf16, (Q_N,): the v2 op doc's shape)
            options["sinks"] = (torch.linspace(-1, 1, harness.HEADS)).to(torch.bfloat16).to(harness.DEVICE)
        self.model = harness.TwoLayers(self.config, SIZE, **options)
        self.eager = harness.TwoLayers(self.config, SIZE, **options)
        for graph_layer, eager_layer in zip(self.model.layers, self.eager.layers):
            eager_layer.kv_cache = graph_layer.clone_cache()
        self.builder = harness.metadata_builder(harness.builder_config(mode, **additional))
        acl_graph.set_graph_params([SIZE])
        self.wrapper = acl_graph.ACLGraphWrapper(self.model, self.config, CUDAGraphMode.FULL,
                                                 CUDAGraphOptions(gc_disable=True))
        self.update_stream = torch.npu.Stream()

    def capture(self) -> None:
        # The capture batch: SIZE decode requests of KV length 1 (a dummy run's shape).
        step = harness.Step([1] * SIZE, [1] * SIZE, padded_to=SIZE, state="DecodeOnly")
        self.model.load_inputs(step, seed=999)
        with harness.forward_context(self.config, self.model.metadata(step, self.builder), "FULL", SIZE,
                                     sinks=self.sinks) as context:
            self.wrapper()
            assert context.capturing is True  # ACLGraphWrapper set it (acl_graph.py:183)

    def step(self, step: harness.Step, seed: int, *, update: bool = True, wait: bool = True) -> None:
        """One step; ``wait=False``: the host goes on to the next step without waiting for the
        device, as the runner does under async scheduling."""
        self.model.load_inputs(step, seed)
        with harness.forward_context(self.config, self.model.metadata(step, self.builder), "FULL", SIZE,
                                     sinks=self.sinks) as context:
            self.wrapper()
            if update:
                acl_graph.update_full_graph_params(AscendAttentionBackend, self.update_stream, context, SIZE,
                                                   harness.update_config(self.config))
        if wait:
            torch.npu.synchronize()

    def eager_step(self, step: harness.Step, seed: int) -> None:
        unpadded = harness.Step(step.q_lens, step.kv_lens, state=step.state)
        self.eager.load_inputs(unpadded, seed)
        self.eager.tokens = unpadded.num_actual_tokens  # eagerly the runner does not pad
        with harness.forward_context(self.config, self.eager.metadata(unpadded, self.builder), "NONE", SIZE,
                                     sinks=self.sinks):
            self.eager()

    def assert_equal(self, step: harness.Step) -> None:
        n = step.num_actual_tokens
        for graph_out, eager_out in zip(self.model.outputs, self.eager.outputs):
            assert torch.equal(graph_out[:n], eager_out[:n])
        for graph_layer, eager_layer in zip(self.model.layers, self.eager.layers):
            assert torch.equal(graph_layer.kv_cache, eager_layer.kv_cache)


STEPS = [  # (q_lens, kv_lens), decodes first as the runner orders them: a prefill chunk after
    # decodes, then decodes growing, then fewer requests
    ([1, 1, 3], [40, 130, 3]),
    ([1, 1, 1], [41, 131, 4]),
    ([1, 2], [42, 6]),
    ([1, 1, 1, 1], [43, 5, 200, 7]),
]


def test_full_capture_then_per_step_update_in_the_model_runners_order_is_bitwise_eager() -> None:
    run = FullGraphRun()
    log = harness.KernelLog()
    with log.recording():
        run.capture()
        for index, (q_lens, kv_lens) in enumerate(STEPS):
            step = harness.Step(q_lens, kv_lens, padded_to=SIZE)
            run.step(step, seed=index)
            run.eager_step(step, seed=index)
            run.assert_equal(step)
    graph = run.wrapper.concrete_aclgraph_entries
    assert len(graph) == 1
    kernels = set(log.kernels())
    assert {"npu_scatter_pa_kv_cache", "npu_fused_infer_attention_score"} <= kernels
    assert log.violations() == []


def test_steps_the_host_does_not_wait_for_stay_ordered_by_the_wrappers_synchronize() -> None:
    # Async scheduling (model_runner_v1.py@182b75ea use_async_scheduling): the host issues step
    # N + 1 — its replay, then its task updates and event records on the update stream — before it
    # waited for step N. Only ACLGraphWrapper's synchronize of the current stream before a FULL
    # replay (compilation/acl_graph.py@182b75ea:253-266) orders step N + 1's records after step N's
    # waits and resets; without it the facade reports the race a card hangs on (a GraphHang at the
    # record, or a StreamOrderError at the update that would reach the previous replay first).
    run = FullGraphRun()
    run.capture()
    for index, (q_lens, kv_lens) in enumerate(STEPS):
        run.step(harness.Step(q_lens, kv_lens, padded_to=SIZE), seed=index, wait=False)
    torch.npu.synchronize()
    for index, (q_lens, kv_lens) in enumerate(STEPS):  # the eager twin, step by step
        run.eager_step(harness.Step(q_lens, kv_lens, padded_to=SIZE), seed=index)
    run.assert_equal(harness.Step(*STEPS[-1], padded_to=SIZE))


def test_a_replay_without_its_update_is_refused() -> None:
    run = FullGraphRun()
    run.capture()
    first = harness.Step(*STEPS[0], padded_to=SIZE)
    run.step(first, seed=0)
    # Without update_full_graph_params nothing records the layers' ExternalEvents: on a card
    # the replay waits forever; the facade refuses at the synchronize that would block.
    with pytest.raises(GraphHang, match="waiting on external event"):
        run.step(harness.Step(*STEPS[1], padded_to=SIZE), seed=1, update=False)


DECODE_STEPS = [  # uniform decode batches of fewer requests than the graph's SIZE
    ([1] * 5, [9, 40, 130, 2, 77]),
    ([1] * 5, [10, 41, 131, 3, 78]),
    ([1] * 3, [11, 42, 132]),
    ([1] * 8, [12, 43, 133, 4, 79, 1, 5, 200]),
]


def test_full_decode_only_through_the_paged_attention_branch_is_bitwise_eager() -> None:
    # FULL_DECODE_ONLY with the graph size in pa_shape_list: DecodeOnly batches take
    # forward_paged_attention (attention/utils.py:170-186 using_paged_attention), captured by
    # full_graph_pa (_npu_paged_attention_get_workspace, ExternalEvent, task group around
    # _npu_paged_attention) and updated with each step's context lengths.
    run = FullGraphRun("FULL_DECODE_ONLY", pa_shape_list=[SIZE])
    graph_log, eager_log = harness.KernelLog(), harness.KernelLog()
    with graph_log.recording():
        run.capture()
    for index, (q_lens, kv_lens) in enumerate(DECODE_STEPS):
        step = harness.Step(q_lens, kv_lens, padded_to=SIZE, state="DecodeOnly", uniform=True)
        with graph_log.recording():
            run.step(step, seed=index)
        with eager_log.recording():  # eagerly, batch sizes outside pa_shape_list take the FIA
            run.eager_step(step, seed=index)
        run.assert_equal(step)
    graph_kernels = set(graph_log.kernels())
    assert {"npu_scatter_pa_kv_cache", "_npu_paged_attention"} <= graph_kernels  # (+ its workspace query)
    assert "npu_fused_infer_attention_score" not in graph_kernels
    assert graph_log.violations() == [] and eager_log.violations() == []


SINKS_STEPS = [  # as many requests as the capture batch (see the block-table finding below)
    ([1] * 8, [9, 40, 130, 2, 77, 5, 200, 17]),
    ([1] * 8, [10, 41, 131, 3, 78, 6, 201, 18]),
    ([1] * 8, [11, 42, 132, 4, 79, 7, 202, 19]),
]


def test_the_sinks_path_captured_through_fia_v2_replays_bitwise_eager() -> None:
    # Layers with learnable sinks take npu_fused_infer_attention_score_v2 (attention_v1.py:1383
    # eagerly; full_graph_fia_v2 at capture, then the sinks branch of update_graph_params,
    # 609-705). At capture full_graph_fia_v2 passes attn_metadata.seq_lens as actual_seq_kvlen
    # (attention_v1.py:1091, 1139-1155); torch reads its values to bind the SymInt[] argument.
    # That tensor is the runner's pinned host buffer (harness.Step.common_metadata), so the
    # read is host work, not a device sync: the facade lets it through (a CPU tensor).
    run = FullGraphRun(sinks=True)
    log = harness.KernelLog()
    with log.recording():
        run.capture()
        for index, (q_lens, kv_lens) in enumerate(SINKS_STEPS):
            step = harness.Step(q_lens, kv_lens, padded_to=SIZE)
            run.step(step, seed=index)
            run.eager_step(step, seed=index)
            run.assert_equal(step)
    kernels = set(log.kernels())
    assert {"npu_fused_infer_attention_score_v2", "npu_scatter_pa_kv_cache"} <= kernels
    assert "npu_fused_infer_attention_score" not in kernels
    assert log.violations() == []
    assert all(out[:SIZE].float().abs().sum() > 0 for out in run.eager.outputs)


def test_the_sinks_update_keeps_the_captured_block_table_so_fewer_requests_break_its_contract() -> None:
    # A vLLM Ascend finding, kept as a reproducer (docs/vllm-ascend.md "Open findings"): the
    # sinks branch of update_graph_params re-issues the v2 kernel with the block_tables it
    # captured (attention_v1.py:664, 693) but the step's actual_seq_qlen (683-687), while the
    # v1 branch takes the step's block table. The capture batch had 8 requests, this step 4
    # (3 and the dummy): 8 rows for a batch of 4, which the op doc forbids ("first dim must
    # equal B": torch-npu 2.13.0 _op_plugin_docs.py:8780), so the table refuses the update.
    # The simulator computes a task update's outputs with the fake kernel, whose contract
    # check refuses with the rule's name; the kernel log's independent re-check names it too.
    run = FullGraphRun(sinks=True)
    run.capture()
    log = harness.KernelLog()
    with log.recording(), pytest.raises(KernelContractError, match="v2_block_table"):
        run.step(harness.Step(*STEPS[0], padded_to=SIZE), seed=0)
    # update_graph_params has no try/finally around graph_task_update_begin/_end, but the refusal
    # leaves its `with torch.npu.stream(update_stream)`, which closes the update on the facade
    # (docs/facade.md "Work left open, and recovering from it"; a card would keep it open).
    assert facade.runtime().open_work() == []
    assert log.violations() == ["npu_fused_infer_attention_score_v2: ['v2_block_table']"]
    refused = [args for name, args in log.calls if name == "npu_fused_infer_attention_score_v2"
               and len(args["actual_seq_qlen"]) == 4]  # this step's batch: 3 requests and the dummy
    assert refused and all(tuple(args["block_table"].shape) == (SIZE, 2) for args in refused)  # the capture's rows


def test_a_refusal_inside_update_graph_params_does_not_change_the_next_tests_numbers() -> None:
    # The refusal above, then what the next test of the worker does: the per-test reset
    # (`fresh`: sim.facade.configure) and a FULL run that must be bitwise eager. When the
    # update's collector outlived the refusal on torch's dispatch stack, every later op of the
    # worker returned uncomputed memory (11 tests failed with garbage kernel arguments).
    refused = FullGraphRun(sinks=True)
    refused.capture()
    with pytest.raises(KernelContractError, match="v2_block_table"):
        refused.step(harness.Step(*STEPS[0], padded_to=SIZE), seed=0)
    reset_for_a_test()
    run = FullGraphRun()
    run.capture()
    for index, (q_lens, kv_lens) in enumerate(STEPS[:2]):
        step = harness.Step(q_lens, kv_lens, padded_to=SIZE)
        run.step(step, seed=index)
        run.eager_step(step, seed=index)
        run.assert_equal(step)


def test_a_device_tensors_value_read_during_capture_is_still_refused() -> None:
    # The same capture with seq_lens as a device tensor (not the pinned host buffer): the read
    # would wait for the device, which a capture cannot do; the facade refuses it.
    run = FullGraphRun(sinks=True)
    original = harness.Step.common_metadata

    def unpinned(self: harness.Step, *args: object, **kwargs: object) -> object:
        common = original(self, *args, **kwargs)
        device_lens = common.seq_lens.clone()  # an npu tensor: device memory
        common._seq_lens_cpu = common.seq_lens_cpu = common.seq_lens_cpu_upper_bound = device_lens
        return common

    harness.Step.common_metadata = unpinned  # type: ignore[method-assign]
    try:
        with pytest.raises(CaptureConstraintError, match="Reading a tensor's value on the host|host synchronization"):
            run.capture()
    finally:
        harness.Step.common_metadata = original  # type: ignore[method-assign]


def test_the_layers_metadata_is_vllm_ascends_builders() -> None:
    # AscendAttentionMetadataBuilder.build itself (attention_v1.py:308-412) on the runner's
    # common metadata: it pins query_start_loc_cpu and copies it to the device (347), takes the
    # split-fuse mask from its AttentionMaskBuilder, and the query ends / KV lengths the kernels
    # then receive.
    builder = harness.metadata_builder(harness.builder_config("FULL"))
    model = harness.TwoLayers(harness.vllm_config("FULL"), SIZE)
    step = harness.Step(*STEPS[0], padded_to=SIZE)
    metadata = model.metadata(step, builder)[harness.LAYER_NAMES[0]]
    assert metadata.query_start_loc.device.type == "npu" and metadata.query_start_loc.tolist() == [0, 1, 2, 5, 8]
    assert metadata.actual_seq_lengths_q == [1, 2, 5, 8]  # the dummy request ends at the graph size
    assert metadata.seq_lens_list == [40, 130, 3, 0]  # the runner's zero fill for the dummy
    assert torch.equal(metadata.attn_mask, harness.split_fuse_mask())
    assert metadata.slot_mapping.tolist() == step.slots()
    assert metadata.block_tables.tolist() == [[0, 1], [2, 3], [4, 5], [0, 0]]
