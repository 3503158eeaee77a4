"""Splitting the aten graph at attention for piecewise modes.

`split_at_attention(gm, ops)` cuts the graph before and after every call to a splitting
op (the model's attention op): L attention layers give 2L + 1 submodules, of which the
L + 1 between attentions are captured as PIECEWISE graphs per size and the L attention
submodules run eagerly between them (their host metadata changes every step).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from torch import fx
from torch._ops import OpOverload
from torch.fx.passes.split_module import split_module

from ascendgraph.compile.lowering import is_call_to

__all__ = ["SplitGraph", "split_at_attention"]


@dataclass(frozen=True)
class SplitGraph:
    """The split module and the names of its submodules, in execution order."""

    module: fx.GraphModule
    submodule_names: list[str]
    splitting_submodules: list[str]  # run eagerly (attention)

    @property
    def piecewise_submodules(self) -> list[str]:
        """The submodules captured as PIECEWISE graphs (everything between attentions)."""
        return [n for n in self.submodule_names if n not in self.splitting_submodules]


def split_at_attention(graph_module: fx.GraphModule, splitting_ops: Iterable[OpOverload]) -> SplitGraph:
    """Split ``graph_module`` so every splitting-op call sits alone in its own submodule."""
    ops = list(splitting_ops)
    partition_of: dict[fx.Node, int] = {}
    splitting: set[int] = set()
    partition = 0
    for node in graph_module.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if is_call_to(node, ops):
            partition += 1
            partition_of[node] = partition
            splitting.add(partition)
            partition += 1
        else:
            partition_of[node] = partition
    split = split_module(
        graph_module, None, lambda node: partition_of[node], keep_original_order=True  # type: ignore[arg-type]  # the root module only resolves get_attr nodes: a traced graph has none left
    )
    names = [
        node.target
        for node in split.graph.nodes
        if node.op == "call_module" and isinstance(node.target, str) and node.target.startswith("submod_")
    ]
    splitting_names = [name for name in names if int(name.split("_")[1]) in splitting]
    return SplitGraph(module=split, submodule_names=names, splitting_submodules=splitting_names)
