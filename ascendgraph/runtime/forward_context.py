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
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Optional

import torch

from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.modes import GraphMode

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.device import Device
    from ascendgraph.runtime.params import GraphParams

__all__ = [
    "AttentionMetadata",
    "KVCache",
    "ForwardContext",
    "set_forward_context",
    "get_forward_context",
    "current_forward_context",
    "NoForwardContext",
]


class NoForwardContext(RuntimeError):
    """An attention op or graph wrapper ran outside `set_forward_context`."""


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
    max_blocks]) and ``slot_mapping`` ([num_tokens], -1 for padding) are device tensors,
    views of the engine's persistent buffers so a captured graph reads fresh values.
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


@dataclass
class ForwardContext:
    """Per-forward state read by graph wrappers and attention ops."""

    runtime_mode: GraphMode
    batch_descriptor: BatchDescriptor
    attn_metadata: Optional[AttentionMetadata]
    kv_caches: Mapping[str, KVCache]
    attention_layers: Mapping[str, Any] = field(default_factory=dict)  # layer name -> models.layers.Attention
    device: Optional["Device"] = None
    graph_params: Optional["GraphParams"] = None
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
            "ascendgraph.runtime.forward_context.set_forward_context(ForwardContext(...)) "
            "(the engine does this for every step)"
        )
    return context
