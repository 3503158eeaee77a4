"""Valid base calls of the kernels the contract table covers, one builder per kernel (and
variant), at torch_npu's argument names: `ascendgraph.testing.contract_cases` changes one
argument of them per case. Each builder takes the device and the arguments to replace."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ascendgraph.workspace_sizes import fused_attention_workspace_bytes, paged_attention_workspace_bytes

Args = dict[str, Any]
Builder = Callable[[torch.device], Args]
BF16 = torch.bfloat16


def _fia(device: torch.device, **changes: Any) -> Args:
    # 2 requests (q 3 and 2 tokens, kv 3 and 130), 4 query heads over 2 kv heads of 16, block 128
    # (Q_S > 1: the op docs' :8219 asks for a multiple of 128).
    args: Args = dict(
        query=torch.zeros(5, 4, 16, dtype=BF16, device=device),
        key=torch.zeros(8, 128, 32, dtype=BF16, device=device),
        value=torch.zeros(8, 128, 32, dtype=BF16, device=device),
        atten_mask=torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1),
        actual_seq_lengths=[3, 5],
        actual_seq_lengths_kv=[3, 130],
        block_table=torch.zeros(2, 4, dtype=torch.int32, device=device),
        num_heads=4,
        scale=0.25,
        input_layout="TND",
        num_key_value_heads=2,
        sparse_mode=3,
        block_size=128,
    )
    args.update(changes)
    return args


def _mla_prefill(device: torch.device, **changes: Any) -> Args:
    # vLLM Ascend's MLA prefill call (attention/mla_v1.py@182b75ea:1256-1283): TND, unpaged, as
    # many KV heads as query heads, the rope parts beside the nope parts; 2 requests of 3 and 2
    # tokens, 4 heads, nope D 16, rope D 64.
    args = _fia(device, query=_t(device, 5, 4, 16), key=_t(device, 5, 4, 16), value=_t(device, 5, 4, 16),
                query_rope=_t(device, 5, 4, 64), key_rope=_t(device, 5, 4, 64), block_table=None, block_size=0,
                actual_seq_lengths_kv=[3, 5], num_key_value_heads=4)
    args.update(changes)
    return args


def _paged(device: torch.device, **changes: Any) -> Args:
    args: Args = dict(
        query=torch.zeros(5, 4, 16, dtype=BF16, device=device),
        key_cache=torch.zeros(8, 16, 2, 16, dtype=BF16, device=device),
        value_cache=torch.zeros(8, 16, 2, 16, dtype=BF16, device=device),
        block_table=torch.zeros(2, 4, dtype=torch.int32, device=device),
        actual_seq_lengths=[3, 5],
        seq_lens=[3, 18],
        scale=0.25,
        out=torch.zeros(5, 4, 16, dtype=BF16, device=device),
    )
    args.update(changes)
    return args


def _cache(device: torch.device, dtype: torch.dtype = BF16, **changes: Any) -> Args:
    args: Args = dict(
        key=torch.zeros(3, 2, 16, dtype=dtype, device=device),
        value=torch.zeros(3, 2, 16, dtype=dtype, device=device),
        key_cache=torch.zeros(4, 16, 2, 16, dtype=dtype, device=device),
        value_cache=torch.zeros(4, 16, 2, 16, dtype=dtype, device=device),
        slot_indices=torch.arange(3, dtype=torch.int32, device=device),
    )
    args.update(changes)
    return args


def _rope(device: torch.device, dtype: torch.dtype = BF16, **changes: Any) -> Args:
    args: Args = dict(
        positions=torch.arange(3, device=device),
        query=torch.zeros(3, 4 * 16, dtype=dtype, device=device),
        key=torch.zeros(3, 2 * 16, dtype=dtype, device=device),
        head_size=16,
        cos_sin_cache=torch.zeros(32, 16, dtype=dtype, device=device),
        is_neox=True,
    )
    args.update(changes)
    return args


def _t(device: torch.device, *shape: int, dtype: torch.dtype = BF16) -> torch.Tensor:
    return torch.zeros(*shape, dtype=dtype, device=device)


def _norm(device: torch.device, **changes: Any) -> Args:
    args: Args = dict(input=_t(device, 3, 32), gamma=_t(device, 32), epsilon=1e-6)
    args.update(changes)
    return args


def _add_norm(device: torch.device, **changes: Any) -> Args:
    args: Args = dict(x1=_t(device, 3, 32), x2=_t(device, 3, 32), gamma=_t(device, 32), epsilon=1e-6)
    args.update(changes)
    return args


def _quantize(device: torch.device, **changes: Any) -> Args:
    args: Args = dict(input=_t(device, 3, 32), scales=_t(device, 32, dtype=torch.float32),
                      zero_points=_t(device, 32, dtype=torch.int32), dtype=torch.qint8, axis=-1, div_mode=True)
    args.update(changes)
    return args


def _add_norm_quant(device: torch.device, **changes: Any) -> Args:
    args = _add_norm(device)
    args.update(scales1=_t(device, 32, dtype=torch.float32), zero_points1=_t(device, 32, dtype=torch.int32), axis=-1)
    args.update(changes)
    return args


def _add_norm_dyn(device: torch.device, **changes: Any) -> Args:
    args = _add_norm(device)
    args.update(output_mask=[True, True])
    args.update(changes)
    return args


def _many_requests(device: torch.device, requests: int) -> Args:
    # ``requests`` requests of one query token, but the first of two (so Q_S > 1); the cache is
    # the base's (too small for them all: only the batch rule is asked about).
    ends = [1 + i for i in range(1, requests + 1)]
    return _fia(device, query=_t(device, ends[-1], 4, 16), actual_seq_lengths=ends, actual_seq_lengths_kv=[2] * requests,
                block_table=_t(device, requests, 1, dtype=torch.int32))


def _fia_v2(device: torch.device, **changes: Any) -> Args:
    # _fia's call in npu_fused_infer_attention_score_v2's names, with a learnable sink per query head.
    args: Args = dict(
        query=_t(device, 5, 4, 16), key=_t(device, 8, 128, 32), value=_t(device, 8, 128, 32),
        atten_mask=torch.ones(2048, 2048, dtype=torch.bool, device=device).triu(1),
        actual_seq_qlen=[3, 5], actual_seq_kvlen=[3, 130],
        block_table=_t(device, 2, 4, dtype=torch.int32), num_query_heads=4, num_key_value_heads=2,
        softmax_scale=0.25, input_layout="TND", sparse_mode=3, block_size=128, learnable_sink=_t(device, 4),
    )
    args.update(changes)
    return args


def _many_requests_v2(device: torch.device, requests: int) -> Args:
    # _many_requests in v2's names: only the batch rule is asked about.
    ends = [1 + i for i in range(1, requests + 1)]
    return _fia_v2(device, query=_t(device, ends[-1], 4, 16), actual_seq_qlen=ends, actual_seq_kvlen=[2] * requests,
                   block_table=_t(device, requests, 1, dtype=torch.int32))


def _fia_bsh(device: torch.device, v2: bool = False, **changes: Any) -> Args:
    # An unpaged BSH call: 2 batches of 3 query tokens over 6 key positions, 4 query heads over 2 kv heads of 16,
    # no mask (sparse_mode 0), in v1's names or v2's.
    args: Args = dict(
        query=_t(device, 2, 3, 64), key=_t(device, 2, 6, 32), value=_t(device, 2, 6, 32),
        num_key_value_heads=2, input_layout="BSH", sparse_mode=0,
    )
    args.update(dict(num_query_heads=4, softmax_scale=0.25) if v2 else dict(num_heads=4, scale=0.25))
    args.update(changes)
    return args


def _fia_v2_bsh(device: torch.device, **changes: Any) -> Args:
    return _fia_bsh(device, v2=True, **changes)


def _workspace_of(bytes_needed: int, device: torch.device) -> torch.Tensor:
    return torch.empty(bytes_needed, dtype=torch.uint8, device=device)


def _fia_workspace(device: torch.device, v2: bool, spare: int) -> Args:
    base = _fia_v2(device) if v2 else _fia(device)
    needed = fused_attention_workspace_bytes(base, v2=v2)
    return {**base, "workspace": _workspace_of(needed + spare, device)}


def _atb_workspace(device: torch.device, spare: int) -> Args:
    base = _atb_paged(device)
    return {**base, "workspace": _workspace_of(paged_attention_workspace_bytes(base) + spare, device)}


def _atb_paged(device: torch.device, **changes: Any) -> Args:
    # Decode: 3 requests of one token over a [8, 16, 2, 16] cache.
    args: Args = dict(
        query=_t(device, 3, 4, 16), key_cache=_t(device, 8, 16, 2, 16), value_cache=_t(device, 8, 16, 2, 16),
        num_kv_heads=2, num_heads=4, scale_value=0.25, block_table=_t(device, 3, 4, dtype=torch.int32),
        context_lens=torch.tensor([3, 17, 1], dtype=torch.int32, device=device), out=_t(device, 3, 4, 16),
    )
    args.update(changes)
    return args


def _scatter(device: torch.device, dtype: torch.dtype = BF16, **changes: Any) -> Args:
    args: Args = dict(
        key=_t(device, 3, 2, 16, dtype=dtype), value=_t(device, 3, 2, 16, dtype=dtype),
        key_cache=_t(device, 4, 16, 2, 16, dtype=dtype), value_cache=_t(device, 4, 16, 2, 16, dtype=dtype),
        slot_mapping=torch.arange(3, dtype=torch.int32, device=device), cache_mode="Norm",
    )
    args.update(changes)
    return args


def _swiglu(device: torch.device, dtype: torch.dtype = BF16, **changes: Any) -> Args:
    args: Args = dict(self=_t(device, 3, 8, dtype=dtype), dim=-1)
    args.update(changes)
    return args


def _mrope(device: torch.device, dtype: torch.dtype = BF16, **changes: Any) -> Args:
    # 3 tokens, 4 query heads over 2 KV heads of 64, full rotary (rotary_dim 64), rope mode.
    args: Args = dict(positions=torch.arange(3, device=device), query=_t(device, 3, 4 * 64, dtype=dtype),
                      key=_t(device, 3, 2 * 64, dtype=dtype), cos_sin_cache=_t(device, 16, 64, dtype=dtype),
                      head_size=64, mrope_section=[0, 0, 0], rotary_mode="half", cache_mode="default")
    args.update(changes)
    return args


def _gating(device: torch.device, **changes: Any) -> Args:
    # 4 tokens over 8 experts, top 2, one group, softmax (Qwen-MoE's router; torch_npu's schema)
    args: Args = dict(x=_t(device, 4, 8), k=2, bias=None, input_ids=None, tid2eid=None, k_group=1, group_count=1,
                      group_select_mode=0, renorm=0, norm_type=0, out_flag=False, routed_scaling_factor=1.0, eps=1e-20)
    args.update(changes)
    return args


def _c_gating(device: torch.device, **changes: Any) -> Args:
    # vLLM Ascend's _C_ascend::moe_gating_top_k: the same call with its schema's names (renorm 1)
    args: Args = dict(x=_t(device, 4, 8), k=2, k_group=1, group_count=1, group_select_mode=1, renorm=1, norm_type=0,
                      out_flag=False, routed_scaling_factor=1.0, eps=1e-20, bias_opt=None)
    args.update(changes)
    return args


def _routing(device: torch.device, **changes: Any) -> Args:
    # 3 tokens of 16, top 2 of 4 experts, this EP rank's experts [0, 2), count mode (vLLM Ascend's call)
    args: Args = dict(x=_t(device, 3, 16), expert_idx=torch.tensor([[0, 1], [1, 2], [2, 3]], dtype=torch.int32,
                                                                   device=device),
                      scale=None, offset=None, active_num=6, expert_capacity=-1, expert_num=4, drop_pad_mode=0,
                      expert_tokens_num_type=1, expert_tokens_num_flag=True, quant_mode=-1,
                      active_expert_range=[0, 2], row_idx_type=0, x_dtype=None)
    args.update(changes)
    return args


def _gmm(device: torch.device, **changes: Any) -> Args:
    # 6 rows of 16 against 2 experts' [16, 8] weights, group sizes [2, 4] (count mode), one output
    args: Args = dict(x=[_t(device, 6, 16)], weight=[_t(device, 2, 16, 8)], bias=None, scale=None, offset=None,
                      antiquant_scale=None, antiquant_offset=None, per_token_scale=None,
                      group_list=torch.tensor([2, 4], device=device), activation_input=None,
                      activation_quant_scale=None, activation_quant_offset=None, split_item=2, group_type=0,
                      group_list_type=1, act_type=0, tuning_config=None, output_dtype=None, x_dtype=None,
                      weight_dtype=None, scale_dtype=None, per_token_scale_dtype=None)
    args.update(changes)
    return args


def _unpermute(device: torch.device, **changes: Any) -> Args:
    # 3 tokens, top 2: 6 permuted rows of 16
    args: Args = dict(permuted_tokens=_t(device, 6, 16),
                      sorted_indices=torch.tensor([0, 3, 1, 4, 2, 5], dtype=torch.int32, device=device),
                      probs=_t(device, 3, 2), padded_mode=False, restore_shape=None)
    args.update(changes)
    return args
