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
from ascendgraph.errors import GraphHang  # noqa: E402
from sim import facade  # noqa: E402
from vllm_ascend.attention.attention_v1 import AscendAttentionBackend  # noqa: E402
from vllm_ascend.compilation import acl_graph  # noqa: E402

SIZE = 8


@pytest.fixture(autouse=True)
def fresh() -> None:
    facade.configure()
    harness.reset_vllm_ascend_state()
    set_cudagraph_capturing_enabled(True)


class FullGraphRun:
    """One FULL graph of SIZE tokens over TwoLayers, and its eager twin."""

    def __init__(self, *, with_kv: bool = True) -> None:
        self.config = harness.vllm_config("FULL")
        self.model = harness.TwoLayers(self.config, SIZE, with_kv=with_kv)
        self.eager = harness.TwoLayers(self.config, SIZE, with_kv=with_kv)
        for graph_layer, eager_layer in zip(self.model.layers, self.eager.layers):
            eager_layer.kv_cache = graph_layer.clone_cache()
        self.mask = harness.split_fuse_mask()
        acl_graph.set_graph_params([SIZE])
        self.wrapper = acl_graph.ACLGraphWrapper(self.model, self.config, CUDAGraphMode.FULL,
                                                 CUDAGraphOptions(gc_disable=True))
        self.update_stream = torch.npu.Stream()

    def capture(self) -> None:
        # The capture batch: SIZE decode requests of KV length 1 (a dummy run's shape).
        step = harness.Step([1] * SIZE, [1] * SIZE, padded_to=SIZE, state="DecodeOnly")
        self.model.load_inputs(step, seed=999)
        with harness.forward_context(self.config, self.model.metadata(step, self.mask), "FULL", SIZE) as context:
            self.wrapper()
            assert context.capturing is True  # ACLGraphWrapper set it (acl_graph.py:183)

    def step(self, step: harness.Step, seed: int, *, update: bool = True) -> None:
        self.model.load_inputs(step, seed)
        with harness.forward_context(self.config, self.model.metadata(step, self.mask), "FULL", SIZE) as context:
            self.wrapper()
            if update:
                acl_graph.update_full_graph_params(AscendAttentionBackend, self.update_stream, context, SIZE,
                                                   harness.update_config(self.config))
        torch.npu.synchronize()

    def eager_step(self, step: harness.Step, seed: int) -> None:
        unpadded = harness.Step(step.q_lens, step.kv_lens, state=step.state)
        self.eager.load_inputs(unpadded, seed)
        with harness.forward_context(self.config, self.eager.metadata(unpadded, self.mask), "NONE", SIZE):
            self.eager()

    def assert_equal(self, step: harness.Step) -> None:
        n = step.num_actual_tokens
        for graph_out, eager_out in zip(self.model.outputs, self.eager.outputs):
            assert torch.equal(graph_out[:n], eager_out[:n])
        for graph_layer, eager_layer in zip(self.model.layers, self.eager.layers):
            assert torch.equal(graph_layer.kv_cache, eager_layer.kv_cache)


STEPS = [  # (q_lens, kv_lens): a prefill chunk beside decodes, then decodes growing, then fewer requests
    ([3, 1, 1], [3, 40, 130]),
    ([1, 1, 1], [4, 41, 131]),
    ([2, 1], [6, 42]),
    ([1, 1, 1, 1], [7, 43, 5, 200]),
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


def test_a_replay_without_its_update_is_refused() -> None:
    run = FullGraphRun()
    run.capture()
    first = harness.Step(*STEPS[0], padded_to=SIZE)
    run.step(first, seed=0)
    # Without update_full_graph_params nothing records the layers' ExternalEvents: on a card
    # the replay waits forever; the facade refuses at the synchronize that would block.
    with pytest.raises(GraphHang, match="waiting on external event"):
        run.step(harness.Step(*STEPS[1], padded_to=SIZE), seed=1, update=False)
