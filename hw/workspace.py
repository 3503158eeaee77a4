"""The fused attention's workspace query on the npu device (``ascendgraph::attention_workspace``).

The core queries the workspace before ``graph_task_group_begin`` (torch_npu's graph handlers
do it in ``prepare_capture``; vLLM Ascend's attention does the same) and hands it to every
launch of the call, captured and re-issued. The route lives in `hw.kernels.KERNEL_ROUTES`;
what the query takes is the contract table's (FIA's rules: `ascendgraph.kernel_calls` maps
the call as `attention_workspace` builds it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from hw import api

if TYPE_CHECKING:  # pragma: no cover
    from hw.kernels import KernelRouter

__all__ = ["attention_workspace", "no_workspace"]


def attention_workspace(
    router: "KernelRouter",
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    actual_seq_lengths: list[int],
    seq_lens: list[int],
    scale: float,
) -> Tensor:
    """torch_npu's ``_npu_fused_infer_attention_score_get_max_workspace`` for these arguments."""
    from hw.kernels import FIA_SPARSE_MODE, causal_mask

    heads = query.shape[1]
    num_blocks, block_size, kv_heads, head_dim = key_cache.shape
    mask = router.buffers.masks.get(query.device)
    if mask is None:
        mask = router.buffers.masks.setdefault(query.device, causal_mask(query.device))
    return router.npu.call(
        api.NPU_FIA_MAX_WORKSPACE, query,
        key_cache.view(num_blocks, block_size, kv_heads * head_dim),
        value_cache.view(num_blocks, block_size, kv_heads * head_dim),
        atten_mask=mask, actual_seq_lengths=[int(v) for v in actual_seq_lengths],
        actual_seq_lengths_kv=[int(v) for v in seq_lens], block_table=block_table.to(torch.int32),
        num_heads=heads, scale=float(scale), input_layout="TND", num_key_value_heads=kv_heads,
        sparse_mode=FIA_SPARSE_MODE, block_size=block_size,
    )


def no_workspace(router: "KernelRouter", query: Tensor, *args: Any) -> Tensor:
    """Fallback: an empty workspace (paged_attention then sizes its own)."""
    return torch.empty(0, dtype=torch.uint8, device=query.device)
