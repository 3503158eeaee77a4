"""The forward context: what one model forward needs besides its tensor inputs.

Theory of operation. vLLM keeps host-side attention metadata (sequence lengths, block
tables) *out* of the compiled graph's inputs so that one Dynamo compilation serves every
batch size; the attention op reads it from a context set around each forward. The graph
wrappers read the same context to learn the runtime mode (NONE / PIECEWISE / FULL) and the
batch descriptor to capture or replay.

The context is a `contextvars.ContextVar`: it is set by `set_forward_context(...)` for the
duration of one forward and holds only references to per-engine objects (KV caches, graph
parameters), so two engines in one process never see each other's state.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional, Protocol

import torch

from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import NoForwardContext
from ascendgraph.modes import GraphMode

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.device import Device

__all__ = [
    "AttentionMetadata",
    "fia_padded_lengths",
    "KVCache",
    "ForwardContext",
    "set_forward_context",
    "get_forward_context",
    "current_forward_context",
    "NoForwardContext",
    "FullGraphParams",
]


class FullGraphParams(Protocol):
    """What the attention op and the graph wrappers ask of an engine's FULL-graph parameters.

    The engine's `ascendgraph.runtime.params.GraphParams` implements it; naming only this
    here keeps the forward context (and the models and wrappers that read it) below the
    runtime. ``call`` is the attention layer's `ascendgraph.models.attention.AttentionCall`.
    """

    def capture_attention(self, descriptor: BatchDescriptor, call: Any) -> None:
        """Launch one attention call inside a FULL capture, remembering it for later updates."""

    def captured(self, descriptor: BatchDescriptor) -> None:
        """The capture of ``descriptor`` ended: what it allocated now belongs to the graph."""

    def discard(self, descriptor: BatchDescriptor) -> None:
        """Forget what a failed capture of ``descriptor`` recorded."""

    def clear(self) -> None:
        """Forget every graph's records (the engine released its graphs)."""


@dataclass(frozen=True)
class KVCache:
    """The paged key and value caches of one attention layer: [num_blocks, block_size, kv_heads, head_dim]."""

    key: torch.Tensor
    value: torch.Tensor

    @property
    def block_size(self) -> int:
        return int(self.key.shape[1])


@dataclass(frozen=True)
class AttentionMetadata:
    """Host and device metadata every attention layer of one forward shares.

    ``query_start_loc`` holds the cumulative END offsets of each request's query tokens
    (FIA's ``actual_seq_lengths``), ``seq_lens`` each request's KV length after this step;
    both are host lists of the *real* requests. ``block_table`` ([rows >= num_reqs,
    max_blocks]; the rows past the real requests are zero, at least one of them, for the
    FULL-graph dummy request of `fia_padded_lengths`) and ``slot_mapping`` ([num_tokens], -1
    for padding) are device tensors, views of the engine's persistent buffers so a captured
    graph reads fresh values. Attention hands the kernel ``block_table_for(n)``: exactly one
    row per request (the kernel contract ``block_table_rows``).
    """

    num_reqs: int
    num_actual_tokens: int
    num_tokens: int  # padded
    query_start_loc: list[int]
    seq_lens: list[int]
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    uniform_decode: bool = False
    query_len: int = 1  # 1 + num_speculative_tokens

    @property
    def query_lens(self) -> list[int]:
        starts = [0, *self.query_start_loc[:-1]]
        return [end - start for start, end in zip(starts, self.query_start_loc)]

    def block_table_for(self, requests: int) -> torch.Tensor:
        """The block table with exactly ``requests`` rows (the real ones, then zero rows)."""
        if requests > self.block_table.shape[0]:
            raise ValueError(
                f"{requests} attention requests but the block table holds {self.block_table.shape[0]} rows; "
                "the engine keeps one spare zero row for the FULL-graph dummy request"
            )
        return self.block_table[:requests]


def fia_padded_lengths(
    query_start_loc: list[int],
    seq_lens: list[int],
    *,
    num_tokens: int,
    uniform: bool,
    num_reqs_padded: int,
    query_len: int,
) -> tuple[list[int], list[int]]:
    """(actual_seq_lengths, actual_seq_lengths_kv) of a batch padded to ``num_tokens`` for FIA in TND.

    The kernel needs the query's token count to equal the last end (kernel contract
    ``tnd_tokens_equal_last_end``). Following vLLM Ascend (NPUModelRunner.
    _pad_query_start_loc_for_fia, vllm_ascend/worker/model_runner_v1.py; PR #6357):

    * uniform decode (``num_tokens == num_reqs_padded * query_len``): the batch keeps the
      graph's request count; each padded request gets ``query_len`` tokens and KV length 0;
    * mixed: the real requests, then ONE dummy request ending at ``num_tokens`` (KV length 0)
      when padding tokens exist, so the request count is the real one, plus one.

    Padded requests have KV length 0, which the kernels accept (vLLM Ascend pads
    ``seq_lens`` with zeros the same way).
    """
    ends, lens = [int(v) for v in query_start_loc], [int(v) for v in seq_lens]
    if len(ends) != len(lens):
        raise ValueError(f"{len(ends)} query ends but {len(lens)} KV lengths")
    last = ends[-1] if ends else 0
    if last > num_tokens:
        raise ValueError(f"the batch's query ends at {last}, past the {num_tokens} tokens it was padded to")
    if uniform and num_tokens == num_reqs_padded * query_len:
        if len(ends) > num_reqs_padded:
            raise ValueError(f"{len(ends)} requests do not fit a uniform graph of {num_reqs_padded}")
        padding = num_reqs_padded - len(ends)
        return ends + [last + query_len * (i + 1) for i in range(padding)], lens + [0] * padding
    if last < num_tokens:
        return ends + [num_tokens], lens + [0]
    return ends, lens


@dataclass
class ForwardContext:
    """Per-forward state read by graph wrappers and attention ops."""

    runtime_mode: GraphMode
    batch_descriptor: BatchDescriptor
    attn_metadata: Optional[AttentionMetadata]
    kv_caches: Mapping[str, KVCache]
    attention_layers: Mapping[str, Any] = field(default_factory=dict)  # layer name -> models.layers.Attention
    device: Optional["Device"] = None
    graph_params: Optional[FullGraphParams] = None
    extra: dict[str, Any] = field(default_factory=dict)


_CURRENT: contextvars.ContextVar[Optional[ForwardContext]] = contextvars.ContextVar(
    "ascendgraph_forward_context", default=None
)


@contextlib.contextmanager
def set_forward_context(context: ForwardContext) -> Iterator[ForwardContext]:
    """Make ``context`` current for the duration of one forward (nesting restores the outer one)."""
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)


def current_forward_context() -> Optional[ForwardContext]:
    """The current context, or None outside a forward."""
    return _CURRENT.get()


def get_forward_context() -> ForwardContext:
    """The current context; raises NoForwardContext with what to do when none is set."""
    context = _CURRENT.get()
    if context is None:
        raise NoForwardContext(
            "no forward context is set: run the model inside "
            "ascendgraph.forward_context.set_forward_context(ForwardContext(...)) "
            "(the engine does this for every step)"
        )
    return context
