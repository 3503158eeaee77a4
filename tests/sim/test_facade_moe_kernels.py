"""The facade's MoE kernels (sim.facade.moe_kernels): the gating top-k (torch_npu's and the
stand-in for vLLM Ascend's ``_C_ascend`` build), init routing v2, the grouped matmul and the
token un-permute against formulas written here from the op docs, their contract refusals, the
chain vLLM Ascend's all-gather MoE issues against a dense MoE, and that chain captured into an
NPU graph on the simulated device and replayed on new inputs."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ascendgraph.errors import KernelContractError

BF16 = torch.bfloat16


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


# --------------------------------------------------------------------------- gating top-k
def test_gating_top_k_picks_each_tokens_largest_softmax_weights(torch_npu: Any) -> None:
    # _op_plugin_docs.py:10849-10851: y the top-k of the norm (softmax, norm_type 0), the experts'
    # indices (int32), the norm's output in float32
    logits = randn(5, 8, seed=1)
    y, ids, norm = torch_npu.npu_moe_gating_top_k(logits, 3, routed_scaling_factor=2.0)
    probs = torch.softmax(logits.float(), dim=-1)
    want_weights, want_ids = probs.topk(3, dim=-1)
    assert ids.dtype == torch.int32 and y.dtype == BF16 and norm.dtype == torch.float32
    assert torch.equal(ids, want_ids.to(torch.int32)) and torch.equal(norm, probs)
    assert torch.equal(y, (want_weights * 2.0).to(BF16))


def test_vllm_ascends_gating_build_renormalises_the_top_k_and_torch_npus_refuses_renorm(torch_npu: Any) -> None:
    logits = randn(4, 8, seed=2)
    y, ids, _ = torch.ops._C_ascend.moe_gating_top_k(logits, 2, 1, 1, 1, 1, 0, False, 1.0, 1e-20, None)
    top = torch.softmax(logits.float(), dim=-1).topk(2, dim=-1)
    assert torch.equal(ids, top.indices.to(torch.int32))
    torch.testing.assert_close(y.float(), top.values / top.values.sum(-1, keepdim=True), atol=1e-2, rtol=0)
    assert torch.allclose(y.float().sum(-1), torch.ones(4), atol=1e-2)
    with pytest.raises(KernelContractError, match="gating_renorm"):  # docs:10841: only 0
        torch_npu.npu_moe_gating_top_k(logits, 2, renorm=1)
    with pytest.raises(KernelContractError, match="gating_k"):  # docs:10825: k <= 8 / 1 * 1
        torch_npu.npu_moe_gating_top_k(logits, 9)
    with pytest.raises(KernelContractError, match="gating_groups"):  # docs:10837: 8 / 4 = 2 is not > 2
        torch_npu.npu_moe_gating_top_k(logits, 2, group_count=4)
    with pytest.raises(NotImplementedError, match="softmax norm"):
        torch_npu.npu_moe_gating_top_k(logits, 2, norm_type=1)


# --------------------------------------------------------------------------- init routing v2
def routing_reference(x: torch.Tensor, ids: torch.Tensor, start: int, end: int) -> tuple[Any, Any, Any]:
    """Rows (token, choice) of experts in [start, end), sorted by expert then row; each row's
    position (-1 when outside the range); counts per expert of the range."""
    k = ids.shape[1]
    rows = sorted((int(e), r) for r, e in enumerate(ids.reshape(-1).tolist()) if start <= e < end)
    expanded = torch.zeros(ids.numel(), x.shape[1], dtype=x.dtype)
    position = [-1] * ids.numel()
    for p, (_, r) in enumerate(rows):
        expanded[p] = x[r // k]
        position[r] = p
    counts = [sum(1 for e, _ in rows if e == expert) for expert in range(start, end)]
    return expanded, position, counts


@pytest.mark.parametrize("active_range", [[], [2, 5]])
def test_init_routing_v2_puts_rows_in_expert_order_and_keeps_the_active_experts(torch_npu: Any,
                                                                                active_range: list[int]) -> None:
    # _op_plugin_docs.py:11107-11114 (expanded_x, expanded_row_idx with row_idx_type 0, counts)
    x = randn(6, 16, seed=3)
    ids = torch.tensor([[0, 3], [5, 2], [3, 7], [1, 4], [6, 3], [2, 0]], dtype=torch.int32)
    expanded, row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
        x, ids, active_num=12, expert_num=8, expert_tokens_num_type=1, expert_tokens_num_flag=True,
        active_expert_range=active_range, quant_mode=-1)
    start, end = active_range or [0, 8]
    want_x, want_position, want_counts = routing_reference(x, ids, start, end)
    assert torch.equal(expanded, want_x)
    assert row_idx.dtype == torch.int32 and row_idx.tolist() == want_position
    assert counts.dtype == torch.int64 and counts.tolist() == want_counts


def test_init_routing_v2_scatter_indices_and_scale_follow_the_kept_rows(torch_npu: Any) -> None:
    x, ids = randn(3, 4, seed=4), torch.tensor([[1, 0], [0, 2], [2, 1]], dtype=torch.int32)
    scale = torch.tensor([10.0, 20.0, 30.0])
    _, row_idx, counts, expanded_scale = torch_npu.npu_moe_init_routing_v2(
        x, ids, scale=scale, expert_num=3, expert_tokens_num_type=1, expert_tokens_num_flag=True,
        active_expert_range=[0, 2], row_idx_type=1)
    # kept rows in expert order: expert 0 rows 1, 2; expert 1 rows 0, 5; rows 3, 4 (expert 2) dropped
    assert row_idx.tolist() == [1, 2, 0, 5, -1, -1] and counts.tolist() == [2, 2]
    assert expanded_scale.tolist() == [10.0, 20.0, 10.0, 30.0, 0.0, 0.0]


def test_init_routing_v2_refuses_what_its_op_doc_refuses(torch_npu: Any) -> None:
    x, ids = randn(2, 4), torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    common = dict(expert_tokens_num_type=1, expert_tokens_num_flag=True)
    with pytest.raises(KernelContractError, match="init_routing_expert_idx"):  # docs:11090: int32
        torch_npu.npu_moe_init_routing_v2(x, ids.long(), expert_num=3, **common)
    with pytest.raises(KernelContractError, match="init_routing_expert_ids"):  # docs:11090: ids < expert_num
        torch_npu.npu_moe_init_routing_v2(x, ids, expert_num=2, **common)
    with pytest.raises(KernelContractError, match="init_routing_active_range"):  # docs:11104: end <= expert_num
        torch_npu.npu_moe_init_routing_v2(x, ids, expert_num=3, active_expert_range=[1, 4], **common)
    with pytest.raises(KernelContractError, match="init_routing_tokens_num_flag"):  # docs:11102: only True
        torch_npu.npu_moe_init_routing_v2(x, ids, expert_num=3, expert_tokens_num_type=1)


# --------------------------------------------------------------------------- grouped matmul
@pytest.mark.parametrize("group_list_type", [0, 1])
def test_grouped_matmul_multiplies_each_group_of_rows_by_its_weight(torch_npu: Any, group_list_type: int) -> None:
    # _op_plugin_docs.py:5804-5806 (y_i = x_i x weight_i), 5890 (group_list: cumsum or sizes)
    x, weight = randn(9, 16, seed=5), randn(3, 16, 8, seed=6)
    sizes = [2, 0, 4]  # 6 of the 9 rows: the last 3 belong to no group
    groups = torch.tensor(sizes if group_list_type == 1 else [2, 2, 6])
    (y,) = torch_npu.npu_grouped_matmul([x], [weight], group_list=groups, split_item=2, group_type=0,
                                        group_list_type=group_list_type)
    want = torch.zeros(9, 8)
    want[0:2] = x[0:2].float() @ weight[0].float()
    want[2:6] = x[2:6].float() @ weight[2].float()
    assert y.dtype == BF16 and torch.equal(y, want.to(BF16))
    bias = torch.arange(24, dtype=torch.float32).reshape(3, 8)
    (with_bias,) = torch_npu.npu_grouped_matmul([x], [weight], bias=[bias], group_list=groups, split_item=2,
                                                group_type=0, group_list_type=group_list_type)
    torch.testing.assert_close(with_bias[2:6].float(), (want[2:6] + bias[2]).to(BF16).float())


def test_grouped_matmul_refuses_what_its_op_doc_refuses(torch_npu: Any) -> None:
    x, weight = randn(4, 16), randn(2, 16, 8)
    call = dict(split_item=2, group_type=0)
    with pytest.raises(KernelContractError, match="gmm_groups_within_x"):  # docs:5866: 3 + 2 rows of 4
        torch_npu.npu_grouped_matmul([x], [weight], group_list=torch.tensor([3, 2]), group_list_type=1, **call)
    with pytest.raises(KernelContractError, match="gmm_group_list_values"):  # docs:5874: non-decreasing
        torch_npu.npu_grouped_matmul([x], [weight], group_list=torch.tensor([3, 2]), group_list_type=0, **call)
    with pytest.raises(KernelContractError, match="gmm_grouped_shapes"):  # K 16 against weight K 12
        torch_npu.npu_grouped_matmul([x], [randn(2, 12, 8)], group_list=torch.tensor([2, 2]), group_list_type=1,
                                     **call)
    with pytest.raises(KernelContractError, match="gmm_group_type"):  # docs:5885: A2/A3 take -1 or 0
        torch_npu.npu_grouped_matmul([x], [weight], group_list=torch.tensor([2, 2]), group_list_type=1,
                                     split_item=2, group_type=1)


# --------------------------------------------------------------------------- token un-permute
def test_token_unpermute_sums_each_tokens_rows_weighted_by_its_probs(torch_npu: Any) -> None:
    # _op_plugin_docs.py:14339 (gather by sorted_indices, times probs, summed), 16858 (the index's meaning)
    permuted = randn(8, 6, seed=7)
    indices = torch.tensor([0, 6, 7, 5, 3, 1, 2, 4], dtype=torch.int32)
    probs = randn(4, 2, seed=8)
    out = torch_npu.npu_moe_token_unpermute(permuted, indices, probs=probs)
    want = torch.stack([permuted[indices[2 * t]].float() * probs[t, 0].float()
                        + permuted[indices[2 * t + 1]].float() * probs[t, 1].float() for t in range(4)])
    assert out.shape == (4, 6) and torch.equal(out, want.to(BF16))
    with pytest.raises(KernelContractError, match="unpermute_indices_range"):
        torch_npu.npu_moe_token_unpermute(permuted, indices + 1, probs=probs)
    with pytest.raises(KernelContractError, match="unpermute_tokens"):  # docs:14342: bfloat16
        torch_npu.npu_moe_token_unpermute(permuted.half(), indices, probs=probs)
    with pytest.raises(KernelContractError, match="unpermute_padded_mode"):  # docs:14352
        torch_npu.npu_moe_token_unpermute(permuted, indices, probs=probs, padded_mode=True)


# --------------------------------------------------------------------------- the chain
def dense_moe(x: torch.Tensor, logits: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, experts: range,
              top_k: int) -> torch.Tensor:
    """Each token: sum over its top-k softmax experts (those in ``experts``) of p * w2(silu(gate) * up)."""
    probs = torch.softmax(logits.float(), dim=-1)
    weights, chosen = probs.topk(top_k, dim=-1)
    out = torch.zeros(x.shape[0], w2.shape[-1])
    for t in range(x.shape[0]):
        for p, e in zip(weights[t].tolist(), chosen[t].tolist()):
            if e in experts:
                gate, up = (x[t].float() @ w13[e].float()).chunk(2)
                out[t] += p * ((torch.nn.functional.silu(gate) * up) @ w2[e].float())
    return out


def expert_parallel_moe(torch_npu: Any, x: torch.Tensor, logits: torch.Tensor, w13: torch.Tensor,
                        w2: torch.Tensor, experts: range, top_k: int) -> torch.Tensor:
    """What vLLM Ascend's all-gather method issues on one EP rank holding ``experts``
    (token_dispatcher.py:388-451, moe_mlp.py:595-676 @182b75ea): the other ranks' experts
    masked out of the weights, the local ones computed, un-permuted back to tokens."""
    weights, ids, _ = torch.ops._C_ascend.moe_gating_top_k(logits, top_k, 1, 1, 1, 0, 0, False, 1.0, 1e-20, None)
    local = (ids >= experts.start) & (ids < experts.stop)
    weights = weights * local
    sorted_x, row_idx, counts, _ = torch_npu.npu_moe_init_routing_v2(
        x, ids, active_num=ids.numel(), expert_num=w13.shape[0], expert_tokens_num_type=1,
        expert_tokens_num_flag=True, active_expert_range=[experts.start, experts.stop], quant_mode=-1)
    mine = slice(experts.start, experts.stop)
    (gate_up,) = torch_npu.npu_grouped_matmul([sorted_x], [w13[mine]], group_list=counts, split_item=2,
                                              group_type=0, group_list_type=1)
    (down,) = torch_npu.npu_grouped_matmul([torch_npu.npu_swiglu(gate_up)], [w2[mine]], group_list=counts,
                                           split_item=2, group_type=0, group_list_type=1)
    return torch_npu.npu_moe_token_unpermute(down, row_idx.abs(), probs=weights)


def test_the_all_gather_moe_chain_on_two_ep_ranks_sums_to_the_dense_moe(torch_npu: Any) -> None:
    """Each rank computes only its experts' share; the two shares (the reduce-scatter's sum)
    are the dense MoE, and each share is the dense MoE restricted to the rank's experts."""
    x, logits = randn(6, 32, seed=9), randn(6, 4, seed=10)
    w13, w2 = randn(4, 32, 16, seed=11) * 0.2, randn(4, 8, 32, seed=12) * 0.2
    shares = [expert_parallel_moe(torch_npu, x, logits, w13, w2, experts, 2) for experts in (range(0, 2), range(2, 4))]
    for share, experts in zip(shares, (range(0, 2), range(2, 4))):
        torch.testing.assert_close(share.float(), dense_moe(x, logits, w13, w2, experts, 2), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close((shares[0] + shares[1]).float(), dense_moe(x, logits, w13, w2, range(4), 2),
                               atol=3e-2, rtol=2e-2)


def test_the_moe_chain_is_captured_into_an_npu_graph_and_replays_on_new_inputs(npu: Any) -> None:
    """Every kernel of the chain launches asynchronously on the simulated NPU (the grouped
    matmul returns a list of tensors), so the chain captures; the expert map lookup
    (``expert_map[ids]``: an integer index) is an ordinary kernel inside the capture."""
    x, logits = randn(6, 32, seed=13).to("npu"), randn(6, 4, seed=14).to("npu")
    w13, w2 = (randn(4, 32, 16, seed=15) * 0.2).to("npu"), (randn(4, 8, 32, seed=16) * 0.2).to("npu")
    expert_map = torch.tensor([0, 1, -1, -1], dtype=torch.int32).to("npu")
    graph = npu.npu.NPUGraph()
    with npu.npu.graph(graph):
        _, ids, _ = torch.ops._C_ascend.moe_gating_top_k(logits, 2, 1, 1, 1, 0, 0, False, 1.0, 1e-20, None)
        mask = expert_map[ids] != -1
        out = expert_parallel_moe(npu, x, logits, w13, w2, range(0, 2), 2) * 1.0
    x.copy_(randn(6, 32, seed=17).to("npu"))
    logits.copy_(randn(6, 4, seed=18).to("npu"))
    graph.replay()
    want = dense_moe(x.cpu(), logits.cpu(), w13.cpu(), w2.cpu(), range(0, 2), 2)
    torch.testing.assert_close(out.cpu().float(), want, atol=2e-2, rtol=2e-2)
    kept = torch.softmax(logits.cpu().float(), -1).topk(2, -1).indices < 2
    assert torch.equal(mask.cpu(), kept)
    with pytest.raises(Exception, match="data-dependent output shape"):  # a boolean mask is not capturable
        with npu.npu.graph(npu.npu.NPUGraph()):
            x[mask.any(-1)]
