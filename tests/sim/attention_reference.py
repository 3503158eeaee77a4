"""The fused attention as the op docs describe it, one query row at a time (tests only).

Written from torch-npu 2.13.0 ``torch_npu/_op_plugin_docs.py`` (v1 ``npu_fused_infer_attention_score``
:8050-8300; v2 :8577-8830), independently of the simulator's vectorised kernel
(sim/attention.py, sim/facade/attention_calls.py), so the property tests compare two
readings of the docs: this one walks every request, every query row and every head, and
decides for every key position whether the row sees it.

* ``attention_out = softmax(scale * q.k + mask) . v`` (:8053), per head, a GQA group of query
  heads sharing one KV head (:8116);
* request lengths: TND takes cumulative ``actual_seq_lengths`` (and, unpaged, cumulative
  ``actual_seq_lengths_kv``; paged, one KV length per request) (:8082, :8275); the other
  layouts one length per batch, or one for all, the S axis when None (:8082-8083), and at
  Q_S == 1 the query length is 1 (:8082);
* sparse modes (:8117-8123, the npu_fusion_attention table :1637-1645 for the corners):
  0 no mask = all; 0 with a mask = the band ``i - pre <= j <= i + next`` of the top-left
  corner and not masked; 1 = not masked; 2 = ``j <= i``; 3 = ``j <= i + kv_len - q_len``;
  4 = the band around the bottom-right diagonal; at Q_S == 1 the mode and pre/next tokens
  do nothing (:8110, 8111, 8117), a full mask still masks;
* a row that sees nothing: zeros and log-sum-exp -inf (with a v2 learnable sink, whose logit
  is in every row's denominator, the sink's logit);
* softmax_lse (:8148): TND (T, N, 1), otherwise (B, N, S, 1).
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import torch
from torch import Tensor

__all__ = ["fused_attention", "paged_attention_decode"]


def _ends_to_lengths(ends: list[int]) -> list[int]:
    return [b - a for a, b in zip([0, *ends[:-1]], ends)]


def _per_batch(values: Optional[list[int]], batch: int, default: int) -> list[int]:
    if values is None:
        return [default] * batch
    values = [int(v) for v in values]
    return values * batch if len(values) == 1 else values[:batch]


def _sees(i: int, j: int, q_len: int, kv_len: int, mode: int, pre: int, nxt: int, incremental: bool,
          masked: Optional[bool]) -> bool:
    if j >= kv_len:
        return False
    if incremental:
        return not masked if masked is not None else True
    if mode == 0:
        if masked is None:
            return True
        return i - pre <= j <= i + nxt and not masked
    if mode == 1:
        return not masked
    if mode == 2:
        return j <= i
    diagonal = i + kv_len - q_len
    if mode == 3:
        return j <= diagonal
    if mode == 4:
        return diagonal - pre <= j <= diagonal + nxt
    raise AssertionError(f"sparse_mode {mode}")


def fused_attention(a: Mapping[str, Any], *, v2: bool = False) -> tuple[Tensor, Tensor]:
    """(attention_out in float32, softmax_lse) of one call, arguments keyed by the schema's names."""
    q_name, kv_name = ("actual_seq_qlen", "actual_seq_kvlen") if v2 else ("actual_seq_lengths", "actual_seq_lengths_kv")
    heads = int(a["num_query_heads" if v2 else "num_heads"])
    kv_heads = int(a.get("num_key_value_heads") or 0) or heads
    scale = float(a["softmax_scale" if v2 else "scale"])
    sink = a.get("learnable_sink") if v2 else None
    layout = a["input_layout"]
    query, key, value = a["query"].double(), a["key"].double(), a["value"].double()
    table = a.get("block_table")
    block_size = int(a.get("block_size") or 0)
    mode = int(a.get("sparse_mode", 0))
    pre, nxt = int(a.get("pre_tokens", 2147483647)), int(a.get("next_tokens", 2147483647))
    mask = a.get("atten_mask")
    full_mask = mask is not None and mode in (0, 1)

    # The query rows of every request: (q rows [q_len, N, D], where each row goes in the output).
    if layout == "TND":
        ends = [int(v) for v in a[q_name]]
        q_lens = _ends_to_lengths(ends)
        starts = [e - q for e, q in zip(ends, q_lens)]
        batch, q_s = len(ends), max(q_lens, default=0)
        rows_of = [query[s:s + q] for s, q in zip(starts, q_lens)]
    else:
        batch = int(query.shape[0])
        if layout == "BSH":
            q4 = query.reshape(batch, query.shape[1], heads, -1)
        elif layout == "BSND":
            q4 = query
        else:  # BNSD, BNSD_BSND
            q4 = query.permute(0, 2, 1, 3)
        q_s = int(q4.shape[1])
        q_lens = [1] * batch if q_s == 1 else _per_batch(a.get(q_name), batch, q_s)
        rows_of = [q4[b, :q_lens[b]] for b in range(batch)]
    incremental = q_s == 1

    # Every request's key/value positions, one at a time.
    def kv_rows(r: int, kv_len: int) -> tuple[Tensor, Tensor]:
        ks, vs = [], []
        for p in range(kv_len):
            if table is not None:
                block, offset = int(table[r, p // block_size]), p % block_size
                if key.dim() == 3:
                    k, v = key[block, offset].reshape(kv_heads, -1), value[block, offset].reshape(kv_heads, -1)
                else:
                    k, v = key[block, :, offset], value[block, :, offset]
            elif layout == "TND":
                k, v = key[kv_starts[r] + p], value[kv_starts[r] + p]
            elif layout == "BSH":
                k, v = key[r, p].reshape(kv_heads, -1), value[r, p].reshape(kv_heads, -1)
            elif layout == "BSND":
                k, v = key[r, p], value[r, p]
            else:
                k, v = key[r, :, p], value[r, :, p]
            ks.append(k)
            vs.append(v)
        dv = value.shape[-1] // kv_heads if (value.dim() == 3 and (table is not None or layout == "BSH")) else value.shape[-1]
        if not ks:
            return torch.zeros(0, kv_heads, query.shape[-1] if layout != "BSH" else query.shape[-1] // heads,
                               dtype=torch.float64), torch.zeros(0, kv_heads, dv, dtype=torch.float64)
        return torch.stack(ks), torch.stack(vs)

    if table is not None:
        kv_lens = _per_batch(a.get(kv_name), batch, 0)
        kv_starts = [0] * batch
    elif layout == "TND":
        kv_ends = [int(v) for v in a[kv_name]]
        kv_lens = _ends_to_lengths(kv_ends)
        kv_starts = [e - n for e, n in zip(kv_ends, kv_lens)]
    else:
        axis = 2 if layout in ("BNSD", "BNSD_BSND") else 1
        kv_lens = _per_batch(a.get(kv_name), batch, int(key.shape[axis]))
        kv_starts = [0] * batch

    def masked_at(r: int, i: int, j: int) -> Optional[bool]:
        if not full_mask:
            return None
        m = mask.bool()
        if m.dim() == 4:
            m = m[r if m.shape[0] > 1 else 0, 0]
        elif m.dim() == 3:
            m = m[0]
        elif incremental and layout != "TND":  # (B, KV_S)
            return bool(m[r, j]) if j < m.shape[1] else True
        return bool(m[i, j]) if i < m.shape[0] and j < m.shape[1] else True

    value_dim = None
    outputs, lses = [], []
    for r in range(batch):
        q_rows = rows_of[r].reshape(len(rows_of[r]), heads, -1) if len(rows_of[r]) else rows_of[r]
        k, v = kv_rows(r, kv_lens[r])
        value_dim = v.shape[-1]
        out_r = torch.zeros(q_lens[r], heads, value_dim, dtype=torch.float64)
        lse_r = torch.full((q_lens[r], heads), float("-inf"), dtype=torch.float64)
        for i in range(q_lens[r]):
            seen = [j for j in range(kv_lens[r])
                    if _sees(i, j, q_lens[r], kv_lens[r], mode, pre, nxt, incremental, masked_at(r, i, j))]
            if kv_lens[r] == 0:  # no key/value at all: zeros (:8154)
                continue
            for h in range(heads):
                kh = h // (heads // kv_heads)
                logits = (scale * (k[seen, kh] @ q_rows[i, h])).tolist()
                extra = [float(sink[h])] if sink is not None else []
                if not logits and not extra:
                    continue
                top = max(logits + extra)
                weights = [math.exp(x - top) for x in logits]
                total = sum(weights) + sum(math.exp(x - top) for x in extra)
                for w, j in zip(weights, seen):
                    out_r[i, h] += (w / total) * v[j, kh]
                lse_r[i, h] = top + math.log(total)
        outputs.append(out_r)
        lses.append(lse_r)

    dv = value_dim if value_dim is not None else query.shape[-1]
    if layout == "TND":
        out = torch.cat(outputs) if outputs else torch.zeros(0, heads, dv, dtype=torch.float64)
        lse = (torch.cat(lses) if lses else torch.zeros(0, heads, dtype=torch.float64)).unsqueeze(-1)
        return out.float(), lse.float()
    out = torch.zeros(batch, q_s, heads, dv, dtype=torch.float64)
    lse = torch.full((batch, q_s, heads), float("-inf"), dtype=torch.float64)
    for b in range(batch):
        out[b, :q_lens[b]] = outputs[b]
        lse[b, :q_lens[b]] = lses[b]
    lse = lse.permute(0, 2, 1).unsqueeze(-1)
    if layout == "BSH":
        return out.reshape(batch, q_s, heads * dv).float(), lse.float()
    if layout in ("BSND", "BNSD_BSND"):
        return out.float(), lse.float()
    return out.permute(0, 2, 1, 3).float(), lse.float()


def paged_attention_decode(query: Tensor, key_cache: Tensor, value_cache: Tensor, block_table: Tensor,
                           context_lens: list[int], scale: float) -> Tensor:
    """ATB's ``_npu_paged_attention``: token t attends to positions [0, context_lens[t]) of row t."""
    tokens, heads, _ = query.shape
    block_size, kv_heads = key_cache.shape[1], key_cache.shape[2]
    out = torch.zeros(query.shape, dtype=torch.float64)
    for t in range(tokens):
        for h in range(heads):
            kh = h // (heads // kv_heads)
            logits, values = [], []
            for p in range(context_lens[t]):
                block = int(block_table[t, p // block_size])
                logits.append(scale * float(query[t, h].double() @ key_cache[block, p % block_size, kh].double()))
                values.append(value_cache[block, p % block_size, kh].double())
            if not logits:
                continue
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            out[t, h] = sum((w / total) * v for w, v in zip(weights, values))
    return out.float()
