"""What only the npu device does beyond the conformance suite: its profile from the
hardware, feature detection, weak references, the stream estimate, the core's
empty_cache stub honoured inside torch.npu.graph, and torch_npu profiling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from ascendgraph.config import SOCS
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget

pytestmark = pytest.mark.npu


def test_the_profile_names_a_known_generation_and_the_stack_versions(npu_device: Any) -> None:
    profile = npu_device.profile
    assert profile.name in SOCS and profile.soc.startswith("Ascend")
    assert profile.memory_bytes > 0 and profile.cann_version != ""


def test_torch_npu_2_13_has_every_detected_feature(npu_device: Any) -> None:
    assert all(npu_device.features.values()), npu_device.features


def test_weak_ref_aliases_without_copying(npu_device: Any) -> None:
    x = torch.arange(8.0, device=npu_device.torch_device)
    alias = npu_device.weak_ref(x)
    assert alias.data_ptr() == x.data_ptr()
    x.add_(1)
    torch.testing.assert_close(alias.cpu(), torch.arange(1.0, 9.0))


def test_stream_estimate_follows_the_plan(npu_device: Any) -> None:
    plan = plan_stream_budget(num_hidden_layers=2, capture_sizes=[1, 2], mode=GraphMode.FULL_AND_PIECEWISE)
    npu_device.set_stream_plan(plan)
    x = torch.ones(4, device=npu_device.torch_device)
    start = npu_device.stats().streams_in_use
    graph = npu_device.new_graph()
    with npu_device.graph(graph, graph_kind="piecewise"):
        x + 1
    assert npu_device.stats().streams_in_use == start + plan.streams_per_piecewise_graph
    graph.reset()
    assert npu_device.stats().streams_in_use == start


def test_a_stubbed_empty_cache_is_honoured_inside_torch_npu_graph(npu_device: Any) -> None:
    calls = []
    npu_device.empty_cache = lambda: calls.append(1)  # what the core's GraphWrapper does (docs/semantics.md §6)
    try:
        x = torch.ones(4, device=npu_device.torch_device)
        for _ in range(3):
            graph = npu_device.new_graph()
            with npu_device.graph(graph):
                x * 2
            graph.reset()
    finally:
        del npu_device.empty_cache
    assert len(calls) == 3


def test_super_kernel_optimize_runs_on_a_captured_graph(npu_device: Any) -> None:
    if not npu_device.profile.supports_super_kernel:
        pytest.skip(f"super kernel is Atlas A3 only (CANN's aclsk API); this is {npu_device.device_name}")
    x = torch.ones(64, device=npu_device.torch_device, dtype=torch.bfloat16)
    graph = npu_device.new_graph()
    with npu_device.graph(graph):
        y = (x * 2 + 1) * 3
    npu_device.super_kernel_optimize(graph, {"dcci_after_kernel_end": [".*"]})
    graph.replay()
    npu_device.synchronize()
    torch.testing.assert_close(y.cpu(), torch.full((64,), 9.0, dtype=torch.bfloat16))


def test_super_kernel_is_refused_before_torch_npu_off_atlas_a3(npu_device: Any) -> None:
    # torch_npu's super kernel calls aclskScopeBegin / aclskOptimize (Atlas A3 only): on an
    # A2 hw refuses it with its own text before a capture could fail on the card.
    if npu_device.profile.supports_super_kernel:
        pytest.skip(f"{npu_device.device_name} supports super kernel")
    with pytest.raises(RuntimeError, match="Atlas A3 products only"):
        with npu_device.super_kernel_scope("full_model"):
            pass


def test_weak_ref_does_not_keep_the_storage_alive(npu_device: Any) -> None:
    # torch_npu's _weak_ref_tensor owns nothing: the last owner gone, the memory is the
    # allocator's again (on the facade the weak tensor reports it; a card gives no signal, so
    # only the allocator's count is checked there).
    before = torch.npu.memory_allocated()
    x = torch.ones(1 << 20, device=npu_device.torch_device)
    alias = npu_device.weak_ref(x)
    del x
    if hasattr(alias, "alive"):
        assert not alias.alive
    else:
        assert torch.npu.memory_allocated() == before


def test_profiling_writes_op_statistic_and_kernel_details(npu_device: Any, tmp_path: Path) -> None:
    x = torch.ones(64, 64, device=npu_device.torch_device)
    graph = npu_device.new_graph()
    with npu_device.graph(graph):
        (x @ x).relu()
    with npu_device.profiling(str(tmp_path)) as session:
        for _ in range(2):
            graph.replay()
            session.step()
        npu_device.synchronize()
    assert session.op_statistic is not None and session.kernel_details is not None, session.summary()
    header = session.op_statistic.read_text().splitlines()[0]
    assert "OP Type" in header and "Count" in header


def test_the_benchmarks_first_facade_test_passes() -> None:
    """bench's facade row times FACADE_TEST as a user's first test: it must pass where it is timed
    (a failing test would be timed as "failed", and a card would fail it too)."""
    from bench.__main__ import FACADE_TEST

    namespace: dict[str, Any] = {}
    exec(compile(FACADE_TEST, "FACADE_TEST", "exec"), namespace)
    namespace["test_one_capture_and_replay"]()
