"""Conformance section: kernel contracts (`ascendgraph.kernel_contracts`).

Every rule of the table has a case: the device's kernel pre-check refuses the violating
call and accepts the boundary call (`ascendgraph.testing.contract_cases`). The pre-check is
``device.check_kernel_call(kernel, arguments)``: on the simulator the same check its
kernels run when issued, on an NPU hw's pre-check before the kernel is reached (docs/decisions.md "Kernel contracts"), so
refusals never need a card to fail. Through the ops, the contracts that matter most are
also exercised end to end: a padded query in a graph, a block table with a spare row, an
illegal block size, float32 attention, and a capture without warm-up.
"""

from __future__ import annotations

import pytest
import torch

from ascendgraph import ops
from ascendgraph.device import KernelPrecheck
from ascendgraph.errors import CaptureConstraintError, KernelContractError
from ascendgraph.testing.conformance.helpers import TinyAttention, is_sim, tensor
from ascendgraph.testing.conformance.registry import ALL, case, sim_only
from ascendgraph.testing.contract_cases import CONTRACT_CASES

CONTRACT_IDS = sorted(CONTRACT_CASES)


def _pre_check(device):
    if not isinstance(device, KernelPrecheck):
        pytest.skip(f"device {device.name!r} has no kernel pre-check (check_kernel_call)")
    return device.check_kernel_call


@case(ALL)
@pytest.mark.parametrize("contract", CONTRACT_IDS, ids=[f"{k}-{r}" for k, r in CONTRACT_IDS])
def test_every_kernel_contract_refuses_its_violation_and_accepts_its_boundary(device, contract):
    check = _pre_check(device)
    kernel, rule = contract
    contract_case = CONTRACT_CASES[contract]
    with pytest.raises(KernelContractError) as info:
        check(kernel, contract_case.violate(device.torch_device))
    assert rule in info.value.rules, str(info.value)
    try:
        check(kernel, contract_case.boundary(device.torch_device))
    except KernelContractError as exc:
        assert rule not in exc.rules, str(exc)


def _attention_with_padding(device):
    """TinyAttention whose query holds one padding token past the last request."""
    attention = TinyAttention(device)
    attention.query = tensor(device, 3, attention.heads, attention.head_dim, seed=1, dtype=torch.bfloat16)
    attention.out = torch.zeros_like(attention.query)
    return attention


@case(ALL)
def test_padding_tokens_are_fine_eagerly_but_a_graph_needs_the_last_end_at_t(device):
    attention = _attention_with_padding(device)
    table3 = torch.arange(12, dtype=torch.int32, device=device.torch_device).view(3, 4) % 8

    def launch(ends, seq_lens, table):
        ops.paged_attention(attention.query, attention.key_cache, attention.value_cache, table, ends, seq_lens,
                            attention.scale, attention.out)

    launch([1, 2], [3, 5], attention.block_table)  # eagerly the kernel sees only the real tokens
    graph = device.new_graph()
    with pytest.raises(KernelContractError) as info:
        with device.graph(graph):
            launch([1, 2], [3, 5], attention.block_table)
    assert "tnd_tokens_equal_last_end" in info.value.rules
    launch([1, 2, 3], [3, 5, 0], table3)  # warm-up of the padded shape
    graph = device.new_graph()
    with device.graph(graph):  # vLLM Ascend's fix: a dummy request ending at T, KV length 0
        launch([1, 2, 3], [3, 5, 0], table3)
    graph.replay()
    device.synchronize()


@case(ALL)
def test_a_block_table_needs_one_row_per_request(device):
    attention = TinyAttention(device)
    extra_row = torch.zeros(3, 4, dtype=torch.int32, device=device.torch_device)
    with pytest.raises(KernelContractError) as info:
        ops.paged_attention(attention.query, attention.key_cache, attention.value_cache, extra_row, [1, 2], [3, 5],
                            attention.scale, attention.out)
    assert "block_table_rows" in info.value.rules
    attention.launch([3, 5])  # two rows for two requests


@case(sim_only("the simulator's caches take any block size; a card's kernel is what refuses one"))
def test_an_illegal_block_size_is_refused_and_a_legal_one_accepted(device):
    for block_size, legal in ((8, False), (16, True), (512, True), (528, False)):
        attention = TinyAttention(device)
        attention.key_cache = tensor(device, 8, block_size, 2, attention.head_dim, dtype=torch.bfloat16)
        attention.value_cache = attention.key_cache.clone()
        if legal:
            attention.launch([3, 5])
        else:
            with pytest.raises(KernelContractError, match="paged_block_size"):
                attention.launch([3, 5])


@case(ALL)
def test_float32_attention_is_refused(device):
    attention = TinyAttention(device)
    query = attention.query.float()
    with pytest.raises(KernelContractError) as info:
        ops.paged_attention(query, attention.key_cache.float(), attention.value_cache.float(), attention.block_table,
                            [1, 2], [3, 5], attention.scale, torch.zeros_like(query))
    assert "query_dtype" in info.value.rules


@case(sim_only("allow_float32_attention is the simulator's declared leniency (docs/decisions.md)"))
def test_float32_attention_runs_when_the_device_declares_the_leniency(device):
    device.allow_float32_attention_now()
    attention = TinyAttention(device)
    query = attention.query.float()
    ops.paged_attention(query, attention.key_cache.float(), attention.value_cache.float(), attention.block_table,
                        [1, 2], [3, 5], attention.scale, torch.zeros_like(query))


@case(sim_only("the simulator models lazy kernel initialisation; a card's message is CANN's"))
def test_a_capture_without_warm_up_is_refused_and_with_it_succeeds(device):
    attention = TinyAttention(device)
    graph = device.new_graph()
    with pytest.raises(CaptureConstraintError, match="lazy initialisation during capture"):
        with device.graph(graph):
            attention.launch([3, 5])
    attention.eager([3, 5])  # the warm-up
    graph = device.new_graph()
    with device.graph(graph):
        attention.launch([3, 5])
    graph.replay()
    device.synchronize()
    torch.testing.assert_close(attention.out, attention.eager([3, 5]))
    assert is_sim(device)
