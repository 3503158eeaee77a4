"""Replacing matches: the rewriting half of the fusion passes' engine (after
`ascendgraph.compile.passes.matcher`, whose docstring says whose semantics both keep).

A `PatternRewriter` keeps its registrations by anchor (the op and target of a search
pattern's first output) and, in `PatternRewriter.apply`, tries them on every anchor node of
a graph, replacing each match its check accepts by the replacement traced with the match's
own fake values (torch 2.13.0, torch/_inductor/pattern_matcher.py ``PatternMatcherPass.apply``,
``register_replacement``'s ``check_fn``, ``ReplacementPatternEntry.replace_with_graph``):

===============================  =============================================================
rule                             how
===============================  =============================================================
order                            anchors last to first; per anchor, registrations in order;
                                 an anchor erased by an earlier replacement is skipped; nodes
                                 a replacement inserts are not anchors in the same sweep
mutation regions                 a match may not span a mutating op (a node whose schema is
                                 mutable); inductor numbers the regions in ``meta``, we count
                                 mutating ops between the first and the last matched node
``meta["custom"]["stream"]``     a match whose nodes carry different values is refused
unsupported anchors              an anchor with complex, meta or sparse tensors (inductor's
                                 ``fallback_node_due_to_unsupported_type``,
                                 torch/_inductor/lowering.py) is not tried
replacement                      traced per match under the match's fake mode, on fresh
                                 tensors of the bound values' sizes and strides; inserted
                                 before the earliest output node; outputs rewired, matched
                                 nodes left without users erased, unused inserted nodes too
meta                             inserted nodes copy the traced replacement's copyable meta
                                 (``torch.fx.proxy._COPY_META_FIELDS``, ``stack_trace``,
                                 ``val``); a replacement output then takes the copyable meta
                                 of the node it replaces
===============================  =============================================================
"""

from __future__ import annotations

import itertools
import logging
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch._ops import OpOverload

from ascendgraph.compile.passes.matcher import Match, SearchPattern, trace

__all__ = ["PatternRewriter"]

log = logging.getLogger(__name__)


def _copyable_meta_keys() -> Sequence[str]:
    """The meta a node keeps when it is copied into another graph (torch.fx.proxy)."""
    from torch.fx.proxy import _COPY_META_FIELDS

    return _COPY_META_FIELDS


# --------------------------------------------------------------------------- graph conditions

# torch/_inductor/pattern_matcher.py `_mutation_op_re`: names of mutating functions and methods
_MUTATING_NAME = re.compile(r"(?<!_)(_$|_[.]|(\b|_)(set|enter|exit|seed)(\b|_))(?!_)")


def _mutates(node: fx.Node) -> bool:
    target = node.target
    if isinstance(target, OpOverload) and str(target) != "inductor.resize_storage_bytes_.default":
        return bool(target._schema.is_mutable)
    if type(target).__name__ == "AutoFunctionalized":
        return False
    if node.op == "call_function" and _MUTATING_NAME.search(getattr(target, "__name__", "")):
        return True
    if node.op == "call_method" and _MUTATING_NAME.search(str(target)):
        return True
    return node.kwargs.get("out") is not None


def _one_mutation_region(nodes: Sequence[fx.Node]) -> bool:
    """No mutating op after the first matched node up to the last (a mutating op opens a region)."""
    first, last = min(nodes), max(nodes)
    node = first
    while node is not last:
        node = node.next
        if _mutates(node):
            return False
    return True


def _one_custom_stream(nodes: Sequence[fx.Node]) -> bool:
    return len({node.meta.get("custom", {}).get("stream", 0) for node in nodes}) == 1


def _unsupported_tensor(value: Any, node: fx.Node, is_output: bool) -> bool:
    if is_output and value.is_complex() and node.target in _complex_views():
        return False
    if value.is_complex() or value.is_meta or value.is_sparse:
        return True
    if value.dtype == getattr(torch, "float8_e8m0fnu", None):
        target = node.target
        allowed = isinstance(target, OpOverload) and (target.is_view or target in _e8m0_ops())
        return not allowed
    return False


def _complex_views() -> tuple[Any, ...]:
    return (torch.ops.aten.view.dtype, torch.ops.prims.convert_element_type.default)


def _e8m0_ops() -> tuple[Any, ...]:
    """The ops inductor lets touch float8_e8m0fnu tensors besides views (bit casts, copies, scaled mm)."""
    aten = torch.ops.aten
    names = ("view.dtype", "cat.default", "clone.default", "_scaled_mm.default", "_scaled_mm_v2.default")
    ops = []
    for name in names:
        packet, overload = name.split(".")
        if hasattr(aten, packet):
            ops.append(getattr(getattr(aten, packet), overload))
    return tuple(ops)


def _unsupported_anchor(node: fx.Node) -> bool:
    """Inductor leaves anchors alone whose tensors it cannot compile (complex, meta, sparse)."""
    from torch._subclasses.fake_tensor import FakeTensor

    if node.op == "placeholder" or node.target in (torch.ops.aten.view_as_complex.default,
                                                  torch.ops.aten.lift_fresh_copy.default):
        return False

    def unsupported(value_node: Any, is_output: bool) -> bool:
        if not isinstance(value_node, fx.Node) or "val" not in value_node.meta:
            return False
        return any(
            isinstance(v, FakeTensor) and _unsupported_tensor(v, node, is_output)
            for v in pytree.tree_leaves(value_node.meta["val"])
        )

    if any(unsupported(arg, False) for arg in pytree.arg_tree_leaves(*node.args, **node.kwargs)):
        return True
    return unsupported(node, True)


# --------------------------------------------------------------------------- rewriting


def _value(node: fx.Node) -> Any:
    return node.meta["val"] if "val" in node.meta else node.meta["example_value"]


def _transfer_meta(new: dict[str, Any], old: fx.Node) -> None:
    """``old``'s copyable meta onto a new node's; its ``val`` / ``tensor_meta`` only where the new has none."""
    copied = _copyable_meta_keys()
    new.update((key, value) for key, value in old.meta.items() if key in copied)
    if "stack_trace" in old.meta:
        new["stack_trace"] = old.meta["stack_trace"]
    for key in ("val", "tensor_meta"):
        if key not in new and key in old.meta:
            new[key] = old.meta[key]


def _fresh_arguments(match: Match, argnames: Sequence[str]) -> tuple[Any, list[Any]]:
    """The fake mode of a match's bound values and, in it, fresh tensors of their sizes, strides,
    dtypes and devices (Python scalars as bound), one per search argument."""
    from torch._guards import detect_fake_mode

    missing = [name for name in argnames if name not in match.kwargs]
    if missing:
        raise RuntimeError(f"search arguments {missing} are not bound by the match: does the search function use them?")
    values = list(fx.node.map_arg([match.kwargs[name] for name in argnames], _value))
    fake_mode = detect_fake_mode(values)
    if fake_mode is None:
        raise RuntimeError("the matched nodes carry no fake values (meta['val']): trace the graph with fake tensors")
    with fake_mode:
        fresh = [
            torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=v.device) if isinstance(v, torch.Tensor) else v
            for v in values
        ]
    return fake_mode, fresh


@dataclass
class _Registration:
    name: str
    pattern: SearchPattern
    argnames: list[str]
    replace: Callable[..., Any]
    check: Callable[[Match], bool]

    def replacement(self, match: Match) -> Optional[fx.GraphModule]:
        """The replacement traced for an accepted match (under the match's fake mode, so sizes that
        depend on num_tokens stay symbolic), None when ``check`` refuses it."""
        fake_mode, args = _fresh_arguments(match, self.argnames)
        with fake_mode:
            if not self.check(match):
                return None
            graph_module = trace(self.replace, args)
        if len(match.nodes) == 1:
            for node in graph_module.graph.nodes:
                _transfer_meta(node.meta, match.nodes[0])
        return graph_module


@dataclass
class PatternRewriter:
    """Registrations by anchor; `apply` replaces the accepted matches in a graph."""

    name: str
    registrations: dict[tuple[str, Any], list[_Registration]] = field(default_factory=dict)

    def register(
        self,
        name: str,
        pattern: SearchPattern,
        argnames: Sequence[str],
        replace: Callable[..., Any],
        check: Callable[[Match], bool],
    ) -> None:
        """Replace the matches of ``pattern`` that ``check`` accepts by ``replace`` called with the
        match's values of ``argnames`` (in that order)."""
        registration = _Registration(name, pattern, list(argnames), replace, check)
        self.registrations.setdefault(pattern.anchor, []).append(registration)

    def apply(self, graph: fx.Graph) -> int:
        """Replace the accepted matches (see the module docstring's order); how many were replaced."""
        if not self.registrations:
            return 0
        anchors = [graph.find_nodes(op=op, target=target, sort=False) for op, target in self.registrations]
        count = 0
        for node in sorted(itertools.chain.from_iterable(anchors), reverse=True):
            if _unsupported_anchor(node):
                continue
            for registration in self.registrations[(node.op, node.target)]:
                if node._erased:
                    break
                match = registration.pattern.match(node)
                if match is None or not _one_mutation_region(match.nodes) or not _one_custom_stream(match.nodes):
                    continue
                replacement = registration.replacement(match)
                if replacement is None:
                    continue
                count += 1
                _replace(match, graph, replacement, [match.kwargs[name] for name in registration.argnames])
                log.debug("pass %s: replaced a match of %s at %s", self.name, registration.name, node.name)
        return count


def _replace(match: Match, graph: fx.Graph, replacement: fx.GraphModule, arguments: Sequence[Any]) -> None:
    """Insert ``replacement`` before the earliest output node of the match, rewire the outputs'
    users to its outputs, erase what is left unused."""
    outputs = match.output_nodes()
    insert_before = outputs[0] if len(outputs) == 1 else min(n for n in outputs if isinstance(n, fx.Node))
    assert insert_before is not None
    added: list[fx.Node] = []
    env: dict[fx.Node, Any] = {}
    results: Any = None
    inputs = iter(arguments)
    with graph.inserting_before(insert_before):
        for node in replacement.graph.nodes:
            if node.op == "placeholder":
                env[node] = next(inputs)
            elif node.op == "call_function":
                args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
                new = graph.call_function(node.target, args, kwargs)
                added.append(new)
                _transfer_meta(new.meta, node)
                if "eager_input_vals" in node.meta:
                    new.meta["eager_input_vals"] = node.meta["eager_input_vals"]
                env[node] = new
            elif node.op == "output":
                results = fx.node.map_arg(node.args[0], env.__getitem__)
            else:
                raise ValueError(f"a replacement may only call ops, it has a {node.op} node ({node.name})")
        news = [results] if isinstance(results, fx.Node) else results
        inputs_flat = set(pytree.tree_leaves(list(arguments)))

        def rewire(old: Optional[fx.Node], new: Any) -> None:
            if old is None:
                return
            if new is None:
                old.replace_all_uses_with(None, delete_user_cb=lambda user: user not in added)  # type: ignore[arg-type]  # a replacement output None drops the uses, as inductor does
                if not old.users:
                    graph.erase_node(old)
                return
            if isinstance(new, fx.Node):
                _transfer_meta(new.meta, old)
                for tag in ("recompute", "ac_graph_id"):
                    if tag in old.meta:
                        _percolate(new, tag, old.meta[tag], inputs_flat)
                old.replace_all_uses_with(new, delete_user_cb=lambda user: user not in added)
                if not old.users:
                    graph.erase_node(old)
                return
            # one packed output replaced by several: its getitem users take the matching element
            for user in list(old.users):
                index = user.args[1] if user.op == "call_function" and user.target is operator.getitem else None
                if index is None:
                    old.replace_all_uses_with(new)
                else:
                    rewire(user, new[index])
            graph.erase_node(old)

        if len(outputs) == len(news):
            for old, new in zip(outputs, news):
                rewire(old, new)
        else:
            assert len(outputs) == 1, "a replacement returns as many values as its search function"
            rewire(outputs[0], news)
    for node in reversed(match.nodes):
        if not node._erased and not node.users:
            graph.erase_node(node)
    for node in reversed(added):
        if not node.users and not node.is_impure() and not isinstance(node.target, torch._ops.HigherOrderOperator):
            graph.erase_node(node)


def _percolate(node: fx.Node, tag: str, value: Any, stops: set[Any]) -> None:
    """Activation-checkpointing tags of a replaced output spread over the replacement's nodes."""
    queue, seen = [node], set()
    while queue:
        current = queue.pop()
        if current in seen or current in stops or not hasattr(current, "meta"):
            continue
        seen.add(current)
        current.meta[tag] = value
        queue.extend(current.all_input_nodes)
