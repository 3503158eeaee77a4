"""The stream-scope rule of npugraph_ex fusions (docs/semantics.md §10).

A fusion merges several nodes into one kernel, which runs on one stream. Nodes placed on
different streams (multistream overlap, e.g. shared experts beside routed ones) must stay
apart, so a candidate match is refused unless all its nodes carry the *same* stream label:

    labels          fused?   why
    [None, None]    yes      nothing placed on a side stream: the current stream
    [s1, s1]        yes      one side stream
    [s1, s2]        no       two streams
    [None, s1]      no       the current stream and a side stream

A node's label is ``node.meta["stream_label"]`` (the key torch_npu's npugraph_ex and vLLM
Ascend's pass checks read; absent means None). Fused nodes inherit the label of the nodes
they replace.
"""

from __future__ import annotations

from typing import Any, Hashable, Iterable, Optional

from torch import fx

__all__ = ["STREAM_LABEL_KEY", "same_stream_scope", "stream_label", "call_labels"]

STREAM_LABEL_KEY = "stream_label"


def same_stream_scope(labels: Iterable[Optional[Hashable]]) -> bool:
    """True when every label is the same one (all None, or all one stream); see the table above."""
    return len(set(labels)) <= 1


def stream_label(node: fx.Node) -> Any:
    """The stream label of a node: ``meta["stream_label"]``, else the same key in ``meta["custom"]``
    (where a traced replacement carries it), else None."""
    if STREAM_LABEL_KEY in node.meta:
        return node.meta[STREAM_LABEL_KEY]
    custom = node.meta.get("custom")
    if isinstance(custom, dict):
        return custom.get(STREAM_LABEL_KEY)
    return None


def call_labels(nodes: Iterable[fx.Node]) -> list[Any]:
    """Stream labels of the call_function nodes among ``nodes`` (the ones that launch work)."""
    return [stream_label(node) for node in nodes if node.op == "call_function"]
