"""Lowering the Dynamo graph to aten, and undoing functionalisation of ``out=`` ops.

aot_autograd turns the Dynamo graph into an aten-level graph (what the npugraph_ex
patterns match) and *functionalises* it: a custom op that writes into ``out`` becomes an
``auto_functionalized(_v2)`` node that clones ``out`` and returns the clone. For the
attention op that would break piecewise graphs: the attention output must be the buffer
allocated by the captured piece before it (a static address the next piece reads at
replay), not a fresh eager clone. `restore_out_mutations` turns those nodes back into
direct calls writing into the original buffer (vLLM's "fix functionalization" step).
"""

from __future__ import annotations

import operator
from typing import Any, Iterable

from torch import fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2
from torch._ops import OpOverload

__all__ = ["restore_out_mutations", "is_call_to"]


def is_call_to(node: fx.Node, ops: Iterable[OpOverload]) -> bool:
    """True when ``node`` calls one of ``ops`` directly or through auto_functionalized(_v2)."""
    targets = set(ops)
    if node.op != "call_function":
        return False
    if node.target in targets:
        return True
    if node.target in (auto_functionalized, auto_functionalized_v2):
        return node.args[0] in targets
    return False


def _mutable_arg_names(op: OpOverload) -> list[str]:
    return [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def _bases_for_v2(op: OpOverload, kwargs: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """Call kwargs with each mutable argument bound to its base tensor (v2 encoding)."""
    bases = list(kwargs.pop("_all_bases"))
    for name in _mutable_arg_names(op):
        index = kwargs.pop(f"_{name}_base_index")
        if f"_{name}_alias" in kwargs:
            kwargs.pop(f"_{name}_alias")
        if any(key.startswith(f"_{name}_") for key in kwargs):
            raise NotImplementedError(
                f"{op}: argument {name!r} is a view of a larger buffer; only whole buffers are supported as "
                "out= arguments of ops the compile backend un-functionalises"
            )
        kwargs[name] = None if index is None else bases[index]
    return kwargs, bases


def restore_out_mutations(graph_module: fx.GraphModule, ops: Iterable[OpOverload]) -> int:
    """Replace auto_functionalized calls of ``ops`` by direct mutating calls. Returns the count."""
    targets = set(ops)
    graph = graph_module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (auto_functionalized, auto_functionalized_v2):
            continue
        op = node.args[0]
        if op not in targets:
            continue
        kwargs = dict(node.kwargs)
        if node.target is auto_functionalized_v2:
            kwargs, outputs = _bases_for_v2(op, kwargs)
        else:
            outputs = [kwargs[name] for name in _mutable_arg_names(op)]
        with graph.inserting_before(node):
            call = graph.call_function(op, kwargs=kwargs)
        call.meta.update(node.meta)
        # Output 0 is the op's own return (None here); 1.. are the mutated buffers.
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                index = user.args[1]
                if index == 0:
                    user.replace_all_uses_with(call)
                else:
                    user.replace_all_uses_with(outputs[index - 1])
                graph.erase_node(user)
            else:  # pragma: no cover - aot only reads these outputs through getitem
                raise NotImplementedError(f"unexpected use {user.format_node()} of {node.format_node()}")
        graph.erase_node(node)
        count += 1
    if count:
        graph.lint()
        graph_module.recompile()
    return count


def example_value(node: fx.Node) -> Any:
    """The fake value recorded for a node (``meta['val']``), or None."""
    return node.meta.get("val", node.meta.get("example_value"))


def graph_input_shapes(graph_module: fx.GraphModule) -> list[Any]:
    """Placeholder fake values (debugging aid)."""
    return [example_value(n) for n in graph_module.graph.nodes if n.op == "placeholder"]


def count_calls(graph_module: fx.GraphModule, op: OpOverload) -> int:
    return sum(1 for n in graph_module.graph.nodes if n.op == "call_function" and n.target is op)

