"""hw/ on the simulator's torch_npu facade (sim.facade): what a card would refuse, hw/ must
not do. Each test here failed on the facade before the hw/ fix it names (issue 15's hw
items), so the fixes are pinned by behaviour rather than by reading."""

from __future__ import annotations

import math
from typing import Any, Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ascendgraph import ops
from ascendgraph.errors import KernelContractError

BF16 = torch.bfloat16


@pytest.fixture
def npu() -> Iterator[Any]:
    from sim import facade

    facade.install(quiet=True)
    facade.configure()
    try:
        from hw.device import NpuDevice

        yield NpuDevice()
    finally:
        facade.uninstall()


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype).to("npu")


def attention_args(dtype: torch.dtype = BF16) -> dict[str, Any]:
    heads, kv_heads, head_dim, blocks, block_size = 4, 2, 16, 8, 128
    ends, lens = [1, 2, 3], [130, 1, 7]
    return dict(
        query=randn(3, heads, head_dim, seed=1, dtype=dtype),
        key_cache=randn(blocks, block_size, kv_heads, head_dim, seed=2, dtype=dtype),
        value_cache=randn(blocks, block_size, kv_heads, head_dim, seed=3, dtype=dtype),
        block_table=torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32, device="npu"),
        ends=ends, lens=lens, scale=1 / math.sqrt(head_dim),
    )


def call_attention(a: dict[str, Any], out: torch.Tensor, ends: Any = None, lens: Any = None) -> None:
    ops.paged_attention(a["query"], a["key_cache"], a["value_cache"], a["block_table"], ends or a["ends"],
                        lens or a["lens"], a["scale"], out)


def capture_attention(npu: Any, a: dict[str, Any], out: torch.Tensor) -> tuple[Any, Any, Any]:
    """The FULL-graph pattern: an ExternalEvent wait/reset, then attention in a task group."""
    graph = npu.new_graph()
    event = npu.new_external_event()
    with npu.graph(graph):
        stream = npu.current_stream()
        event.wait(stream)
        event.reset(stream)
        npu.task_group_begin(stream)
        call_attention(a, out)
        handle = npu.task_group_end(stream)
    return graph, handle, event


def recorded(graph: Any) -> list[Any]:
    return graph.graph.sim_graph.program.records


def test_workspace_and_softmax_lse_are_allocated_before_the_task_group(npu: Any) -> None:
    # torch_npu's handler contract: workspace and outputs are prepared before graph_task_group_begin.
    a = attention_args()
    out = torch.zeros_like(a["query"])
    graph, handle, _ = capture_attention(npu, a, out)
    names = [str(getattr(r, "func", "")) for r in recorded(graph)]
    in_group = [names[i] for i in handle.record_indices]
    assert in_group == ["npu_facade.npu_fused_infer_attention_score.out"], in_group


def test_capture_update_replay_equals_eager_with_new_lengths(npu: Any) -> None:
    a = attention_args()
    eager = torch.zeros_like(a["query"])
    call_attention(a, eager, ends=[1, 2, 3], lens=[9, 2, 5])
    out = torch.zeros_like(a["query"])
    graph, handle, event = capture_attention(npu, a, out)
    graph.replay()  # waits at the event until this replay's attention is updated
    update = npu.new_stream()
    with npu.stream(update):
        npu.task_update_begin(update, handle)
        call_attention(a, out, ends=[1, 2, 3], lens=[9, 2, 5])
        npu.task_update_end(update)
        event.record(update)
    npu.synchronize()
    torch.testing.assert_close(out, eager)


def test_a_kernel_failing_inside_a_task_group_closes_the_group_and_keeps_its_own_error(npu: Any) -> None:
    # float32 attention is refused by the contract pre-check inside a task group, with the fix; the
    # capture must end cleanly (group closed), so that error -- not "a task group was never
    # closed" -- surfaces.
    a = attention_args(torch.float32)
    default = npu.current_stream()
    graph = npu.new_graph()
    with pytest.raises(KernelContractError, match="--dtype bfloat16"):
        with npu.graph(graph):
            stream = npu.current_stream()
            npu.task_group_begin(stream)
            call_attention(a, torch.zeros_like(a["query"]))
    assert npu.current_stream() == default
    assert not npu.is_current_stream_capturing()
    x = torch.ones(4, device="npu")
    with npu.graph(graph):  # the same graph captures again
        x.mul_(2)


def test_a_failed_capture_end_restores_the_previous_stream(npu: Any) -> None:
    from sim import facade

    facade.device().set_fault_plan("capture_end=raise(207005)")
    default = npu.current_stream()
    graph = npu.new_graph()
    with pytest.raises(RuntimeError):
        with npu.graph(graph):
            torch.ones(2, device="npu").add_(1)
    assert npu.current_stream() == default


def test_a_contract_violation_is_a_hard_error_before_the_kernel_not_a_fallback(npu: Any) -> None:
    # Four block-table rows for three requests: the card refuses it (one row per request).
    a = attention_args()
    a["block_table"] = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7]], dtype=torch.int32, device="npu")
    npu.router.fallbacks.clear()
    graph = npu.new_graph()
    with pytest.raises(Exception, match="block_table|block table"):
        with npu.graph(graph):
            stream = npu.current_stream()
            npu.task_group_begin(stream)
            call_attention(a, torch.zeros_like(a["query"]))
            npu.task_group_end(stream)
    assert "paged_attention" not in npu.router.fallbacks


class _Calls(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple, dict]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[override]
        kwargs = kwargs or {}
        self.calls.append((func, args, kwargs))
        impl = ops.wrapper_impl(func)  # on the facade the ascendgraph ops are hw's router
        if impl is not None:
            with self:
                return impl(*args, **kwargs)
        return func(*args, **kwargs)


def facade_calls(fn: Any) -> list[tuple[Any, tuple, dict]]:
    with _Calls() as mode:
        fn()
    return [c for c in mode.calls if str(c[0]).startswith("npu_facade.")]


def test_add_rms_norm_dynamic_quant_asks_for_the_first_output_only(npu: Any) -> None:
    # vLLM Ascend (AddRMSNormDynamicQuant users): output_mask=[True, False] without smooth scales.
    x, r, w = randn(4, 64), randn(4, 64, seed=1), randn(64, seed=2)
    calls = facade_calls(lambda: ops.add_rms_norm_dynamic_quant(x, r, w, 1e-6))
    assert [list(c[2]["output_mask"]) for c in calls] == [[True, False]]


@pytest.mark.parametrize("op", ["quantize", "add_rms_norm_quant"])
def test_per_tensor_scales_reach_the_kernel_contiguous(npu: Any, op: str) -> None:
    x, r, w = randn(4, 64), randn(4, 64, seed=1), randn(64, seed=2)
    scale, offset = torch.tensor([0.02], device="npu"), torch.tensor([1], dtype=torch.int32, device="npu")
    if op == "quantize":
        calls = facade_calls(lambda: ops.quantize(x, scale, offset))
        tensors = calls[0][1][1:3]
    else:
        calls = facade_calls(lambda: ops.add_rms_norm_quant(x, r, w, scale, offset, 1e-6))
        tensors = calls[0][1][3:5]
    assert calls and all(t.is_contiguous() for t in tensors), [t.stride() for t in tensors]


def test_the_causal_mask_is_built_on_the_host_and_copied() -> None:
    from hw.kernels import causal_mask

    with _Calls() as mode:
        mask = causal_mask(torch.device("meta"))
    triu = [args for func, args, _ in mode.calls if "triu" in str(func)]
    assert mask.device.type == "meta" and triu and all(a[0].device.type == "cpu" for a in triu)


def test_a_slot_mapping_converted_inside_the_graph_is_read_at_replay_not_frozen_at_capture(npu: Any) -> None:
    # The KV write reads the slots at replay, not their capture-time values (found on the facade:
    # the simulator used to run hw's int64 -> int32 conversion, the 310P path, at capture).
    k, v = randn(2, 2, 16), randn(2, 2, 16, seed=1)
    key_cache = torch.zeros(4, 128, 2, 16, dtype=BF16, device="npu")
    value_cache = torch.zeros(4, 128, 2, 16, dtype=BF16, device="npu")
    slots = torch.tensor([-1, -1], device="npu")
    graph = npu.new_graph()
    with npu.graph(graph):
        ops.reshape_and_cache(k, v, key_cache, value_cache, slots)
    slots.copy_(torch.tensor([5, 130], device="npu"))
    graph.replay()
    npu.synchronize()
    torch.testing.assert_close(key_cache.view(-1, 2, 16)[[5, 130]], k)


def test_a_full_capture_runs_inside_the_super_kernel_scope(npu: Any) -> None:
    # The core opens device.super_kernel_scope("full_model") around FULL captures when super
    # kernel is on (vLLM Ascend's graph wrapper); on npu that is torch_npu's scope begin/end.
    # Super kernel exists on Atlas A3 only: the facade plays an A3 here.
    from ascendgraph.compile.super_kernel import SUPER_KERNEL_SCOPE
    from hw.device import NpuDevice
    from sim import facade

    facade.configure(profile="A3")
    npu = NpuDevice()
    assert npu.profile.name == "A3" and npu.profile.supports_super_kernel
    graph = npu.new_graph()
    x = torch.ones(4, dtype=BF16, device="npu")
    with npu.graph(graph), npu.super_kernel_scope(SUPER_KERNEL_SCOPE):
        x.mul_(2)
    assert graph.graph.sim_graph.super_kernel_scopes == (SUPER_KERNEL_SCOPE,)


def test_super_kernel_is_refused_on_a2_by_hw_before_torch_npu_and_by_the_facade(npu: Any) -> None:
    # CANN's aclskScopeBegin / aclskOptimize (what torch_npu 2.13 calls) are Atlas A3 only;
    # hw.soc said A2 supports super kernel, so a 910B would fail inside the capture.
    import torch_npu

    assert npu.profile.name == "A2" and not npu.profile.supports_super_kernel
    with pytest.raises(RuntimeError, match="super kernel is not supported on Ascend910B3"):
        with npu.super_kernel_scope("full_model"):
            pass
    with pytest.raises(RuntimeError, match="aclskScopeBegin"):  # the facade itself, as a card
        torch_npu.npu.super_kernel_scope_begin("full_model")
    graph = npu.new_graph()
    with npu.graph(graph):
        torch.ones(2, dtype=BF16, device="npu").mul_(2)
    with pytest.raises(RuntimeError, match="Atlas A3 products only"):
        npu.super_kernel_optimize(graph, {"dcci_after_kernel_end": [".*"]})
    with pytest.raises(RuntimeError, match="aclskOptimize"):
        graph.graph.super_kernel_optimize({"dcci_after_kernel_end": [".*"]})


def test_capture_end_checks_the_stream_first_as_the_real_npugraph(npu: Any) -> None:
    # c10_npu::NPUGraph remembers the current stream at construction; capture_end compares
    # the current stream with it before anything else (lib/libtorch_npu.so,
    # NPUGraph::capture_end), so on another stream even an uncaptured graph reads "same stream".
    import torch_npu

    graph = torch_npu.npu.NPUGraph()
    with torch_npu.npu.stream(torch_npu.npu.Stream()):
        with pytest.raises(RuntimeError, match="Capture must end on the same stream it began on"):
            graph.capture_end()
    with pytest.raises(RuntimeError, match=r"capture_end\(\) called before capture_begin\(\)"):
        graph.capture_end()  # on the stream current at construction: the state check


def test_every_kernel_fallback_is_in_the_report_and_none_is_captured(npu: Any, capsys: pytest.CaptureFixture[str]) -> None:
    # A kernel whose library failed to load (NNAL missing) makes the router fall back; the run
    # report says so in its JSON (kernel_fallbacks) and as a warning, and a graph mode refuses
    # to capture the fallback (before: one bare stderr line and "warnings: []").
    import json

    from ascendgraph.cli import app as cli
    from hw import api

    npu.router.fallbacks.clear()
    npu.router._broken[api.NPU_RMS_NORM] = "torch_npu.npu_rms_norm failed to load (OSError: nnal)"
    try:
        code = cli.main(["run", "--device", "npu", "--num-layers", "1", "--requests", "2", "--json", "--dtype", "bfloat16",
                         "--compilation-config", json.dumps({"cudagraph_mode": "NONE"})])
        report = json.loads(capsys.readouterr().out)
        assert code == 0, report["error"]
        assert "rms_norm" in report["kernel_fallbacks"] and "nnal" in report["kernel_fallbacks"]["rms_norm"]
        assert any("kernel fallback: ascendgraph::rms_norm" in w for w in report["warnings"])
        code = cli.main(["run", "--device", "npu", "--num-layers", "1", "--requests", "2", "--json", "--dtype", "bfloat16",
                         "--compilation-config", json.dumps({"cudagraph_mode": "PIECEWISE",
                                                             "cudagraph_capture_sizes": [1, 2]})])
        report = json.loads(capsys.readouterr().out)
        assert code != 0 and "fallback inside an ACL graph capture" in report["error"]["message"]
    finally:
        npu.router._broken.pop(api.NPU_RMS_NORM, None)
        npu.router.fallbacks.clear()


def test_full_graphs_share_one_workspace_per_capture_size_held_weakly_after_capture(npu: Any) -> None:
    # vLLM Ascend keeps ONE FIA workspace per capture size, shared by every layer
    # (attention_v1.py@182b75ea full_graph_fia: graph_params.workspaces.get(num_tokens)) and
    # weak-references it once the capture ended (compilation/acl_graph.py weak_ref_workspaces):
    # the graph's pool keeps the memory. Before: one strongly held workspace per layer per size.
    from ascendgraph.config import GraphConfig
    from ascendgraph.runtime.engine import Engine, EngineOptions
    from sim import npu_device

    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]},
        model="tiny", num_layers=3, max_num_seqs=4, max_num_batched_tokens=8,
    )
    engine = Engine(config, EngineOptions(device=npu, requests=4, progress=False))
    try:
        engine.capture()
        params = engine.graph_params
        sizes = sorted({descriptor.num_tokens for descriptor in params.descriptors})
        assert sizes == [1, 2, 4]
        per_size: dict[int, set[int]] = {}
        for descriptor in params.descriptors:
            records = params.records(descriptor)
            assert len(records) == 3  # one attention call per layer
            per_size[descriptor.num_tokens] = {record.call.workspace.data_ptr() for record in records}
        assert all(len(pointers) == 1 for pointers in per_size.values()), per_size  # before: 3 per size
        assert len(set().union(*per_size.values())) == len(sizes)
        for descriptor in params.descriptors:
            for record in params.records(descriptor):  # held weakly: torch_npu._C._weak_ref_tensor's alias
                workspace = record.call.workspace
                assert type(workspace) is torch.Tensor and workspace.device.type == "npu"
                assert npu_device.extension().weak_token(workspace) >= 0
        engine.serve()  # every update re-issues attention with the weakly held workspace
        report = engine.report()
        assert report.error is None and report.requests_failed == 0
        assert report.batches_by_mode.get("FULL", 0) > 0
    finally:
        engine.close()


@pytest.mark.parametrize("soc, kernel", [("A2", "npu_scatter_pa_kv_cache"), ("A3", "npu_scatter_pa_kv_cache"),
                                         ("310P", "_npu_reshape_and_cache")])
def test_the_kv_write_is_npu_scatter_pa_kv_cache_on_a2_and_a3_and_the_atb_kernel_on_310p(
    npu: Any, soc: str, kernel: str
) -> None:
    # vLLM Ascend's BaseDeviceAdaptor.reshape_and_cache (device_op.py@182b75ea) writes the KV
    # cache with npu_scatter_pa_kv_cache(cache_mode="Norm"); only the 310P adaptor uses the ATB
    # _npu_reshape_and_cache. hw used the ATB kernel everywhere.
    from hw.device import NpuDevice

    device = NpuDevice(soc=soc)
    k, v = randn(3, 2, 16), randn(3, 2, 16, seed=1)
    key_cache = torch.zeros(4, 128, 2, 16, dtype=BF16, device="npu")
    value_cache = torch.zeros(4, 128, 2, 16, dtype=BF16, device="npu")
    slots = torch.tensor([5, 130, 7], device="npu")
    calls = facade_calls(lambda: ops.reshape_and_cache(k, v, key_cache, value_cache, slots))
    assert [str(c[0]).split(".")[1] for c in calls] == [kernel]
    if kernel == "npu_scatter_pa_kv_cache":
        assert calls[0][2]["cache_mode"] == "Norm"
    torch.testing.assert_close(key_cache.view(-1, 2, 16)[slots], k, rtol=0, atol=0)
    torch.testing.assert_close(value_cache.view(-1, 2, 16)[slots], v, rtol=0, atol=0)
    assert "reshape_and_cache" not in device.router.fallbacks


def test_a_non_int32_block_table_reaches_the_replay_through_the_task_update(npu: Any) -> None:
    # hw casts a non-int32 block table into one static int32 copy. Captured outside the task
    # group, the cast ran at replay after the update (the graph waits on the update's
    # ExternalEvent first) and copied the capture-time table over the update's, so the attention
    # silently read the capture's block table (docs/hw.md "Suspected card failures").
    a = attention_args()
    a["block_table"] = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int64, device="npu")
    out = torch.zeros_like(a["query"])
    graph, handle, event = capture_attention(npu, a, out)
    step_table = torch.tensor([[6, 7], [2, 3], [4, 5]], dtype=torch.int64, device="npu")  # the step's, not the captured tensor
    eager = torch.zeros_like(a["query"])
    call_attention({**a, "block_table": step_table}, eager)
    graph.replay()
    update = npu.new_stream()
    with npu.stream(update):
        npu.task_update_begin(update, handle)
        call_attention({**a, "block_table": step_table}, out)
        npu.task_update_end(update)
        event.record(update)
    npu.synchronize()
    torch.testing.assert_close(out, eager, atol=0, rtol=0)


def test_a_capture_refused_at_capture_begin_needs_no_reset_to_capture_again(npu: Any) -> None:
    # NPUGraph::capture_begin refuses before the graph owns anything (207008 comes from
    # aclmdlRICaptureBegin, after which nothing is held), and NPUGraph::reset only acts after a
    # successful capture_end: hw has nothing to reset on that path, and the same graph object
    # captures once streams are free again (docs/hw.md "Suspected card failures").
    from sim import facade

    facade.device().set_fault_plan("capture_begin=1*raise(207008)->off")
    default = npu.current_stream()
    graph = npu.new_graph()
    with pytest.raises(RuntimeError, match="207008"):
        with npu.graph(graph):
            pass
    assert npu.current_stream() == default and not npu.is_current_stream_capturing()
    x = torch.ones(4)
    with npu.graph(graph):
        x.mul_(2)
    graph.replay()
    npu.synchronize()
    assert torch.equal(x, torch.full((4,), 2.0))  # captured, not run; the replay ran it
