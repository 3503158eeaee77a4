"""vLLM Ascend's NPUModelRunner, whole and unmodified, serving a scheduled stream on the
simulated NPU (worker/model_runner_v1.py@182b75ea on vLLM 0.27.1; tests/vllm_ascend/serving.py
builds it as NPUWorker does and drives it with vLLM's own Scheduler).

The stream (`STREAM`) has prefills (one longer than a block), decodes, mixed batches, a prefill
chunked at ``max_num_batched_tokens``, a uniform decode batch and a mixed batch that fill
``max_num_seqs``, requests finishing while others arrive, and steps that schedule nothing (the
finish flushed to the runner). It is served eagerly (``enforce_eager=True``) and in each graph
mode, every run on a fresh simulated NPU, and compared step by step: the requests vLLM's
scheduler put in the step, the tokens the runner sampled and the logits it computed, bitwise;
then again with async scheduling, and with faults in the runner's path."""

from __future__ import annotations

import harness

harness.require()

import pytest  # noqa: E402
from typing import Any  # noqa: E402
import torch  # noqa: E402

import serving  # noqa: E402
from serving import Arrival, RunnerSpec  # noqa: E402

STREAM = [
    Arrival(0, "a", prompt_len=5, max_tokens=3, seed=1),
    Arrival(0, "b", prompt_len=150, max_tokens=9, seed=2),  # longer than a block of 128
    Arrival(2, "c", prompt_len=9, max_tokens=6, seed=3),  # a prefill beside two decodes
    Arrival(4, "d", prompt_len=2, max_tokens=7, seed=4),
    Arrival(5, "e", prompt_len=300, max_tokens=4, seed=5),  # chunked: more than max_num_batched_tokens
    Arrival(8, "g", prompt_len=3, max_tokens=2, seed=7),  # beside three decodes: 4 requests, 6 tokens
    Arrival(13, "f", prompt_len=4, max_tokens=2, seed=6),  # arrives after the others finished
]
# The graph runs under test, each served once per pytest worker and read by the tests below.
# FULL (every batch up to the largest capture size in one graph) is the mode in which a mixed
# batch filling max_num_seqs gets its FIA dummy request (_pad_query_start_loc_for_fia) and the
# metadata builder pads seq_lens and block_table for it (attention_v1.py:351-379).
SIZES = (1, 2, 4, 8)
GRAPH_RUNS = {
    "FULL_DECODE_ONLY": RunnerSpec(mode="FULL_DECODE_ONLY", capture_sizes=SIZES),
    # decode batches of these sizes through ATB's paged attention (full_graph_pa) instead of FIA
    # (attention/utils.py:170-186 using_paged_attention; the captures' dummy runs must be DecodeOnly)
    "FULL_DECODE_ONLY, pa_shape_list": RunnerSpec(
        mode="FULL_DECODE_ONLY", capture_sizes=SIZES,
        additional_config=RunnerSpec().additional_config + (("pa_shape_list", [1, 2, 4]),)),
    "FULL_AND_PIECEWISE": RunnerSpec(mode="FULL_AND_PIECEWISE", capture_sizes=SIZES),
    "FULL": RunnerSpec(mode="FULL", capture_sizes=SIZES),
}


def stream_shape(records: list[serving.StepRecord]) -> dict[str, bool]:
    """The kinds of steps vLLM's scheduler made of `STREAM` (each one the stream is meant to have)."""
    return {
        "prefill longer than a block": any(n > serving.BLOCK_SIZE for r in records for n in r.scheduled.values()),
        "decodes filling max_num_seqs": any(len(r.scheduled) == 4 and set(r.scheduled.values()) == {1}
                                            for r in records),
        "mixed": any(1 in r.scheduled.values() and max(r.scheduled.values(), default=0) > 1 for r in records),
        "mixed filling max_num_seqs": any(len(r.scheduled) == 4 and sum(r.scheduled.values()) < SIZES[-1]
                                          and max(r.scheduled.values()) > 1 for r in records),
        "chunked prefill": any(sum(r.scheduled.values()) == 256 for r in records),
        "nothing scheduled": any(not r.scheduled for r in records),
        "arrival after finishes": any(r.finished for r in records) and "f" in serving.tokens(records),
    }


_SERVED: dict[str, serving.Served] = {}


def served(spec: RunnerSpec) -> serving.Served:
    """``spec`` serving `STREAM`, once per pytest worker (on its own fresh simulated NPU)."""
    key = repr(spec)
    if key not in _SERVED:
        _SERVED[key] = serving.serve(spec, STREAM)
    return _SERVED[key]


@pytest.fixture(scope="module")
def eager() -> serving.Served:
    return served(RunnerSpec(capture_sizes=SIZES).eager())


def test_the_eager_runner_serves_the_stream_with_every_kernel_call_in_contract(eager: serving.Served) -> None:
    shape = stream_shape(eager.records)
    assert all(shape.values()), shape
    assert {r.runtime_mode for r in eager.records if r.scheduled} == {"NONE"}
    kernels = set(eager.log.kernels())
    assert {"npu_rms_norm", "npu_add_rms_norm", "npu_swiglu", "npu_mrope", "npu_scatter_pa_kv_cache",
            "npu_fused_infer_attention_score"} <= kernels, kernels
    assert eager.log.violations() == []
    generated = serving.tokens(eager.records)
    assert {a.request_id: len(generated[a.request_id]) for a in STREAM} == {a.request_id: a.max_tokens for a in STREAM}


# --------------------------------------------------------------------------- KV caches as the runner lays them out
def test_the_kernels_write_and_read_the_kv_caches_the_runner_allocated_and_reshaped(eager: serving.Served) -> None:
    # NPUModelRunner.initialize_kv_cache_tensors (model_runner_v1.py:3692-3736): raw int8 buffers
    # per layer, K and V apart (_allocate_kv_cache_tensors, 3863-4069: "split kvcache tensor into
    # k_cache and v cache"), viewed as [blocks, block_size, kv_heads, head_dim] bf16
    # (_reshape_kv_cache_tensors, 4104-4448), bound to the attention layers. The attention
    # kernels must get exactly those tensors: the KV write and the attention read them in place.
    caches, log = eager.worker.runner.kv_caches, eager.log
    assert len(caches) == 2 and all(isinstance(cache, tuple) and len(cache) == 2 for cache in caches)
    for key, value in caches:
        assert key.device.type == "npu" and key.dtype == torch.bfloat16 and key.is_contiguous()
        assert tuple(key.shape) == (serving.RunnerSpec().num_blocks, serving.BLOCK_SIZE, 2, 128)
        assert key.untyped_storage().data_ptr() != value.untyped_storage().data_ptr()  # two buffers
    runner_keys = {key.data_ptr() for key, _ in caches}
    # the kernels' runs (on host aliases of device memory); the contract check also sees fake runs' meta tensors
    calls = [(name, args) for name, args in log.calls
             if next(v for v in args.values() if isinstance(v, torch.Tensor)).device.type != "meta"]
    written = {args["key_cache"].data_ptr() for name, args in calls if name == "npu_scatter_pa_kv_cache"}
    read = {args["key"].data_ptr() for name, args in calls if name == "npu_fused_infer_attention_score"
            and args["block_table"] is not None}
    assert written == runner_keys and read == runner_keys


def test_key_and_value_views_interleaved_in_one_page_are_refused_by_the_kernels_contiguity_rules() -> None:
    # NPUModelRunner._adjust_kv_layout (model_runner_v1.py:4071-4101), the runner's own code for
    # caches that share one page per block (its compressed-attention path, 4134-4182): each
    # view's block stride is the whole page, so K and V are non-contiguous views of one buffer.
    # The kernels take contiguous caches only (npu_scatter_pa_kv_cache: _op_plugin_docs.py:7030;
    # FIA: 8066-8071), so the contract table refuses those views where a contiguous cache of the
    # same shape passes.
    runner_class = serving.model_runner_class()
    serving.fresh_npu()
    blocks, block_size, heads, dim = 4, 128, 2, 128
    shape = [blocks, block_size, heads, dim]
    page_bytes = 2 * block_size * heads * dim * 2  # K and V of one block, bf16
    raw = torch.zeros(blocks * page_bytes, dtype=torch.int8, device="npu")
    key_cache, value_cache = runner_class._adjust_kv_layout(None, raw, [shape, shape],
                                                              [torch.bfloat16, torch.bfloat16], page_bytes)
    assert not key_cache.is_contiguous() and not value_cache.is_contiguous()
    assert value_cache.data_ptr() - key_cache.data_ptr() == page_bytes // 2  # V follows K inside the page
    import torch_npu
    from ascendgraph.errors import KernelContractError

    tokens = torch.randn(3, heads, dim).to(torch.bfloat16).to("npu")
    slots = torch.tensor([0, 1, 130], dtype=torch.int32, device="npu")
    with pytest.raises(KernelContractError, match="scatter_contiguous"):
        torch_npu.npu_scatter_pa_kv_cache(tokens, tokens, key_cache, value_cache, slots, cache_mode="Norm")
    contiguous_key = torch.zeros(shape, dtype=torch.bfloat16, device="npu")
    contiguous_value = torch.zeros(shape, dtype=torch.bfloat16, device="npu")
    torch_npu.npu_scatter_pa_kv_cache(tokens, tokens, contiguous_key, contiguous_value, slots, cache_mode="Norm")
    assert torch.equal(contiguous_key[1, 2].cpu(), tokens[2].cpu())
    from ascendgraph import kernel_contracts

    fia = dict(query=torch.zeros(3, 8, dim, dtype=torch.bfloat16), key=key_cache.view(blocks, block_size, -1),
               value=value_cache.view(blocks, block_size, -1), input_layout="TND", num_heads=8,
               num_key_value_heads=heads, block_table=torch.zeros(1, 4, dtype=torch.int32), block_size=block_size,
               actual_seq_lengths=[3], actual_seq_lengths_kv=[3], sparse_mode=3, scale=1.0)
    assert "kv_contiguous" in [rule.name for rule in kernel_contracts.violations("npu_fused_infer_attention_score", fia)]


# --------------------------------------------------------------------------- graph modes
@pytest.fixture(scope="module", params=list(GRAPH_RUNS))
def graph(request: pytest.FixtureRequest) -> serving.Served:
    return served(GRAPH_RUNS[request.param])


def test_graph_serving_equals_eager_step_by_step(graph: serving.Served, eager: serving.Served) -> None:
    from vllm.config import CUDAGraphMode

    # NPUModelRunner.capture_model captured each of vLLM's dispatch keys (the FULL graph of every
    # capture size; under FULL_AND_PIECEWISE each size's piecewise pieces too) before the engine
    # served; a graph first captured while serving is one capture_model left out.
    keys = graph.worker.runner.cudagraph_dispatcher.cudagraph_keys
    assert keys[CUDAGraphMode.FULL], "vLLM's dispatcher has no FULL keys"
    assert graph.graphs_before_serving >= len(keys[CUDAGraphMode.FULL]) + len(keys[CUDAGraphMode.PIECEWISE])
    assert graph.graphs_after_serving == graph.graphs_before_serving, "graphs captured while serving"
    # The same requests in every step (vLLM's scheduler sees the same outputs), the same tokens
    # and the same logits, bitwise: every step, whether vLLM's dispatcher replayed a graph,
    # padded the batch for one, or ran it eagerly.
    assert [r.scheduled for r in graph.records] == [r.scheduled for r in eager.records]
    for g, e in zip(graph.records, eager.records):
        assert g.sampled == e.sampled, f"step {g.index} ({g.runtime_mode}): {g.sampled} != {e.sampled}"
        if e.logits is not None:
            assert torch.equal(g.logits.cpu()[: e.logits.shape[0]], e.logits.cpu()), \
                f"step {g.index} ({g.runtime_mode}, {g.padded_tokens} tokens): logits differ"
    assert graph.log.violations() == []
    mode = graph.worker.spec.mode
    modes = {r.runtime_mode for r in graph.records if r.scheduled}
    assert "FULL" in modes
    assert ("PIECEWISE" in modes) == (mode == "FULL_AND_PIECEWISE")
    padded = [r for r in graph.records if r.runtime_mode == "FULL" and r.padded_tokens > sum(r.scheduled.values())]
    assert padded, "no FULL replay of a padded batch"
    if mode == "FULL":  # a mixed batch of max_num_seqs requests, padded: the FIA dummy request
        assert any(len(r.scheduled) == 4 and max(r.scheduled.values()) > 1 for r in padded)
    paged = "_npu_paged_attention" in graph.log.kernels()
    assert paged == ("pa_shape_list" in dict(graph.worker.spec.additional_config))


@pytest.mark.parametrize("mode", ["FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_async_scheduling_back_to_back_generates_what_eager_generates(mode: str, eager: serving.Served) -> None:
    # vLLM's AsyncScheduler and EngineCore.step_with_batch_queue: a step is scheduled and issued
    # before the previous one's output is awaited; the only waits are vLLM Ascend's own (the
    # runner's prepare_inputs_event, the synchronize before a FULL replay,
    # AsyncModelRunnerOutput.get_output). The simulated NPU runs behind the host.
    run = serving.serve(RunnerSpec(mode=mode, capture_sizes=SIZES, async_scheduling=True), STREAM)
    assert serving.tokens(run.records) == serving.tokens(eager.records)
    assert "FULL" in {r.runtime_mode for r in run.records if r.scheduled}
    assert run.log.violations() == []


# --------------------------------------------------------------------------- faults in the runner's path
# Four capture sizes (1, 2, 3, 4; FULL_DECODE_ONLY captures the largest first), so the fourth
# capture_begin is the last graph's.
FAULT_SPEC = RunnerSpec(mode="FULL_DECODE_ONLY", capture_sizes=(1, 2, 3, 4))
WRAPPED = "NPUModelRunner init failed, error is NPUModelRunner failed, error is "


def test_207008_at_the_fourth_capture_reads_vllm_ascends_stream_resource_text_twice_wrapped() -> None:
    # ACLGraphWrapper re-raises 207008 with its stream-resource advice (acl_graph.py:201-212);
    # capture_model's two context managers re-raise that as RuntimeError with their own prefixes
    # (model_runner_v1.py:4958-4962 "init failed" although this is the capture, 4988-4992).
    from sim import facade

    serving.fresh_npu(faults="capture_begin=3*off->raise(207008)")
    with pytest.raises(RuntimeError) as info:
        serving.Worker(FAULT_SPEC)
    assert str(info.value).startswith(WRAPPED + "ACL graph capture failed with a known stream-resource exhaustion")
    assert not facade.device().stats().extra["capturing"]  # no capture left open on the NPU


def test_an_oom_in_the_graph_pool_reaches_the_caller_as_a_plain_runtime_error(monkeypatch: Any) -> None:
    # Known finding (docs/vllm-ascend.md): the same wrappers turn torch.OutOfMemoryError into
    # RuntimeError (model_runner_v1.py:4962, 4992), so a caller that handles an OOM at capture
    # (torch.OutOfMemoryError) does not see one; only the text says so.
    from sim import facade
    NPUModelRunner = serving.model_runner_class()
    capture_model = NPUModelRunner.capture_model

    def capture_with_a_full_pool(self: Any) -> int:
        facade.device().set_fault_plan("malloc=raise(oom)")
        try:
            return capture_model(self)
        finally:
            facade.device().set_fault_plan(None)

    monkeypatch.setattr(NPUModelRunner, "capture_model", capture_with_a_full_pool)
    serving.fresh_npu()
    with pytest.raises(RuntimeError) as info:
        serving.Worker(FAULT_SPEC)
    assert not isinstance(info.value, torch.OutOfMemoryError)
    assert str(info.value).startswith(WRAPPED + "NPU out of memory. Tried to allocate")
    assert not facade.device().stats().extra["capturing"]


def test_a_device_lost_at_the_first_replay_propagates_out_of_execute_model_and_stays_lost() -> None:
    from ascendgraph.errors import DeviceLost
    from sim import facade

    serving.fresh_npu()
    worker = serving.Worker(FAULT_SPEC)
    facade.device().set_fault_plan("replay=raise(device_lost)")
    with pytest.raises(DeviceLost):
        worker.engine().serve(STREAM)
    facade.device().set_fault_plan(None)
    with pytest.raises(DeviceLost):
        torch.npu.synchronize()
    assert facade.device().stats().extra["device_lost"]


def test_a_skipped_task_update_is_named_stale_at_the_replay_that_runs_the_old_lengths() -> None:
    # task_update=skip_update: the update vLLM Ascend issues after a FULL replay
    # (update_full_graph_params, attention_v1.py:545-620) never reaches the device, and its event
    # record releases the replay with the captured lengths. A card computes that step's attention
    # silently wrong; the simulator names the replay, graph and task group, and vLLM Ascend's
    # execute_model passes the error up unchanged.
    from ascendgraph.errors import StaleGraphParams
    from sim import facade

    serving.fresh_npu()
    worker = serving.Worker(FAULT_SPEC)
    facade.device().set_fault_plan("task_update=skip_update")
    with pytest.raises(StaleGraphParams, match=r"replay 1 of graph#\d+ executed task group 0 "
                                               r"\(npu_facade\.npu_fused_infer_attention_score\.out\) without a task update"):
        worker.engine().serve(STREAM)
    facade.device().set_fault_plan(None)

