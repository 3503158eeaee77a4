"""One violating and one boundary (accepted) argument set per rule of the kernel-contract table.

Theory of operation. `CONTRACT_CASES` maps ``(kernel, rule name)`` to a `ContractCase`:
``violate(device)`` builds torch_npu-level arguments that break exactly that rule's
condition, ``boundary(device)`` arguments that sit on the accepted edge of it (block size
512, 64 query heads per KV head, a KV length equal to the query length...). Both start
from a valid base call of the kernel (`ascendgraph.testing.contract_calls`). The unit
tests check the table with them, and the conformance section "kernel contracts" hands them
to a device's kernel pre-check (the simulator's, or hw's on an NPU). `missing_cases()` lists rules without a case, so a
rule added to the table without one fails the suite.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ascendgraph import kernel_contracts as kc
from ascendgraph.testing.contract_calls import (  # the base calls each case changes
    Args, Builder, _fia, _mla_prefill, _paged, _cache, _rope, _t, _norm, _add_norm, _quantize, _add_norm_quant,
    _add_norm_dyn, _many_requests, _fia_v2, _many_requests_v2, _fia_bsh, _fia_v2_bsh, _fia_workspace,
    _atb_workspace, _atb_paged, _scatter, _swiglu, _mrope, _gating, _c_gating, _routing, _gmm, _unpermute,
)

__all__ = ["ContractCase", "CONTRACT_CASES", "missing_cases", "base_arguments"]


def _gating_cases(kernel: str, base: Builder) -> tuple["ContractCase", ...]:
    """The rules torch_npu's gating top-k and vLLM Ascend's build share."""

    def with_(**changes: Any) -> Builder:  # a change that is a function of the device builds a tensor there
        def build(device: torch.device) -> Args:
            return {**base(device), **{k: v(device) if callable(v) else v for k, v in changes.items()}}

        return build

    bias_key = "bias" if kernel == kc.GATING_TOP_K else "bias_opt"
    return (
        _case(kernel, "gating_x", with_(x=lambda d: _t(d, 4, 8, dtype=torch.int32)),
              with_(x=lambda d: _t(d, 4, 2048, dtype=torch.float32)), "2048 experts accepted"),
        _case(kernel, "gating_groups", with_(group_count=4), with_(group_count=2), "groups of 2 refused, of 4 accepted"),
        _case(kernel, "gating_k", with_(k=9), with_(k=8)),
        _case(kernel, "gating_bias", with_(**{bias_key: lambda d: _t(d, 7)}), with_(**{bias_key: lambda d: _t(d, 8)})),
        _case(kernel, "gating_norm_type", with_(norm_type=2), with_(norm_type=1)),
    )


@dataclass(frozen=True)
class ContractCase:
    kernel: str
    rule: str
    violate: Builder
    boundary: Builder
    note: str = ""


def _case(kernel: str, rule: str, violate: Builder, boundary: Builder, note: str = "") -> ContractCase:
    return ContractCase(kernel, rule, violate, boundary, note)


F, P = kc.FIA, kc.PAGED_ATTENTION_OP
_CASES = (
    _case(F, "query_dtype", lambda d: _fia(d, query=_t(d, 5, 4, 16, dtype=torch.float32)),
          lambda d: _fia(d, query=_t(d, 5, 4, 16, dtype=torch.float16)), "float32 refused, float16 accepted"),
    _case(F, "query_contiguous", lambda d: _fia(d, query=_t(d, 4, 5, 16).transpose(0, 1)), _fia),
    _case(F, "kv_contiguous", lambda d: _fia(d, key=_t(d, 8, 32, 128).transpose(1, 2)), _fia),
    _case(F, "rope_pair", lambda d: _mla_prefill(d, key_rope=None), _mla_prefill),
    _case(F, "rope_contiguous", lambda d: _mla_prefill(d, key_rope=_t(d, 5, 1, 64).expand(5, 4, 64)),
          _mla_prefill, "key_rope broadcast over the heads (a stride-0 view) refused, its copy accepted"),
    _case(F, "rope_dtype", lambda d: _mla_prefill(d, query_rope=_t(d, 5, 4, 64, dtype=torch.float16)), _mla_prefill),
    _case(F, "rope_shape", lambda d: _mla_prefill(d, key_rope=_t(d, 5, 4, 32)), _mla_prefill),
    _case(F, "paged_kv_dtype", lambda d: _fia(d, key=_t(d, 8, 128, 32, dtype=torch.float32),
                                               value=_t(d, 8, 128, 32, dtype=torch.float32)),
          lambda d: _fia(d, key=_t(d, 8, 128, 32, dtype=torch.int8), value=_t(d, 8, 128, 32, dtype=torch.int8))),
    _case(F, "paged_kv_layout", lambda d: _fia(d, query=_t(d, 1, 5, 64), input_layout="BSH", key=_t(d, 8, 2, 128, 16),
                                               value=_t(d, 8, 2, 128, 16)),
          lambda d: _fia(d, key=_t(d, 8, 2, 128, 16), value=_t(d, 8, 2, 128, 16)),
          "(blocknum, KV_N, blocksize, D): refused with a BSH query, accepted with a TND one"),
    _case(F, "paged_kv_same_shape", lambda d: _fia(d, value=_t(d, 8, 128, 16)), _fia),
    _case(F, "tnd_query_rank", lambda d: _fia(d, query=_t(d, 5, 64)), _fia),
    _case(F, "tnd_actual_seq_lengths", lambda d: _fia(d, actual_seq_lengths=[3, 2]),
          lambda d: _fia(d, actual_seq_lengths=[5, 5], actual_seq_lengths_kv=[5, 0]), "equal ends (an empty request) are cumulative"),
    _case(F, "tnd_tokens_equal_last_end", lambda d: _fia(d, actual_seq_lengths=[3, 4]), _fia,
          "padding tokens past the last end are refused"),
    _case(F, "paged_kv_lengths_per_request", lambda d: _fia(d, actual_seq_lengths_kv=[3]),
          lambda d: _fia(d, actual_seq_lengths_kv=[3, 0]), "a zero KV length is accepted"),
    _case(F, "block_table_int32", lambda d: _fia(d, block_table=_t(d, 2, 4, dtype=torch.int64)), _fia),
    _case(F, "block_table_rows", lambda d: _fia(d, block_table=_t(d, 3, 4, dtype=torch.int32)), _fia,
          "one row more than requests is refused"),
    _case(F, "block_table_columns", lambda d: _fia(d, block_table=_t(d, 2, 1, dtype=torch.int32)),
          lambda d: _fia(d, block_table=_t(d, 2, 2, dtype=torch.int32)), "exactly the blocks of the longest request"),
    _case(F, "enough_cache_blocks", lambda d: _fia(d, key=_t(d, 2, 128, 32), value=_t(d, 2, 128, 32)),
          lambda d: _fia(d, key=_t(d, 3, 128, 32), value=_t(d, 3, 128, 32)), "exactly the blocks needed"),
    _case(F, "paged_block_size", lambda d: _fia(d, block_size=64), lambda d: _fia(d, block_size=512),
          "Q_S > 1 (:8219): 64 refused, 512 accepted"),
    _case(F, "q_s_gt_1_batch_limit", lambda d: _many_requests(d, 65537), lambda d: _many_requests(d, 65536),
          "65536 requests (one of two query tokens) accepted, 65537 refused"),
    _case(F, "q_s_gt_1_heads_limit", lambda d: _fia(d, num_heads=260, num_key_value_heads=4),
          lambda d: _fia(d, num_heads=256, num_key_value_heads=4), "256 query heads accepted, 260 refused"),
    _case(F, "head_dim_16_aligned", lambda d: _fia(d, query=_t(d, 5, 4, 8)), _fia,
          "Q_S > 1 (:8210 sits in the branch opening at :8201): D 8 refused, 16 accepted"),
    _case(F, "head_dim_limit", lambda d: _fia(d, query=_t(d, 5, 4, 528)), lambda d: _fia(d, query=_t(d, 5, 4, 512)),
          "D 512 accepted, 528 refused"),
    _case(F, "gqa_ratio", lambda d: _fia(d, num_heads=130, num_key_value_heads=2),
          lambda d: _fia(d, num_heads=128, num_key_value_heads=2), "64 query heads per kv head accepted, 65 refused"),
    _case(F, "kv_hidden_limit", lambda d: _fia(d, num_key_value_heads=4096),
          lambda d: _fia(d, num_key_value_heads=4095), "(blocknum, blocksize, H) cache, Q_S > 1: KV_N*D 65535 "
          "accepted, 65536 refused"),
    _case(F, "sparse_mode_range", lambda d: _fia(d, sparse_mode=5), lambda d: _fia(d, sparse_mode=4)),
    _case(F, "causal_mask_2048", lambda d: _fia(d, atten_mask=torch.ones(1024, 1024, dtype=torch.bool, device=d)),
          lambda d: _fia(d, atten_mask=torch.ones(1, 1, 2048, 2048, dtype=torch.bool, device=d))),
    _case(F, "input_layout", lambda d: _fia_bsh(d, query=_t(d, 2, 3, 4, 16)),
          lambda d: _fia_bsh(d, input_layout="BSND", query=_t(d, 2, 3, 4, 16), key=_t(d, 2, 6, 2, 16),
                             value=_t(d, 2, 6, 2, 16)), "a 4-D query in BSH refused; BSND takes it"),
    _case(F, "tnd_sparse_mode", lambda d: _fia(d, sparse_mode=2),
          lambda d: _fia(d, sparse_mode=0), "leftUpCausal refused in TND; sparse_mode 0 with the mask accepted "
          "(vLLM Ascend's non-causal fix shows the card runs it)"),
    _case(F, "full_mask", lambda d: _fia_bsh(d, sparse_mode=1),
          lambda d: _fia_bsh(d, sparse_mode=1, atten_mask=torch.zeros(1, 1, 3, 6, dtype=torch.bool, device=d)),
          "allMask without a mask refused; a (1, 1, Q_S, KV_S) mask accepted"),
    _case(F, "band_tokens", lambda d: _fia(d, sparse_mode=4, pre_tokens=-3, next_tokens=2),
          lambda d: _fia(d, sparse_mode=4, pre_tokens=-2, next_tokens=2),
          "pre + next < 0 refused; pre = -q_len of the shortest request with pre + next = 0 accepted"),
    _case(F, "inner_precise", lambda d: _fia(d, inner_precise=4), lambda d: _fia(d, inner_precise=3),
          "3 accepted with Q_S > 1"),
    _case(F, "batch_lengths", lambda d: _fia_bsh(d, actual_seq_lengths=[4]),
          lambda d: _fia_bsh(d, actual_seq_lengths=[3, 0], actual_seq_lengths_kv=[6]),
          "a query length past S refused; S and 0 accepted, one KV length for all"),
    _case(F, "workspace_too_small", lambda d: _fia_workspace(d, False, -1), lambda d: _fia_workspace(d, False, 0),
          "one byte short refused, the queried size accepted"),
    _case(P, "paged_cache_layout", lambda d: _paged(d, key_cache=_t(d, 8, 16, 32)), _paged),
    _case(P, "out_like_query", lambda d: _paged(d, out=_t(d, 5, 4, 16, dtype=torch.float32)), _paged),
    _case(P, "cache_dtype_like_query", lambda d: _paged(d, key_cache=_t(d, 8, 16, 2, 16, dtype=torch.float16)), _paged),
    _case(kc.RESHAPE_AND_CACHE, "cache_dtype", lambda d: _cache(d, torch.float32), lambda d: _cache(d, torch.float16)),
    _case(kc.RESHAPE_AND_CACHE, "caches_contiguous",
          lambda d: _cache(d, key_cache=_t(d, 4, 2, 16, 16).transpose(1, 2)), _cache),
    _case(kc.RESHAPE_AND_CACHE, "slot_indices_int32",
          lambda d: _cache(d, slot_indices=torch.arange(3, device=d)), _cache),
    _case(kc.RESHAPE_AND_CACHE, "one_slot_per_token",
          lambda d: _cache(d, slot_indices=torch.arange(2, dtype=torch.int32, device=d)), _cache),
    _case(kc.ROTARY_EMBEDDING, "rope_dtype", lambda d: _rope(d, torch.float32), lambda d: _rope(d, torch.float16)),
    _case(kc.ROTARY_EMBEDDING, "rope_layout", lambda d: _rope(d, query=_t(d, 3, 4, 16)), _rope),
    _case(kc.ROTARY_EMBEDDING, "rope_cache_width", lambda d: _rope(d, cos_sin_cache=_t(d, 32, 8)), _rope),
    _case(kc.RMS_NORM, "input_dtype", lambda d: _norm(d, input=_t(d, 3, 32, dtype=torch.float64)),
          lambda d: _norm(d, input=_t(d, 3, 32, dtype=torch.float32), gamma=_t(d, 32, dtype=torch.float32))),
    _case(kc.RMS_NORM, "input_rank", lambda d: _norm(d, input=_t(d, 32)),
          lambda d: _norm(d, input=_t(d, 1, 1, 1, 1, 1, 1, 1, 32)), "1 dim refused, 8 dims accepted"),
    _case(kc.RMS_NORM, "gamma_like_input", lambda d: _norm(d, gamma=_t(d, 32, dtype=torch.float32)), _norm),
    _case(kc.ADD_RMS_NORM, "x_dtype", lambda d: _add_norm(d, x2=_t(d, 3, 32, dtype=torch.float16)), _add_norm),
    _case(kc.ADD_RMS_NORM, "gamma_like_x", lambda d: _add_norm(d, gamma=_t(d, 16)), _add_norm),
    _case(kc.DYNAMIC_QUANT, "input_dtype_half", lambda d: dict(input=_t(d, 3, 32, dtype=torch.float32)),
          lambda d: dict(input=_t(d, 3, 32, dtype=torch.float16))),
    _case(kc.DYNAMIC_QUANT, "input_rank", lambda d: dict(input=_t(d, 32)), lambda d: dict(input=_t(d, 1, 32))),
    _case(kc.QUANTIZE, "input_dtype", lambda d: _quantize(d, input=_t(d, 3, 32, dtype=torch.int8)),
          lambda d: _quantize(d, input=_t(d, 3, 32, dtype=torch.float32))),
    _case(kc.QUANTIZE, "scales", lambda d: _quantize(d, scales=_t(d, 32, dtype=torch.float16)),
          lambda d: _quantize(d, scales=_t(d, 1, dtype=torch.bfloat16)), "a per-tensor bfloat16 scale accepted"),
    _case(kc.QUANTIZE, "zero_points", lambda d: _quantize(d, zero_points=_t(d, 32, dtype=torch.float32)),
          lambda d: _quantize(d, zero_points=_t(d, 32, dtype=torch.int8))),
    _case(kc.QUANTIZE, "scales_per_channel", lambda d: _quantize(d, scales=_t(d, 16, dtype=torch.float32)),
          lambda d: _quantize(d, scales=_t(d, 1, dtype=torch.float32)),
          "16 scales for a 32-wide axis refused; one per-tensor scale beside per-channel zero points accepted"),
    _case(kc.QUANTIZE, "out_dtype", lambda d: _quantize(d, dtype=torch.int8), _quantize),
    _case(kc.ADD_RMS_NORM_QUANT, "x_dtype_half", lambda d: _add_norm_quant(
        d, x1=_t(d, 3, 32, dtype=torch.float32), x2=_t(d, 3, 32, dtype=torch.float32), gamma=_t(d, 32, dtype=torch.float32)),
        lambda d: _add_norm_quant(d, x1=_t(d, 3, 32, dtype=torch.float16), x2=_t(d, 3, 32, dtype=torch.float16),
                                  gamma=_t(d, 32, dtype=torch.float16))),
    _case(kc.ADD_RMS_NORM_QUANT, "gamma_like_x", lambda d: _add_norm_quant(d, gamma=_t(d, 32, dtype=torch.float16)),
          _add_norm_quant),
    _case(kc.ADD_RMS_NORM_QUANT, "scales_like_gamma", lambda d: _add_norm_quant(d, scales1=_t(d, 1, dtype=torch.float32)),
          _add_norm_quant, "the kernel takes a per-channel scale vector (hw expands a per-tensor scale)"),
    _case(kc.ADD_RMS_NORM_QUANT, "zero_points_like_gamma",
          lambda d: _add_norm_quant(d, zero_points1=_t(d, 32, dtype=torch.int8)),
          lambda d: _add_norm_quant(d, zero_points1=_t(d, 32, dtype=torch.bfloat16))),
    _case(kc.ADD_RMS_NORM_QUANT, "axis_minus_one", lambda d: _add_norm_quant(d, axis=0), _add_norm_quant),
    _case(kc.ADD_RMS_NORM_QUANT, "x_shapes", lambda d: _add_norm_quant(d, x2=_t(d, 1, 3, 32)),
          lambda d: _add_norm_quant(d, x1=_t(d, 32), x2=_t(d, 32)), "a 1-D x accepted (the docs take 1-8 dims)"),
    _case(kc.ADD_RMS_NORM_QUANT, "gamma_shape", lambda d: _add_norm_quant(d, gamma=_t(d, 1, 32)),
          lambda d: _add_norm_quant(d, gamma=_t(d, 3, 32), scales1=_t(d, 3, 32, dtype=torch.float32),
                                    zero_points1=_t(d, 3, 32, dtype=torch.int32)),
          "gamma over both dims of x1 accepted; more dims than x1 refused"),
    _case(kc.ADD_RMS_NORM_QUANT, "beta_like_gamma", lambda d: _add_norm_quant(d, beta=_t(d, 16)),
          lambda d: _add_norm_quant(d, beta=_t(d, 32))),
    _case(kc.ADD_RMS_NORM_DYNAMIC_QUANT, "x_dtype_half",
          lambda d: _add_norm_dyn(d, x1=_t(d, 32), x2=_t(d, 32)), _add_norm_dyn, "1-D refused, 2-D accepted"),
    _case(kc.ADD_RMS_NORM_DYNAMIC_QUANT, "gamma_vector", lambda d: _add_norm_dyn(d, gamma=_t(d, 1, 32)), _add_norm_dyn),
    _case(kc.ADD_RMS_NORM_DYNAMIC_QUANT, "x_shapes", lambda d: _add_norm_dyn(d, x2=_t(d, 1, 3, 32)), _add_norm_dyn),
    _case(kc.ADD_RMS_NORM_DYNAMIC_QUANT, "smooth_scales_and_beta_like_gamma",
          lambda d: _add_norm_dyn(d, smooth_scale1=_t(d, 32, dtype=torch.float32)),
          lambda d: _add_norm_dyn(d, smooth_scale1=_t(d, 32), smooth_scale2=_t(d, 32), beta=_t(d, 32)),
          "gamma's dtype accepted, float32 refused"),
    _case(kc.ADD_RMS_NORM_DYNAMIC_QUANT, "output_mask", lambda d: _add_norm_dyn(d, output_mask=[False, False]),
          lambda d: _add_norm_dyn(d, output_mask=[True, False]), "vLLM Ascend's [True, False] accepted"),
    # vLLM Ascend's A2 graph kernels (npu_fused_infer_attention_score_v2, the ATB paged attention, the KV write).
    _case(kc.FIA_V2, "v2_query_dtype", lambda d: _fia_v2(d, query=_t(d, 5, 4, 16, dtype=torch.int8)),
          lambda d: _fia_v2(d, query=_t(d, 5, 4, 16, dtype=torch.float16)), "int8 refused with page attention"),
    _case(kc.FIA_V2, "v2_contiguous", lambda d: _fia_v2(d, query=_t(d, 4, 5, 16).transpose(0, 1)), _fia_v2),
    _case(kc.FIA_V2, "v2_tnd_lengths", lambda d: _fia_v2(d, actual_seq_kvlen=None),
          lambda d: _fia_v2(d, actual_seq_qlen=[5, 5], actual_seq_kvlen=[5, 0]), "an empty request is cumulative"),
    _case(kc.FIA_V2, "v2_tnd_tokens_equal_last_end", lambda d: _fia_v2(d, actual_seq_qlen=[3, 4]), _fia_v2),
    _case(kc.FIA_V2, "v2_block_table", lambda d: _fia_v2(d, block_table=_t(d, 3, 4, dtype=torch.int32)), _fia_v2,
          "one row more than requests is refused"),
    _case(kc.FIA_V2, "v2_block_table_columns", lambda d: _fia_v2(d, block_table=_t(d, 2, 1, dtype=torch.int32)),
          lambda d: _fia_v2(d, block_table=_t(d, 2, 2, dtype=torch.int32)), "exactly the blocks of the longest request"),
    _case(kc.FIA_V2, "v2_paged_block_size", lambda d: _fia_v2(d, block_size=64), lambda d: _fia_v2(d, block_size=512),
          "Q_S > 1 (:8776): 64 refused, 512 accepted"),
    _case(kc.FIA_V2, "v2_q_s_gt_1_batch_limit", lambda d: _many_requests_v2(d, 65537),
          lambda d: _many_requests_v2(d, 65536), "65536 requests (one of two query tokens) accepted, 65537 refused"),
    _case(kc.FIA_V2, "v2_q_s_gt_1_heads_limit",
          lambda d: _fia_v2(d, num_query_heads=260, num_key_value_heads=4, learnable_sink=_t(d, 260)),
          lambda d: _fia_v2(d, num_query_heads=256, num_key_value_heads=4, learnable_sink=_t(d, 256)),
          "256 query heads accepted, 260 refused"),
    _case(kc.FIA_V2, "v2_gqa_ratio", lambda d: _fia_v2(d, num_query_heads=130, num_key_value_heads=2,
                                                       learnable_sink=_t(d, 130)),
          lambda d: _fia_v2(d, num_query_heads=128, num_key_value_heads=2, learnable_sink=_t(d, 128))),
    _case(kc.FIA_V2, "v2_sparse_mode", lambda d: _fia_v2(d, sparse_mode=2), lambda d: _fia_v2(d, sparse_mode=4),
          "TND takes 0, 3 or 4"),
    _case(kc.FIA_V2, "v2_causal_mask_2048", lambda d: _fia_v2(d, atten_mask=None),
          lambda d: _fia_v2(d, atten_mask=torch.ones(1, 2048, 2048, dtype=torch.bool, device=d))),
    _case(kc.FIA_V2, "v2_kv_covers_query", lambda d: _fia_v2(d, actual_seq_kvlen=[2, 130]),
          lambda d: _fia_v2(d, actual_seq_kvlen=[3, 0]), "kv_len == q_len and 0 accepted (the docs say <)"),
    _case(kc.FIA_V2, "v2_learnable_sink", lambda d: _fia_v2(d, learnable_sink=_t(d, 4, dtype=torch.float16)),
          lambda d: _fia_v2(d, key=_t(d, 8, 16, 256), value=_t(d, 8, 16, 256), query=_t(d, 5, 4, 128)),
          "bfloat16 (Q_N,) accepted; D 128 over 2 KV heads (H 256 per cache slot) is the edge"),
    _case(kc.FIA_V2, "v2_input_layout", lambda d: _fia_v2_bsh(d, input_layout="SBH"),
          lambda d: _fia_v2_bsh(d, input_layout="BNSD", query=_t(d, 2, 4, 3, 16), key=_t(d, 2, 2, 6, 16),
                                value=_t(d, 2, 2, 6, 16))),
    _case(kc.FIA_V2, "v2_full_mask",
          lambda d: _fia_v2_bsh(d, sparse_mode=0, atten_mask=torch.zeros(3, 5, dtype=torch.bool, device=d)),
          lambda d: _fia_v2_bsh(d, sparse_mode=0, atten_mask=torch.zeros(3, 6, dtype=torch.uint8, device=d)),
          "a mask narrower than KV_S refused; (Q_S, KV_S) uint8 accepted"),
    _case(kc.FIA_V2, "v2_band_tokens", lambda d: _fia_v2(d, sparse_mode=4, pre_tokens=1, next_tokens=-131),
          lambda d: _fia_v2(d, sparse_mode=4, pre_tokens=130, next_tokens=-3),
          "next_tokens below -kv_len refused; next = -kv_len of the shortest request accepted"),
    _case(kc.FIA_V2, "v2_inner_precise",
          lambda d: _fia_v2(d, inner_precise=2, query=_t(d, 2, 4, 16), actual_seq_qlen=[1, 2]),
          lambda d: _fia_v2(d, inner_precise=1, query=_t(d, 2, 4, 16), actual_seq_qlen=[1, 2]),
          "Q_S == 1 takes 0 or 1 only"),
    _case(kc.FIA_V2, "v2_batch_lengths", lambda d: _fia_v2_bsh(d, actual_seq_kvlen=[6, 7]),
          lambda d: _fia_v2_bsh(d, actual_seq_kvlen=[6, 6, 9]), "a KV length past the key's S refused; entries past B "
          "are not read"),
    _case(kc.FIA_V2, "v2_workspace_too_small", lambda d: _fia_workspace(d, True, -1),
          lambda d: _fia_workspace(d, True, 0), "one byte short refused, the queried size accepted"),
    _case(kc.ATB_PAGED_ATTENTION, "pa_workspace_too_small", lambda d: _atb_workspace(d, -1),
          lambda d: _atb_workspace(d, 0), "one byte short refused, the queried size accepted"),
    _case(kc.ATB_PAGED_ATTENTION, "pa_dtype", lambda d: _atb_paged(d, key_cache=_t(d, 8, 16, 2, 16, dtype=torch.int8)),
          lambda d: _atb_paged(d, query=_t(d, 3, 4, 16, dtype=torch.float16), out=_t(d, 3, 4, 16, dtype=torch.float16),
                               key_cache=_t(d, 8, 16, 2, 16, dtype=torch.float16),
                               value_cache=_t(d, 8, 16, 2, 16, dtype=torch.float16))),
    _case(kc.ATB_PAGED_ATTENTION, "pa_layout", lambda d: _atb_paged(d, num_kv_heads=1), _atb_paged,
          "num_kv_heads must be the cache's head axis"),
    _case(kc.ATB_PAGED_ATTENTION, "pa_gqa", lambda d: _atb_paged(d, num_heads=3, query=_t(d, 3, 3, 16), out=_t(d, 3, 3, 16)),
          _atb_paged),
    _case(kc.ATB_PAGED_ATTENTION, "pa_one_token_per_request",
          lambda d: _atb_paged(d, block_table=_t(d, 2, 4, dtype=torch.int32)), _atb_paged),
    _case(kc.ATB_PAGED_ATTENTION, "pa_context_lens_int32",
          lambda d: _atb_paged(d, context_lens=torch.tensor([3, 17, 1], device=d)), _atb_paged),
    _case(kc.ATB_PAGED_ATTENTION, "pa_out_like_query", lambda d: _atb_paged(d, out=_t(d, 3, 64)), _atb_paged),
    _case(kc.SCATTER_PA_KV_CACHE, "scatter_dtypes_equal", lambda d: _scatter(d, value=_t(d, 3, 2, 16, dtype=torch.float16)),
          lambda d: _scatter(d, torch.int8), "int8 caches are accepted (the wheel lists int8)"),
    _case(kc.SCATTER_PA_KV_CACHE, "scatter_contiguous",
          lambda d: _scatter(d, key=_t(d, 2, 3, 16).transpose(0, 1)), _scatter),
    _case(kc.SCATTER_PA_KV_CACHE, "scatter_slot_mapping_dtype",
          lambda d: _scatter(d, slot_mapping=torch.arange(3, dtype=torch.int16, device=d)),
          lambda d: _scatter(d, slot_mapping=torch.arange(3, device=d)), "int64 accepted"),
    _case(kc.SCATTER_PA_KV_CACHE, "scatter_cache_rank", lambda d: _scatter(d, key_cache=_t(d, 4, 16, 32),
                                                                             value_cache=_t(d, 4, 16, 32)), _scatter),
    _case(kc.SCATTER_PA_KV_CACHE, "scatter_norm_layout",
          lambda d: _scatter(d, slot_mapping=torch.arange(2, dtype=torch.int32, device=d)), _scatter,
          "one slot per token"),
    _case(kc.SWIGLU, "swiglu_dtype", lambda d: _swiglu(d, torch.int32), lambda d: _swiglu(d, torch.float32)),
    _case(kc.SWIGLU, "swiglu_even_split", lambda d: _swiglu(d, self=_t(d, 3, 7)),
          lambda d: _swiglu(d, self=_t(d, 2, 3), dim=0), "split along another dim"),
    _case(kc.MROPE, "mrope_2d", lambda d: _mrope(d, query=_t(d, 3, 4, 64)), _mrope),
    _case(kc.MROPE, "mrope_dtype", lambda d: _mrope(d, key=_t(d, 3, 2 * 64, dtype=torch.float16)),
          lambda d: _mrope(d, torch.float32)),
    _case(kc.MROPE, "mrope_positions", lambda d: _mrope(d, positions=torch.arange(2, device=d)),
          lambda d: _mrope(d, positions=torch.arange(3, dtype=torch.int32, device=d))),
    _case(kc.MROPE, "mrope_heads", lambda d: _mrope(d, cos_sin_cache=_t(d, 16, 96)),
          lambda d: _mrope(d, cos_sin_cache=_t(d, 16, 32)), "partial rotary accepted"),
    _case(kc.MROPE, "mrope_rotary_dim_multiple", lambda d: _mrope(d, cos_sin_cache=_t(d, 16, 48)),
          lambda d: _mrope(d, torch.float32, cos_sin_cache=_t(d, 16, 48, dtype=torch.float32)),
          "a multiple of 16 is enough in float32"),
    *_gating_cases(kc.GATING_TOP_K, _gating),
    _case(kc.GATING_TOP_K, "gating_renorm", lambda d: _gating(d, renorm=1), _gating),
    *_gating_cases(kc.C_ASCEND_GATING_TOP_K, _c_gating),
    _case(kc.C_ASCEND_GATING_TOP_K, "gating_renorm_flag", lambda d: _c_gating(d, renorm=2), _c_gating,
          "vLLM Ascend's build takes renorm 1"),
    _case(kc.INIT_ROUTING_V2, "init_routing_x", lambda d: _routing(d, x=_t(d, 3, 16, dtype=torch.int32)),
          lambda d: _routing(d, x=_t(d, 3, 16, dtype=torch.int8)), "int8 accepted without quantisation"),
    _case(kc.INIT_ROUTING_V2, "init_routing_expert_idx",
          lambda d: _routing(d, expert_idx=torch.tensor([[0, 1], [1, 2], [2, 3]], device=d)),
          lambda d: _routing(d, expert_idx=torch.tensor([[0], [1], [3]], dtype=torch.int32, device=d)),
          "int64 refused; K = 1 accepted"),
    _case(kc.INIT_ROUTING_V2, "init_routing_expert_num", lambda d: _routing(d, expert_num=10241),
          lambda d: _routing(d, expert_num=10240)),
    _case(kc.INIT_ROUTING_V2, "init_routing_expert_ids", lambda d: _routing(d, expert_num=3), _routing,
          "expert 3 with 3 experts refused"),
    _case(kc.INIT_ROUTING_V2, "init_routing_drop_pad_mode", lambda d: _routing(d, drop_pad_mode=1), _routing),
    _case(kc.INIT_ROUTING_V2, "init_routing_tokens_num_type", lambda d: _routing(d, expert_tokens_num_type=0),
          lambda d: _routing(d, expert_tokens_num_type=2), "cumsum mode refused, key_value accepted"),
    _case(kc.INIT_ROUTING_V2, "init_routing_tokens_num_flag", lambda d: _routing(d, expert_tokens_num_flag=False),
          _routing),
    _case(kc.INIT_ROUTING_V2, "init_routing_quant_mode", lambda d: _routing(d, quant_mode=0),
          lambda d: _routing(d, quant_mode=1), "static refused, dynamic accepted"),
    _case(kc.INIT_ROUTING_V2, "init_routing_active_range", lambda d: _routing(d, active_expert_range=[1, 5]),
          lambda d: _routing(d, active_expert_range=[0, 4]), "end == expert_num accepted"),
    _case(kc.INIT_ROUTING_V2, "init_routing_row_idx_type", lambda d: _routing(d, row_idx_type=2),
          lambda d: _routing(d, row_idx_type=1)),
    _case(kc.GROUPED_MATMUL, "gmm_list_length", lambda d: _gmm(d, x=[_t(d, 6, 16)] * 129, weight=[_t(d, 16, 8)] * 129),
          lambda d: _gmm(d, x=[_t(d, 6, 16)] * 128, weight=[_t(d, 16, 8)] * 128), "128 tensors accepted"),
    _case(kc.GROUPED_MATMUL, "gmm_x_dims", lambda d: _gmm(d, x=[_t(d, 2, 3, 16)]),
          lambda d: _gmm(d, x=[_t(d, 2, 3, 16)], split_item=0), "3-D x with split_item 0 accepted"),
    _case(kc.GROUPED_MATMUL, "gmm_weight_dims", lambda d: _gmm(d, weight=[_t(d, 1, 2, 16, 8)]),
          lambda d: _gmm(d, weight=[_t(d, 16, 8)])),
    _case(kc.GROUPED_MATMUL, "gmm_split_item", lambda d: _gmm(d, split_item=4), lambda d: _gmm(d, split_item=3)),
    _case(kc.GROUPED_MATMUL, "gmm_group_type", lambda d: _gmm(d, group_type=1), lambda d: _gmm(d, group_type=-1)),
    _case(kc.GROUPED_MATMUL, "gmm_group_list_type", lambda d: _gmm(d, group_list_type=2),
          lambda d: _gmm(d, group_list_type=0, group_list=torch.tensor([2, 6], device=d)), "cumulative sizes accepted"),
    _case(kc.GROUPED_MATMUL, "gmm_group_list_values",
          lambda d: _gmm(d, group_list_type=0, group_list=torch.tensor([4, 2], device=d)),
          lambda d: _gmm(d, group_list_type=0, group_list=torch.tensor([3, 3], device=d)),
          "decreasing cumulative sizes refused, equal ones (an empty group) accepted"),
    _case(kc.GROUPED_MATMUL, "gmm_groups_within_x", lambda d: _gmm(d, group_list=torch.tensor([4, 3], device=d)),
          lambda d: _gmm(d, group_list=torch.tensor([6, 0], device=d)), "7 rows of 6 refused, all 6 accepted"),
    _case(kc.GROUPED_MATMUL, "gmm_dtypes", lambda d: _gmm(d, weight=[_t(d, 2, 16, 8, dtype=torch.float16)]),
          lambda d: _gmm(d, x=[_t(d, 6, 16, dtype=torch.float32)], weight=[_t(d, 2, 16, 8, dtype=torch.float32)])),
    _case(kc.GROUPED_MATMUL, "gmm_inner_limit",
          lambda d: _gmm(d, x=[_t(d, 6, 65536)], weight=[_t(d, 2, 65536, 8)]),
          lambda d: _gmm(d, x=[_t(d, 6, 65535)], weight=[_t(d, 2, 65535, 8)])),
    _case(kc.GROUPED_MATMUL, "gmm_grouped_shapes", lambda d: _gmm(d, weight=[_t(d, 2, 12, 8)]),
          lambda d: _gmm(d, weight=[_t(d, 2, 16, 4)]), "K 16 against 12 refused"),
    _case(kc.TOKEN_UNPERMUTE, "unpermute_tokens", lambda d: _unpermute(d, permuted_tokens=_t(d, 6, 16, dtype=torch.float16)),
          _unpermute),
    _case(kc.TOKEN_UNPERMUTE, "unpermute_indices",
          lambda d: _unpermute(d, sorted_indices=torch.arange(6, dtype=torch.int16, device=d)),
          lambda d: _unpermute(d, sorted_indices=torch.arange(6, device=d)), "int64 accepted"),
    _case(kc.TOKEN_UNPERMUTE, "unpermute_probs", lambda d: _unpermute(d, probs=_t(d, 2, 2)),
          lambda d: _unpermute(d, probs=_t(d, 6, 1)), "6 tokens of top-1 accepted"),
    _case(kc.TOKEN_UNPERMUTE, "unpermute_indices_range",
          lambda d: _unpermute(d, sorted_indices=torch.tensor([0, 3, 1, 4, 2, 6], dtype=torch.int32, device=d)),
          lambda d: _unpermute(d, sorted_indices=torch.full((6,), 5, dtype=torch.int32, device=d))),
    _case(kc.TOKEN_UNPERMUTE, "unpermute_padded_mode", lambda d: _unpermute(d, padded_mode=True), _unpermute),
)

CONTRACT_CASES: dict[tuple[str, str], ContractCase] = {(case.kernel, case.rule): case for case in _CASES}


def base_arguments(kernel: str, device: torch.device) -> Args:
    """A valid call of ``kernel`` (the boundary case of its first rule)."""
    case = next(c for c in _CASES if c.kernel == kernel)
    return case.boundary(device)


def missing_cases() -> list[tuple[str, str]]:
    """Rules of the table that have no case here."""
    return [(rule.kernel, rule.name) for rule in kc.RULES if (rule.kernel, rule.name) not in CONTRACT_CASES]
