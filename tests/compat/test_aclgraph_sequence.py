"""The ACL-graph call sequence vLLM Ascend uses, written only against torch_npu's public
API (vllm_ascend/compilation/acl_graph.py @ f575cbb3: ACLGraphWrapper.__call__,
full_graph_attention, update_graph_params): capture per size into one shared pool with an
ExternalEvent wait/reset and a task group around the fused attention, replay, update on
a second stream with new host sequence lengths, record, synchronize. Runs on the facade
and, unchanged, on an Ascend node. The 207008 / old-HDK capture failures are injected on
the facade only (a card cannot be made to run out of streams on demand)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

torch_npu = pytest.importorskip("torch_npu")
DEVICE = "npu"  # torch_npu's device, and the facade's (its simulated NPU)
ON_FACADE = bool(getattr(torch_npu, "__ascendgraph_facade__", False))  # fault injection exists there only
HEADS, KV_HEADS, HEAD_DIM, BLOCKS, BLOCK_SIZE = 8, 2, 128, 16, 128
REPO = Path(__file__).resolve().parents[2]


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(DEVICE)


class Layer:
    """One attention layer's static tensors (the KV cache is shared by all sizes)."""

    def __init__(self, seed: int) -> None:
        self.key = randn(BLOCKS, BLOCK_SIZE, KV_HEADS * HEAD_DIM, seed=seed)
        self.value = randn(BLOCKS, BLOCK_SIZE, KV_HEADS * HEAD_DIM, seed=seed + 1)
        self.mask = torch.triu(torch.ones(2048, 2048, dtype=torch.bool), diagonal=1).to(DEVICE)

    def kwargs(self, table: torch.Tensor, ends: list[int], lens: list[int]) -> dict[str, Any]:
        return dict(atten_mask=self.mask, actual_seq_lengths=ends, actual_seq_lengths_kv=lens, block_table=table,
                    num_heads=HEADS, scale=1 / math.sqrt(HEAD_DIM), input_layout="TND",
                    num_key_value_heads=KV_HEADS, sparse_mode=3, block_size=BLOCK_SIZE)


class SizeGraph:
    """What ACLGraphWrapper keeps per captured size: the graph, its static input and output,
    per layer the task-group handle and ExternalEvent, and ONE workspace for all layers,
    queried inside the capture before the first task group and weak-referenced once the
    capture ended (vllm_ascend/attention/attention_v1.py@182b75ea full_graph_fia:
    ``graph_params.workspaces.get(num_tokens)``; compilation/acl_graph.py
    ``weak_ref_workspaces``): the graph's private pool keeps its memory."""

    def __init__(self, size: int, layers: list[Layer], pool: Any) -> None:
        self.size = size
        self.query = randn(size, HEADS, HEAD_DIM, seed=100 + size)
        self.table = (torch.arange(size * 2, dtype=torch.int32).view(size, 2) % BLOCKS).to(DEVICE)
        self.outputs = [torch.empty_like(self.query) for _ in layers]
        self.lse = torch.empty(1, dtype=self.query.dtype, device=self.query.device)
        ends, lens = list(range(1, size + 1)), [1] * size  # capture-time lengths (a dummy batch)
        self.handles: list[Any] = []
        self.events: list[Any] = []
        self.graph = torch.npu.NPUGraph()
        workspace = None
        with torch.npu.graph(self.graph, pool=pool):
            for layer, output in zip(layers, self.outputs):
                if workspace is None:  # the first layer of this size queries it, the others reuse it
                    workspace = torch_npu._npu_fused_infer_attention_score_get_max_workspace(
                        self.query, layer.key, layer.value, **layer.kwargs(self.table, ends, lens))
                stream = torch_npu.npu.current_stream()
                event = torch.npu.ExternalEvent()
                event.wait(stream)
                event.reset(stream)
                torch.npu.graph_task_group_begin(stream)
                torch_npu.npu_fused_infer_attention_score.out(
                    self.query, layer.key, layer.value, **layer.kwargs(self.table, ends, lens),
                    workspace=workspace, out=[output, self.lse])
                self.handles.append(torch.npu.graph_task_group_end(stream))
                self.events.append(event)
        self.workspace = torch_npu._C._weak_ref_tensor(workspace)  # the graph's pool holds the memory
        del workspace

    def replay_with(self, layers: list[Layer], update_stream: Any, lens: list[int]) -> None:
        """Replay, then update every layer's attention with this batch's lengths (vLLM's order)."""
        self.graph.replay()
        ends = list(range(1, self.size + 1))
        with torch.npu.stream(update_stream):
            for layer, handle, event, output in zip(layers, self.handles, self.events, self.outputs):
                torch.npu.graph_task_update_begin(update_stream, handle)
                torch_npu.npu_fused_infer_attention_score.out(
                    self.query, layer.key, layer.value, **layer.kwargs(self.table, ends, lens),
                    workspace=self.workspace, out=[output, self.lse])
                torch.npu.graph_task_update_end(update_stream)
                event.record(update_stream)


def eager(layer: Layer, graph: SizeGraph, lens: list[int]) -> torch.Tensor:
    out, _ = torch_npu.npu_fused_infer_attention_score(
        graph.query, layer.key, layer.value, **layer.kwargs(graph.table, list(range(1, graph.size + 1)), lens))
    return out


@pytest.fixture
def layers() -> list[Layer]:
    return [Layer(seed=10 * i) for i in range(2)]


def test_sizes_captured_into_one_pool_replay_and_update_to_the_eager_result(layers: list[Layer]) -> None:
    pool = torch.npu.graph_pool_handle()
    graphs = {size: SizeGraph(size, layers, pool) for size in (4, 2, 1)}  # largest first, as vLLM
    update_stream = torch_npu.npu.Stream()
    for step, lens in enumerate(([130, 5, 200, 17], [131, 6, 201, 18])):
        graph = graphs[4]
        graph.replay_with(layers, update_stream, lens)
        torch.npu.synchronize()
        for layer, output in zip(layers, graph.outputs):
            torch.testing.assert_close(output, eager(layer, graph, lens), atol=0, rtol=0)
    small = graphs[2]
    small.replay_with(layers, update_stream, [3, 9])
    torch.npu.synchronize()
    torch.testing.assert_close(small.outputs[1], eager(layers[1], small, [3, 9]), atol=0, rtol=0)


def test_stream_state_and_capture_flags_follow_torch_npu(layers: list[Layer]) -> None:
    default = torch_npu.npu.current_stream()
    assert not torch.npu.is_current_stream_capturing()
    graph = torch.npu.NPUGraph()
    with torch.npu.graph(graph):
        assert torch.npu.is_current_stream_capturing()
        assert torch_npu.npu.current_stream() != default
    assert torch_npu.npu.current_stream() == default
    with pytest.raises(RuntimeError):
        graph.capture_begin()  # a captured NPUGraph cannot capture again


def test_a_shadowed_empty_cache_is_what_torch_npu_graph_calls(layers: list[Layer]) -> None:
    from unittest import mock

    calls = []
    with mock.patch("torch.npu.empty_cache", lambda: calls.append(1)):  # vLLM Ascend's gc_disable path
        graph = torch.npu.NPUGraph()
        with torch.npu.graph(graph):
            torch.ones(2, device=DEVICE).mul_(2)
    assert calls == [1]


@pytest.mark.skipif(not ON_FACADE, reason="the stream budget is set on the facade only")
@pytest.mark.parametrize("profile,text", [("A2", "Stream resources are insufficient"),
                                          ("A2-old-hdk", "Alloc sq cq fail")])
def test_stream_exhaustion_at_capture_begin_reads_as_the_stack_says(profile: str, text: str) -> None:
    # The texts the core rewrites (207008 on a current HDK, SqCq on an old one): a budget of
    # one stream, a second capture.
    from sim import facade

    with facade.configured(profile=profile, stream_limit=1):  # the process-wide NPU is given back after
        kept = torch.npu.NPUGraph()
        with torch.npu.graph(kept):
            torch.ones(2, device=DEVICE).mul_(2)
        default = torch_npu.npu.current_stream()
        graph = torch.npu.NPUGraph()
        with pytest.raises(RuntimeError, match=text):
            with torch.npu.graph(graph):
                pass
        # torch_npu's rough edge: capture_begin failed after the switch, so the capture stream stays current.
        assert torch_npu.npu.current_stream() != default


def _run_demo(*args: str) -> subprocess.CompletedProcess:
    """scripts/facade_demo.py in a process of its own (through the facade here): a refused
    capture leaves torch_npu's state behind (the capture stream stays current when
    capture_end raises; an open task group; a replay waiting on its event), which must not
    reach the rest of this pytest process."""
    script = str(REPO / "scripts" / "facade_demo.py")
    prefix = [sys.executable, "-m", "sim.facade", "--"] if ON_FACADE else []
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run(prefix + [sys.executable, script, *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_the_demo_script_matches_eager_in_its_own_process() -> None:
    done = _run_demo()
    assert done.returncode == 0 and "max |diff| = 0.0" in done.stdout, done.stdout + done.stderr
    if ON_FACADE:
        assert done.stderr.count("sim.facade: torch_npu is the ascendgraph simulator facade") == 1, done.stderr


@pytest.mark.parametrize("violation,text", [("padded-query", "actual_seq_lengths"), ("open-group", "never closed")])
def test_the_demo_script_refuses_what_a_card_refuses(violation: str, text: str) -> None:
    done = _run_demo("--violate", violation)
    assert done.returncode == 1 and "refused:" in done.stderr, done.stdout + done.stderr
    if ON_FACADE:  # a card's texts (CANN tiling, ACL 107033) are not the simulator's
        assert text in done.stderr, done.stderr


@pytest.mark.simulator_strictness  # a card accepts an allocation inside a task group (docs/facade.md)
def test_the_facade_refuses_an_allocation_in_a_task_group_as_declared_strictness() -> None:
    done = _run_demo("--violate", "alloc-in-group")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "simulator strictness" in done.stderr and "dangling address" in done.stderr, done.stderr
