"""The facade's fault plans applied while vLLM Ascend's own code captures (two attention
layers in FULL graphs of 8 and 4 tokens, through ACLGraphWrapper): what vLLM Ascend raises
and what is left behind.

* 207008 at the second capture: ACLGraphWrapper re-raises with its stream-resource text
  (acl_graph.py:201-212) chained to torch_npu's; the first graph still replays.
* CANN's "Alloc sq cq fail" at the second capture (an old HDK's stream-resource failure):
  ACLGraphWrapper re-raises with its old-HDK advice (acl_graph.py:33, 44-46, 204-210), not
  the stream-resource one.
* an OOM in the graph pool during the second capture: vLLM Ascend adds nothing (the
  RuntimeError matches neither of its markers, acl_graph.py:192-213) and the pool is not
  left holding the failed capture's memory; the first layer's graph parameters of the failed
  size stay in vLLM Ascend's _graph_params (its capture errors are fatal for the worker).
* a lost device at replay: DeviceLost propagates out of ACLGraphWrapper, and the device stays
  lost.
"""

from __future__ import annotations

import harness

harness.require()

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.compilation.cuda_graph import CUDAGraphOptions  # noqa: E402
from vllm.compilation.monitor import set_cudagraph_capturing_enabled  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402

import vllm_ascend.ops  # noqa: E402,F401
from ascendgraph.errors import DeviceLost  # noqa: E402
from sim import facade  # noqa: E402
from vllm_ascend.attention.attention_v1 import AscendAttentionBackend  # noqa: E402
from vllm_ascend.compilation import acl_graph  # noqa: E402

SIZES = (8, 4)


@pytest.fixture(autouse=True)
def fresh() -> None:
    facade.configure()
    harness.reset_vllm_ascend_state()
    set_cudagraph_capturing_enabled(True)


class TwoSizes:
    def __init__(self) -> None:
        self.config = harness.vllm_config("FULL")
        self.builder = harness.metadata_builder(harness.builder_config("FULL"))
        acl_graph.set_graph_params(list(SIZES))
        self.models = {size: harness.TwoLayers(self.config, size) for size in SIZES}
        self.wrappers = {size: acl_graph.ACLGraphWrapper(model, self.config, CUDAGraphMode.FULL,
                                                         CUDAGraphOptions(gc_disable=True))
                         for size, model in self.models.items()}

    def capture(self, size: int) -> None:
        step = harness.Step([1] * size, [1] * size, padded_to=size, state="DecodeOnly")
        model = self.models[size]
        model.load_inputs(step, seed=size)
        with harness.forward_context(self.config, model.metadata(step, self.builder), "FULL", size):
            self.wrappers[size]()

    def replay(self, size: int, update_stream: object) -> None:
        step = harness.Step([1] * size, [5] * size, padded_to=size, state="DecodeOnly")
        model = self.models[size]
        model.load_inputs(step, seed=100 + size)
        with harness.forward_context(self.config, model.metadata(step, self.builder), "FULL", size) as context:
            self.wrappers[size]()
            acl_graph.update_full_graph_params(AscendAttentionBackend, update_stream, context, size,
                                               harness.update_config(self.config))
        torch.npu.synchronize()


def test_207008_at_the_second_capture_is_reraised_with_vllm_ascends_stream_resource_text() -> None:
    facade.configure(faults="capture_begin=1*off->raise(207008)")
    harness.reset_vllm_ascend_state()
    run = TwoSizes()
    run.capture(8)
    with pytest.raises(RuntimeError) as info:
        run.capture(4)
    text = str(info.value)
    assert text.startswith("ACL graph capture failed with a known stream-resource exhaustion signature")
    assert "207008" in str(info.value.__cause__)
    assert run.wrappers[4].concrete_aclgraph_entries[next(iter(run.wrappers[4].concrete_aclgraph_entries))].aclgraph is None
    assert acl_graph.get_graph_params().handles[4] == []  # nothing of the failed size was captured
    assert not facade.device().stats().extra["capturing"]
    run.replay(8, torch.npu.Stream())  # the first graph is intact


def test_alloc_sq_cq_at_the_second_capture_is_reraised_with_vllm_ascends_old_hdk_text() -> None:
    # vllm-project/vllm-ascend#10555 gave this signature its own advice (upgrade the HDK);
    # before it, the failure read as a generic stream-resource exhaustion.
    facade.configure(faults="capture_begin=1*off->raise(alloc_sq_cq)")
    harness.reset_vllm_ascend_state()
    run = TwoSizes()
    run.capture(8)
    with pytest.raises(RuntimeError) as info:
        run.capture(4)
    text = str(info.value)
    assert text.startswith("ACL graph capture failed with an old Ascend HDK/CANN stack signature (`Alloc sq cq fail`)")
    assert "Alloc sq cq fail" in str(info.value.__cause__)
    assert acl_graph.get_graph_params().handles[4] == []
    assert not facade.device().stats().extra["capturing"]
    run.replay(8, torch.npu.Stream())


def test_an_oom_in_the_graph_pool_propagates_unchanged_and_frees_the_failed_capture() -> None:
    run = TwoSizes()
    run.capture(8)
    pool_before = facade.device().stats().pool_bytes
    facade.device().set_fault_plan("malloc=raise(oom)")
    with pytest.raises(torch.OutOfMemoryError, match="NPU out of memory. Tried to allocate"):
        run.capture(4)
    facade.device().set_fault_plan(None)
    stats = facade.device().stats()
    assert stats.pool_bytes == pool_before and not stats.extra["capturing"]
    # vLLM Ascend appended nothing for size 4 before the first allocation failed ...
    params = acl_graph.get_graph_params()
    assert len(params.handles[4]) == len(params.events[4]) == len(params.attn_params[4])
    run.replay(8, torch.npu.Stream())


def test_a_lost_device_at_replay_propagates_out_of_the_wrapper_and_stays_lost() -> None:
    run = TwoSizes()
    run.capture(8)
    facade.device().set_fault_plan("replay=raise(device_lost)")
    with pytest.raises(DeviceLost):
        run.replay(8, torch.npu.Stream())
    facade.device().set_fault_plan(None)
    with pytest.raises(DeviceLost):
        torch.npu.synchronize()
    assert facade.device().stats().extra["device_lost"]
