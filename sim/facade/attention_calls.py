"""torch_npu's fused-attention arguments as one call the simulator computes (`sim.attention`).

Theory of operation. ``npu_fused_infer_attention_score`` (v1) and ``_v2`` name the same
arguments differently (``actual_seq_lengths`` / ``actual_seq_qlen``, ``scale`` /
``softmax_scale``, ``num_heads`` / ``num_query_heads``, ``softmax_lse_flag`` /
``return_softmax_lse``). `FusedAttentionCall.from_v1` / `from_v2` read a call's bound
arguments (the contract table has already accepted them) into one description, and `run`
lays the layout out as flat tokens, the key/value as a `sim.attention.KVSource` and the
masks as a `sim.attention.Masking`, then computes.

Layouts (op docs :8112-8115 / v2 :8631-8634, torch-npu 2.13.0 ``_op_plugin_docs.py``):
``TND`` (query ``[T, N, D]``, requests by cumulative ``actual_seq_lengths``), ``BSH``
(``[B, S, N*D]``), ``BSND``, ``BNSD`` and ``BNSD_BSND`` (BNSD in, BSND out). Key/value are
a paged cache when ``block_table`` is given (``(blocknum, blocksize, H)``, or
``(blocknum, KV_N, blocksize, D)``: op docs :8220) with one KV length per request, else
unpaged in the query's layout (TND: cumulative ``actual_seq_lengths_kv``; the others: the
``S`` axis, per batch ``actual_seq_lengths_kv``). Outside TND a length list of one entry is
every batch's, a longer one gives the first B (:8082-8083), and at Q_S == 1 the query
lengths have no effect (:8082).

What the simulator does not model raises NotImplementedError naming the argument (a
card computes something there the simulator would not): quantisation (``dequant_*``,
``quant_*``, ``antiquant_*``, v2's ``out_dtype``), ``pse_shift``, left padding
(``query_padding_size``, ``kv_padding_size``), shared prefixes, MLA's rope inputs and the
layouts not listed above. Reserved arguments the docs mark unused (v1
``key_rope_antiquant_scale``; v2 ``quant_scale_p``, ``dequant_scale_key_rope`` and the
``*_dtype`` codes but ``out_dtype``) and the quantisation modes, which do nothing without
their scales, have no effect, as on a card.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch
from torch import Tensor

from sim.attention import KVSource, Masking, attend

__all__ = ["FusedAttentionCall", "MODELLED_LAYOUTS", "lse_shape", "output_shape"]

MODELLED_LAYOUTS = ("TND", "BSH", "BSND", "BNSD", "BNSD_BSND")

# Arguments whose effect the simulator does not model: given (not None), the call is refused.
_V1_NOT_MODELLED = (
    "pse_shift", "dequant_scale1", "quant_scale1", "dequant_scale2", "quant_scale2", "quant_offset2",
    "antiquant_scale", "antiquant_offset", "key_antiquant_scale", "key_antiquant_offset", "value_antiquant_scale",
    "value_antiquant_offset", "query_padding_size", "kv_padding_size", "key_shared_prefix", "value_shared_prefix",
    "actual_shared_prefix_len", "query_rope", "key_rope",
)
_V2_NOT_MODELLED = (
    "query_rope", "key_rope", "pse_shift", "dequant_scale_query", "dequant_scale_key", "dequant_offset_key",
    "dequant_scale_value", "dequant_offset_value", "quant_scale_out", "quant_offset_out", "out_dtype",
)


def _not_modelled(kernel: str, a: Mapping[str, Any], names: tuple[str, ...]) -> None:
    given = [name for name in names if a.get(name) is not None]
    if given:
        raise NotImplementedError(
            f"sim.facade does not model {kernel}'s {', '.join(given)} (quantisation, position bias, left padding, "
            "shared prefixes and MLA rope inputs are not simulated; docs/facade.md, the kernel audit table)"
        )
    layout = a.get("input_layout")
    if layout not in MODELLED_LAYOUTS:
        raise NotImplementedError(
            f"sim.facade models {kernel} in the layouts {', '.join(MODELLED_LAYOUTS)}, not input_layout={layout!r}"
        )


def _ints(values: Any) -> Optional[list[int]]:
    return None if values is None else [int(v) for v in values]


@dataclass(frozen=True)
class FusedAttentionCall:
    """One fused-attention call in the simulator's terms (v1 or v2 spelling)."""

    kernel: str
    query: Tensor
    key: Tensor
    value: Tensor
    layout: str
    heads: int
    kv_heads: int
    scale: float
    q_lengths: Optional[list[int]]
    kv_lengths: Optional[list[int]]
    block_table: Optional[Tensor]
    block_size: int
    atten_mask: Optional[Tensor]
    sparse_mode: int
    pre_tokens: int
    next_tokens: int
    inner_precise: int
    lse_flag: bool
    sink: Optional[Tensor] = None

    @classmethod
    def from_v1(cls, kernel: str, a: Mapping[str, Any]) -> "FusedAttentionCall":
        _not_modelled(kernel, a, _V1_NOT_MODELLED)
        heads = int(a["num_heads"])
        return cls(kernel, a["query"], a["key"], a["value"], str(a["input_layout"]), heads,
                   int(a["num_key_value_heads"]) or heads, float(a["scale"]), _ints(a["actual_seq_lengths"]),
                   _ints(a["actual_seq_lengths_kv"]), a["block_table"], int(a["block_size"]), a["atten_mask"],
                   int(a["sparse_mode"]), int(a["pre_tokens"]), int(a["next_tokens"]), int(a["inner_precise"]),
                   bool(a["softmax_lse_flag"]))

    @classmethod
    def from_v2(cls, kernel: str, a: Mapping[str, Any]) -> "FusedAttentionCall":
        _not_modelled(kernel, a, _V2_NOT_MODELLED)
        heads = int(a["num_query_heads"])
        return cls(kernel, a["query"], a["key"], a["value"], str(a["input_layout"]), heads,
                   int(a["num_key_value_heads"]) or heads, float(a["softmax_scale"]), _ints(a["actual_seq_qlen"]),
                   _ints(a["actual_seq_kvlen"]), a["block_table"], int(a["block_size"]), a["atten_mask"],
                   int(a["sparse_mode"]), int(a["pre_tokens"]), int(a["next_tokens"]), int(a["inner_precise"]),
                   bool(a["return_softmax_lse"]), a["learnable_sink"])

    # -- shapes
    @property
    def tnd(self) -> bool:
        return self.layout == "TND"

    def batch_and_s(self) -> tuple[int, int]:
        """(B, Q_S) of a non-TND query."""
        q = self.query
        if self.layout in ("BNSD", "BNSD_BSND"):
            return int(q.shape[0]), int(q.shape[2])
        return int(q.shape[0]), int(q.shape[1])

    def value_head_dim(self) -> int:
        value = self.value
        if self.block_table is not None:
            return int(value.shape[-1]) // self.kv_heads if value.dim() == 3 else int(value.shape[-1])
        if self.layout == "BSH":
            return int(value.shape[-1]) // self.kv_heads
        return int(value.shape[-1])

    def q_s(self) -> int:
        """The call's Q_S, which picks the incremental branch (Q_S == 1)."""
        if self.tnd:
            ends = self.q_lengths or []
            return max((b - a for a, b in zip([0, *ends[:-1]], ends)), default=0)
        return self.batch_and_s()[1]

    # -- the computation
    def run(self, out: Tensor, lse_out: Optional[Tensor] = None) -> None:
        """Compute into ``out`` (the layout's output shape) and, with the lse flag, ``lse_out``."""
        query, tokens, q_starts, q_lens = self._flat_query()
        heads, dv = self.heads, self.value_head_dim()
        flat_out = torch.zeros(tokens, heads, dv, dtype=out.dtype)
        lse = torch.full((tokens, heads), float("-inf"), dtype=torch.float32) if lse_out is not None else None
        kv, kv_lens = self._kv(len(q_lens))
        attend(query, q_starts, q_lens, kv_lens, kv, self._masking(), self.scale, flat_out, lse=lse, sink=self.sink)
        out.copy_(self._unflatten(flat_out, out.shape))
        if lse_out is not None and lse is not None:
            lse_out.copy_(self._unflatten_lse(lse).reshape(lse_out.shape))

    def _batch_lengths(self, values: Optional[list[int]], batch: int, full: int) -> list[int]:
        if values is None:
            return [full] * batch
        if len(values) == 1:
            return values * batch
        return values[:batch]

    def _flat_query(self) -> tuple[Tensor, int, list[int], list[int]]:
        q = self.query
        if self.tnd:
            ends = self.q_lengths or []
            starts = [0, *ends[:-1]]
            return q, int(q.shape[0]), starts, [b - a for a, b in zip(starts, ends)]
        batch, s = self.batch_and_s()
        heads = self.heads
        if self.layout == "BSH":
            flat = q.reshape(batch * s, heads, -1)
        elif self.layout == "BSND":
            flat = q.reshape(batch * s, heads, q.shape[-1])
        else:  # BNSD, BNSD_BSND
            flat = q.permute(0, 2, 1, 3).reshape(batch * s, heads, q.shape[-1])
        q_lens = [1] * batch if s == 1 else self._batch_lengths(self.q_lengths, batch, s)
        return flat, batch * s, [b * s for b in range(batch)], q_lens

    def _kv(self, requests: int) -> tuple[KVSource, list[int]]:
        key, value, kv_heads = self.key, self.value, self.kv_heads
        if self.block_table is not None:
            if key.dim() == 4:  # (blocknum, KV_N, blocksize, D)
                flat_k = key.permute(0, 2, 1, 3).reshape(-1, kv_heads, key.shape[-1])
                flat_v = value.permute(0, 2, 1, 3).reshape(-1, kv_heads, value.shape[-1])
            else:  # (blocknum, blocksize, H)
                flat_k = key.reshape(-1, kv_heads, key.shape[-1] // kv_heads)
                flat_v = value.reshape(-1, kv_heads, value.shape[-1] // kv_heads)
            lens = self._batch_lengths(self.kv_lengths, requests, 0)
            return KVSource(flat_k, flat_v, self.block_table, self.block_size), lens
        if self.tnd:
            ends = self.kv_lengths or []
            starts = [0, *ends[:-1]]
            return (KVSource(key, value, starts=starts), [b - a for a, b in zip(starts, ends)])
        batch = int(key.shape[0])
        if self.layout == "BSH":
            s_kv = int(key.shape[1])
            flat_k = key.reshape(batch * s_kv, kv_heads, -1)
            flat_v = value.reshape(batch * s_kv, kv_heads, -1)
        elif self.layout == "BSND":
            s_kv = int(key.shape[1])
            flat_k, flat_v = key.reshape(batch * s_kv, kv_heads, -1), value.reshape(batch * s_kv, kv_heads, -1)
        else:
            s_kv = int(key.shape[2])
            flat_k = key.permute(0, 2, 1, 3).reshape(batch * s_kv, kv_heads, -1)
            flat_v = value.permute(0, 2, 1, 3).reshape(batch * s_kv, kv_heads, -1)
        lens = self._batch_lengths(self.kv_lengths, requests, s_kv)
        return KVSource(flat_k, flat_v, starts=[b * s_kv for b in range(requests)]), lens

    def _masking(self) -> Masking:
        incremental = self.q_s() == 1
        mask = self.atten_mask
        full = None
        if mask is not None and self.sparse_mode in (0, 1):
            full = mask.to(torch.bool)
            if full.dim() == 4:  # (B or 1, 1, Q_S, KV_S)
                full = full[:, 0]
            elif full.dim() == 2:  # (Q_S, KV_S); at Q_S == 1 (B, KV_S)
                full = full.unsqueeze(1) if incremental and not self.tnd else full.unsqueeze(0)
        return Masking(self.sparse_mode, self.pre_tokens, self.next_tokens, incremental, full)

    def _unflatten(self, flat: Tensor, shape: torch.Size) -> Tensor:
        if self.tnd:
            return flat
        batch, s = self.batch_and_s()
        if self.layout == "BSH":
            return flat.reshape(batch, s, -1)
        if self.layout in ("BSND", "BNSD_BSND"):
            return flat.reshape(batch, s, self.heads, -1)
        return flat.reshape(batch, s, self.heads, -1).permute(0, 2, 1, 3)

    def _unflatten_lse(self, lse: Tensor) -> Tensor:
        if self.tnd:
            return lse.unsqueeze(-1)  # (T, N, 1)
        batch, s = self.batch_and_s()
        return lse.reshape(batch, s, self.heads).permute(0, 2, 1).unsqueeze(-1)  # (B, N, S, 1)


def output_shape(call: FusedAttentionCall) -> tuple[int, ...]:
    """attention_out's shape (op docs :8147: the query's, with value's D; BNSD_BSND: BSND)."""
    dv = call.value_head_dim()
    q = call.query
    if call.tnd:
        return (int(q.shape[0]), call.heads, dv)
    batch, s = call.batch_and_s()
    if call.layout == "BSH":
        return (batch, s, call.heads * dv)
    if call.layout in ("BSND", "BNSD_BSND"):
        return (batch, s, call.heads, dv)
    return (batch, call.heads, s, dv)


def lse_shape(call: FusedAttentionCall) -> tuple[int, ...]:
    """softmax_lse's shape (op docs :8148): TND (T, N, 1), else (B, N, S, 1); [1] without the flag."""
    if not call.lse_flag:
        return (1,)
    if call.tnd:
        return (int(call.query.shape[0]), call.heads, 1)
    batch, s = call.batch_and_s()
    return (batch, call.heads, s, 1)
