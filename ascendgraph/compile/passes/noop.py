"""No-op view/reshape elimination: a ``view`` / ``reshape`` to the shape its input already
has is replaced by the input.

Such nodes appear when model code reshapes defensively (``x.view(tokens, hidden)`` on a
tensor that is already ``[tokens, hidden]``); removed, they no longer sit between the
nodes of a fusion pattern. Shapes are compared on the nodes' fake values with symbolic
sizes, so ``[u0, 512] -> [u0, 512]`` is a no-op whatever num_tokens is, and a node whose
sizes are only equal for some num_tokens is kept.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx
from torch.fx.experimental.symbolic_shapes import statically_known_true

__all__ = ["NoopEliminationPass", "NOOP_VIEW_OPS"]

aten = torch.ops.aten

# The reshaping ops this pass may drop: each returns its input's data with a new shape
# (a view, or a copy only when a view is impossible — never for an unchanged shape).
NOOP_VIEW_OPS = frozenset({aten.view.default, aten.reshape.default, aten._unsafe_view.default})


def _value(node: Any) -> Any:
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _same_shape(before: Any, after: Any) -> bool:
    if not isinstance(before, torch.Tensor) or not isinstance(after, torch.Tensor):
        return False
    if before.dtype != after.dtype or before.dim() != after.dim():
        return False
    return all(statically_known_true(a == b) for a, b in zip(before.shape, after.shape))


class NoopEliminationPass:
    """Drops view/reshape nodes that keep their input's shape. Returns how many."""

    name = "noop_elimination"

    def __call__(self, graph_module: fx.GraphModule) -> int:
        graph = graph_module.graph
        removed = 0
        for node in list(graph.nodes):
            if node.op != "call_function" or node.target not in NOOP_VIEW_OPS or not node.args:
                continue
            source = node.args[0]
            if not _same_shape(_value(source), _value(node)):
                continue
            node.replace_all_uses_with(source)
            graph.erase_node(node)
            removed += 1
        return removed

    def __repr__(self) -> str:
        return "NoopEliminationPass()"
