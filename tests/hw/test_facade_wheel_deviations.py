"""The facade against the torch-npu 2.13.0 wheel: the deviations issue 33's review found, each
removed or declared (docs/facade.md, "Deviations from torch_npu")."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest
import torch

ERROR_CODE = r"\n\[ERROR\] \d{{4}}-\d\d-\d\d-\d\d:\d\d:\d\d \(PID:\d+, Device:0, RankID:-1\) ERR000{code:02d} PTA {meaning}$"


def test_a_stream_rebuilt_from_its_id_triple_is_the_same_stream(torch_npu: Any) -> None:
    # torch_npu's current_stream / default_stream rebuild the object from _npu_getCurrentStream's
    # triple (torch_npu/npu/utils.py:275, 290); set_stream passes the same three.
    npu = torch_npu.npu
    side = npu.Stream()
    again = npu.Stream(stream_id=side.stream_id, device_index=side.device_index, device_type=side.device_type)
    assert again == side and again != npu.default_stream()
    npu.set_stream(again)
    assert npu.current_stream() == side
    with pytest.raises(RuntimeError, match="no stream with stream_id=999"):
        npu.Stream(stream_id=999, device_index=0, device_type=20)


def test_a_stream_has_a_device_and_torch_npu_device_selects_one(torch_npu: Any) -> None:
    npu = torch_npu.npu
    stream = npu.Stream()
    assert stream.device == torch.device(torch._C._get_privateuse1_backend_name(), 0)
    with npu.device(0):
        assert npu.current_device() == 0
    with npu.device(None):  # a no-op, as torch_npu's
        assert npu.current_device() == 0
    with pytest.raises(AssertionError, match="^Invalid device id"):
        npu.device(1)


def test_timing_events_measure_the_simulators_virtual_clock(torch_npu: Any) -> None:
    from sim import facade

    npu = torch_npu.npu
    x = torch.randn(64, 64)
    graph = npu.NPUGraph()
    with npu.graph(graph):
        y = x @ x
    start, end = npu.Event(enable_timing=True), npu.Event(enable_timing=True)
    start.record()
    before = max(facade.device().clock())
    graph.replay()
    graph.replay()
    end.record()
    after = max(facade.device().clock())
    assert math.isclose(start.elapsed_time(end), (after - before) / 1000.0) and start.elapsed_time(end) > 0
    with pytest.raises(RuntimeError, match="^Both events must be recorded before calculating elapsed time.$"):
        start.elapsed_time(npu.Event(enable_timing=True))
    untimed = npu.Event()
    untimed.record()
    with pytest.raises(RuntimeError, match="enable_timing=True"):
        start.elapsed_time(untimed)
    del y


@pytest.mark.parametrize("options,text", [
    ({"preload_code": "1"}, "optimize_options param['preload_code'] must be int, got str"),
    ({"dcci_before_kernel_start": ["a", 2]}, "optimize_options['dcci_before_kernel_start'][1] must be str, got int"),
    ({"aggressive_opt_strategies": {"task_breaker_bypass": 1.0}},
     "optimize_options['aggressive_opt_strategies']['task_breaker_bypass'] must be int, got float"),
    ({"aggressive_opt_strategies": {"other": 1}}, "Invalid sub_key 'other' in optimize_options['aggressive_opt_strategies']."),
    ({"opt_extend": 3}, "optimize_options param['opt_extend'] must be str, got int"),
])
def test_super_kernel_optimize_checks_value_types_in_torch_npus_words(torch_npu: Any, options: dict, text: str) -> None:
    # torch_npu/npu/graphs.py:740-842 (NPUGraph._validate_options)
    from sim import facade

    facade.configure(profile="A3")
    graph = torch_npu.npu.NPUGraph()
    with pytest.raises(RuntimeError) as info:
        graph.super_kernel_optimize(options)
    assert info.value.args[0] == text
    with pytest.raises(RuntimeError) as info:
        graph.super_kernel_optimize(None, {"debug_sync_all": True, "debug_extend": 1})  # bool is an int, as there
    assert info.value.args[0] == "debug_options param['debug_extend'] must be str, got int"


def test_torch_npus_python_errors_carry_its_error_code(torch_npu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # torch_npu/utils/_error_code.py: a second argument (graphs.py) or a suffix (npu/__init__.py)
    npu = torch_npu.npu
    with pytest.raises(RuntimeError) as info:
        npu.super_kernel_scope_begin("  ")
    assert info.value.args[0] == "scope_name should be None or a non-empty string."
    assert re.match(ERROR_CODE.format(code=1, meaning="invalid parameter"), info.value.args[1])
    with pytest.raises(AssertionError) as invalid:
        npu.get_device_name(5)
    assert re.match("Invalid device id" + ERROR_CODE.format(code=3, meaning="invalid value"), str(invalid.value))
    with pytest.raises(RuntimeError) as update:
        npu.NPUGraph().update([])
    assert update.value.args[0].startswith("The current graph configuration does not support update")
    assert "ERR00001 PTA invalid parameter" in update.value.args[1]
    monkeypatch.setenv("TORCH_NPU_COMPACT_ERROR_OUTPUT", "1")
    with pytest.raises(RuntimeError) as compact:
        npu.super_kernel_scope_end("")
    assert compact.value.args == ("scope_name should be None or a non-empty string.", "")


def test_a_four_dimensional_paged_cache_computes_as_the_three_dimensional_one(torch_npu: Any) -> None:
    # _op_plugin_docs.py:8220, 8285: a TND query takes (blocknum, blocksize, H) or
    # (blocknum, KV_N, blocksize, D); a BSH one only the first (the contract rule paged_kv_layout).
    from ascendgraph.errors import KernelContractError

    gen = torch.Generator().manual_seed(0)
    query = torch.randn(3, 4, 16, generator=gen).bfloat16().npu()
    by_token = torch.randn(4, 128, 2, 16, generator=gen).bfloat16().npu()  # [blocks, block_size, KV_N, D]
    kwargs = dict(actual_seq_lengths=[1, 3], actual_seq_lengths_kv=[5, 130], num_heads=4, num_key_value_heads=2,
                  input_layout="TND", scale=0.25, sparse_mode=3, block_size=128,
                  atten_mask=torch.ones(2048, 2048, dtype=torch.bool, device="npu").triu(1),
                  block_table=torch.tensor([[0, 1], [2, 3]], dtype=torch.int32, device="npu"))
    flat = by_token.reshape(4, 128, 32)
    by_head = by_token.permute(0, 2, 1, 3).contiguous()
    three, _ = torch_npu.npu_fused_infer_attention_score(query, flat, flat, **kwargs)
    four, _ = torch_npu.npu_fused_infer_attention_score(query, by_head, by_head, **kwargs)
    assert torch.equal(three, four) and bool(three.float().abs().sum() > 0)
    with pytest.raises(KernelContractError, match="paged_kv_layout"):
        torch_npu.npu_fused_infer_attention_score(query.reshape(1, 3, 64), by_head, by_head,
                                                  **{**kwargs, "input_layout": "BSH"})
