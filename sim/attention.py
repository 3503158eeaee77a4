"""The fused attention's computation on the simulator: which key each query row sees, then the softmax.

Theory of operation. torch_npu's attention kernels (``npu_fused_infer_attention_score`` v1
and v2, the ATB ``_npu_paged_attention``) and ascendgraph's own ``paged_attention`` all come
down to the same computation, described here once from the op docs (torch-npu 2.13.0
``torch_npu/_op_plugin_docs.py``; line numbers below are v1's, v2 states the same at the
lines cited beside them):

* the call is a list of requests; request ``r`` has ``q_len`` query rows (in the query's
  flat token order) and ``kv_len`` key/value positions (gathered from a paged cache through
  the block table, or a contiguous range of an unpaged key/value);
* query row ``i`` of a request sees key position ``j`` when ``0 <= j < kv_len`` and the
  sparse mode lets it (`Masking.visible`):

  - ``sparse_mode`` 0 without a mask: every position (:8118; pre/next tokens ignored, :8213);
  - 0 with a mask: ``i - pre_tokens <= j <= i + next_tokens`` and the mask is False there
    (:8118: "the part between pre_tokens and next_tokens is computed"; the band's origin is
    the top-left corner, as npu_fusion_attention states for mode 0, :1637-1641);
  - 1 (allMask): the mask is False there (:8119; pre/next ignored, :8215);
  - 2 (leftUpCausal): ``j <= i`` (:8120);
  - 3 (rightDownCausal): ``j <= i + kv_len - q_len`` (:8121, the diagonal ends at the
    bottom-right corner);
  - 4 (band): ``i + o - pre_tokens <= j <= i + o + next_tokens`` with ``o = kv_len - q_len``
    (:8122; the origin is the bottom-right corner, npu_fusion_attention :1645), so vLLM
    Ascend's sliding window ``pre_tokens=w, next_tokens=0`` sees ``w + 1`` positions;
  - when the call's Q_S is 1 (the incremental branch) ``sparse_mode``, ``pre_tokens`` and
    ``next_tokens`` have no effect (:8110, 8111, 8117; v2 :8629, 8630, 8635): every position
    of the request, minus a full mask's masked ones;

  the compressed 2048 x 2048 mask of modes 2-4 is not read: the docs make the caller
  guarantee it is the lower-triangular pattern (:8214), which the mode itself encodes;
* ``softmax(scale * q.k)`` over the visible positions (with v2's ``learnable_sink``, one
  logit per query head joining the denominator), times value; a row that sees no position
  gets zeros (the docs' row-invalid correction, ``inner_precise`` bit 1, :8124-8129; modes
  0/1 leave such rows "with possible loss of precision", which the simulator models as the
  corrected zeros: docs/facade.md "What is approximated"), and a request without key/value
  positions zeros (:8154);
* the log-sum-exp of each row (``softmax_lse``, :8148): ``-inf`` for a row that sees
  nothing (and no sink).

Everything computes in float32 and is cast to the output dtype. Requests that share a
query length are batched with their key/value padded to the longest: a decode batch costs a
handful of torch calls.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
from torch import Tensor

__all__ = ["Masking", "KVSource", "attend", "SPARSE_MODES"]

SPARSE_MODES = (0, 1, 2, 3, 4)
_NO_LIMIT = 2147483647  # the schema's default pre_tokens / next_tokens ("INT_MAX")


@dataclass(frozen=True)
class Masking:
    """Which positions a query row sees: the sparse mode and its parameters for one call.

    ``full_mask`` is a sparse-mode 0/1 mask normalised to ``[batch or 1, rows, columns]``
    (True = masked out), row ``i`` and column ``j`` of request ``r`` at ``[r or 0, i, j]``;
    None when the call has no full mask. ``incremental`` is the Q_S == 1 branch.
    """

    sparse_mode: int = 3
    pre_tokens: int = _NO_LIMIT
    next_tokens: int = _NO_LIMIT
    incremental: bool = False
    full_mask: Optional[Tensor] = None

    def visible(self, q_len: int, kv_lens: Tensor, columns: int, mask_rows: Optional[Tensor]) -> Tensor:
        """[requests, q_len, columns] bool: row i of request r sees position j."""
        device = kv_lens.device
        i = torch.arange(q_len, device=device).view(1, q_len, 1)
        j = torch.arange(columns, device=device).view(1, 1, columns)
        kv = kv_lens.view(-1, 1, 1)
        seen = j < kv
        mode = self.sparse_mode
        if not self.incremental:
            offset = kv - q_len  # the bottom-right corner's diagonal
            if mode == 0 and self.full_mask is not None:
                seen = seen & (j >= i - self.pre_tokens) & (j <= i + self.next_tokens)
            elif mode == 2:
                seen = seen & (j <= i)
            elif mode == 3:
                seen = seen & (j <= i + offset)
            elif mode == 4:
                seen = seen & (j >= i + offset - self.pre_tokens) & (j <= i + offset + self.next_tokens)
        if self.full_mask is not None and (mode in (0, 1) or self.incremental):
            seen = seen & ~self._mask_block(q_len, columns, mask_rows, len(kv_lens))
        return seen.expand(len(kv_lens), q_len, columns)

    def _mask_block(self, q_len: int, columns: int, mask_rows: Optional[Tensor], requests: int) -> Tensor:
        mask = self.full_mask
        assert mask is not None
        rows = mask_rows if mask_rows is not None and mask.shape[0] > 1 else torch.zeros(requests, dtype=torch.long)
        block = mask.index_select(0, rows.to(mask.device))[:, :q_len, :columns]
        if block.shape[2] < columns:  # positions past the mask's columns are past every kv_len (rules)
            block = torch.nn.functional.pad(block, (0, columns - block.shape[2]), value=True)
        return block


@dataclass(frozen=True)
class KVSource:
    """Key and value as flat ``[positions, kv_heads, D]`` tensors and how a request's
    position ``p`` maps to a flat index: through ``block_table`` (paged: row ``r``, block
    ``p // block_size``) or from ``starts[r] + p`` (unpaged)."""

    key: Tensor
    value: Tensor
    block_table: Optional[Tensor] = None
    block_size: int = 0
    starts: Optional[Sequence[int]] = None

    def indices(self, requests: Sequence[int], columns: int) -> Tensor:
        device = self.key.device
        positions = torch.arange(columns, device=device)
        if self.block_table is not None:
            blocks = max(1, math.ceil(columns / self.block_size))
            rows = torch.tensor(list(requests), device=device, dtype=torch.long)
            table = self.block_table.index_select(0, rows)[:, :blocks].long()
            block_of = (positions // self.block_size).clamp(max=table.shape[1] - 1)
            flat = table[:, block_of] * self.block_size + (positions % self.block_size)
        else:
            assert self.starts is not None
            starts = torch.tensor([int(self.starts[r]) for r in requests], device=device, dtype=torch.long)
            flat = starts.view(-1, 1) + positions.view(1, -1)
        return flat.clamp_(0, max(self.key.shape[0] - 1, 0))


def attend(
    query: Tensor,
    q_starts: Sequence[int],
    q_lens: Sequence[int],
    kv_lens: Sequence[int],
    kv: KVSource,
    masking: Masking,
    scale: float,
    out: Tensor,
    *,
    lse: Optional[Tensor] = None,
    sink: Optional[Tensor] = None,
) -> None:
    """Attention of every request into ``out`` (flat ``[tokens, heads, Dv]``, rows of the
    requests only: the caller zeroes the rest); ``lse`` (flat ``[tokens, heads]``, float32)
    receives each row's log-sum-exp when given. ``query`` is flat ``[tokens, heads, D]``."""
    groups: dict[int, list[int]] = {}
    for request, (q_len, kv_len) in enumerate(zip(q_lens, kv_lens)):
        if q_len <= 0:
            continue
        if kv_len <= 0 or kv.key.shape[0] == 0:  # no key/value: zeros (:8154)
            start = int(q_starts[request])
            out[start:start + q_len].zero_()
            if lse is not None:
                lse[start:start + q_len] = float("-inf")
            continue
        groups.setdefault(int(q_len), []).append(request)
    for q_len, members in groups.items():
        _attend_group(query, q_starts, kv_lens, kv, masking, scale, out, lse, sink, q_len, members)


def _attend_group(
    query: Tensor,
    q_starts: Sequence[int],
    kv_lens_all: Sequence[int],
    kv: KVSource,
    masking: Masking,
    scale: float,
    out: Tensor,
    lse: Optional[Tensor],
    sink: Optional[Tensor],
    q_len: int,
    members: list[int],
) -> None:
    device = query.device
    group = len(members)
    heads, head_dim = query.shape[1], query.shape[2]
    kv_heads = kv.key.shape[1]
    per_kv = heads // kv_heads
    lens = torch.tensor([int(kv_lens_all[r]) for r in members], device=device)
    columns = int(lens.max())
    flat = kv.indices(members, columns)  # [group, columns]
    k = kv.key[flat].float()  # [group, columns, kv_heads, D]
    v = kv.value[flat].float()

    tokens = (torch.tensor([int(q_starts[r]) for r in members], device=device).view(-1, 1)
              + torch.arange(q_len, device=device).view(1, -1)).reshape(-1)
    q = query.index_select(0, tokens).float().reshape(group, q_len, kv_heads, per_kv, head_dim)
    scores = torch.einsum("rqhgd,rlhd->rhgql", q, k) * scale
    mask_rows = torch.tensor(members, dtype=torch.long)
    seen = masking.visible(q_len, lens, columns, mask_rows).to(device).view(group, 1, 1, q_len, columns)
    scores = scores.masked_fill(~seen, float("-inf"))
    if sink is not None:
        sink_logits = sink.float().to(device).view(1, kv_heads, per_kv, 1, 1).expand(group, kv_heads, per_kv, q_len, 1)
        logits = torch.cat([scores, sink_logits], dim=-1)
    else:
        logits = scores
    # A row that sees nothing (and has no sink) is all -inf: softmax gives NaN there, zeros here.
    weights = torch.nan_to_num(torch.softmax(logits, dim=-1)[..., :columns], nan=0.0)
    result = torch.einsum("rhgql,rlhd->rqhgd", weights, v).reshape(group * q_len, heads, v.shape[-1])
    out.index_copy_(0, tokens, result.to(out.dtype))
    if lse is not None:  # -inf for a row that sees nothing (and no sink)
        values = torch.logsumexp(logits, dim=-1).permute(0, 3, 1, 2).reshape(group * q_len, heads)
        lse.index_copy_(0, tokens, values.to(lse.dtype))
