"""A search pattern matcher on torch.fx alone: the matching half of the fusion passes' engine.

Theory of operation. A search function is traced once (`trace`, ``make_fx`` without
decompositions) and its graph turned into a `SearchPattern`: one `_Call` per call node
(target, literal arguments, number of users), one `_Input` per search argument, and
`_Wildcard` for the literals whose type the pattern ignores. `SearchPattern.match(node)`
walks the pattern down from ``node`` (the node its first output sits on) and returns a
`Match` (what each search argument is bound to, the matched nodes, inputs before their
users) or None. `ascendgraph.compile.passes.rewrite` replaces the matches.

Together the two modules re-implement the semantics of the matcher ascendgraph used before,
torch's inductor pattern matcher (torch 2.13.0, torch/_inductor/pattern_matcher.py:
``fx_to_pattern``, ``MatchContext``, ``_TargetArgsExpr._match``, ``MultiOutputPattern``,
``register_replacement``'s ``check_fn``, ``ReplacementPatternEntry.replace_with_graph``,
``PatternMatcherPass.apply``), so the graph after the passes is the one inductor's gave
(tests/unit/test_matcher_differential.py compares them), without importing
``torch._inductor.pattern_matcher``: its import brings ``torch._inductor.lowering``, the
kernel templates and the decompositions, about half a second of a first run. The rules of
matching:

===============================  =============================================================
rule                             how
===============================  =============================================================
ops and literals                 a node matches a `_Call` when its target, its number of
                                 positional arguments, the structure of its arguments and
                                 every literal are equal (``!=``: eps is compared as a
                                 number); keyword arguments the pattern does not name are
                                 not compared
wildcards                        literals of a pattern's ``ignore_types`` (exact type, so
                                 ``bool`` is not an ``int``; a list whose items are all
                                 wildcards is one) match anything; getitem indices never do
scalar workaround                a literal equal to a ``scalar_workaround`` example value is
                                 that search argument: bound to whatever the graph has there
one binding per argument         a search argument or a pattern node met twice must meet the
                                 same graph value both times
escaping intermediates           a non-output pattern node must have exactly as many users in
                                 the graph as in the search graph (else a value it computes
                                 is used outside the match)
multiple outputs                 the first output is matched from the anchor; each further
                                 output from the users of nodes already matched
===============================  =============================================================

What inductor does that this does not: the duplicate-pattern refusal at registration, the
no-op removal of the traced patterns (``remove_noop_ops``: the patterns ascendgraph traces
contain no no-op, and the differential test checks the traced graphs are inductor's), its
debug logging and counters, provenance entries (``INDUCTOR_PROVENANCE``), CUDA's fp8 support
check, ``disable_cpp_codegen`` and training (joint forward/backward) patterns.
"""

from __future__ import annotations

import itertools
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
import torch.utils._pytree as pytree
from torch import fx
from torch.fx.immutable_collections import immutable_dict, immutable_list

__all__ = ["Match", "SearchPattern", "trace"]


def trace(fn: Callable[..., Any], args: Sequence[Any]) -> fx.GraphModule:
    """``fn`` traced to aten ops without decompositions (the graphs the backend hands to the
    passes are aot_autograd's, which keep ops such as ``mean`` whole); dead nodes removed.
    Annotations (``torch.fx.traceback.annotate``) reach the nodes' ``meta["custom"]``."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.traceback import preserve_node_meta

    with torch.no_grad(), enable_python_dispatcher(), preserve_node_meta():
        graph_module = make_fx(fn, {}, tracing_mode="real")(*args)
    graph_module.graph.eliminate_dead_code()
    graph_module.recompile()
    return graph_module


# --------------------------------------------------------------------------- pattern nodes


class _Expr:
    """A pattern node; identity matters (a node met twice binds one graph value)."""


class _Input(_Expr):
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"_Input({self.name!r})"


class _Wildcard(_Expr):
    def __repr__(self) -> str:
        return "*"


_LIST_TYPES: dict[type, type] = {immutable_list: tuple, list: tuple, immutable_dict: dict}


def _canonical(value: Any) -> Any:
    """Lists as tuples, immutable dicts as dicts, so a pattern's and a node's arguments flatten alike."""
    convert = _LIST_TYPES.get(type(value))
    if convert is None:
        return value
    return pytree.tree_map(_canonical, convert(value), is_leaf=lambda v: type(v) in _LIST_TYPES)


def _flatten(args: Sequence[Any], kwargs: dict[str, Any], nested: bool) -> tuple[list[Any], Any]:
    if not nested:
        return [*args, *kwargs.values()], (len(args), *kwargs.keys())
    tree = pytree.tree_map(_canonical, (tuple(args), dict(kwargs)), is_leaf=lambda v: type(v) in _LIST_TYPES)
    leaves, spec = pytree.tree_flatten(tree)
    return leaves, spec


class _Call(_Expr):
    def __init__(self, target: Any, args: Sequence[Any], kwargs: dict[str, Any], users: int) -> None:
        self.target = target
        self.args = tuple(args)
        self.kwargs = dict(kwargs)
        self.users = users
        self.nested = any(isinstance(v, (dict, list, tuple)) for v in itertools.chain(self.args, self.kwargs.values()))
        self.items, self.spec = _flatten(self.args, self.kwargs, self.nested)

    def calls(self, node: Any) -> bool:
        return isinstance(node, fx.Node) and node.op == "call_function" and node.target == self.target

    def __repr__(self) -> str:
        return f"_Call({self.target}, {self.args}, {self.kwargs}, users={self.users})"


class _Outputs(_Expr):
    """The outputs of a search function that returns several values."""

    def __init__(self, outputs: Sequence[Optional[_Expr]]) -> None:
        if not isinstance(outputs[0], _Call):
            raise ValueError("a search function's first output must be computed by an op, not an input")
        self.outputs = list(outputs)


# --------------------------------------------------------------------------- matching


class _Bindings:
    """The state of one match attempt: pattern node -> graph value (None: tried, failed)."""

    def __init__(self, outputs: Sequence[Optional[_Expr]]) -> None:
        self.outputs = list(outputs)
        self.bound: dict[_Expr, Any] = {}
        # a search argument met bound to two different graph values: the whole attempt fails,
        # no other candidate for an output is tried (inductor raises FailedMatch there)
        self.conflict = False

    def match(self, expr: _Expr, value: Any) -> Optional["Match"]:
        if expr in self.bound:
            return Match(self) if self.bound[expr] == value else None
        found = _match_expr(expr, value, self)
        self.bound[expr] = value if found is not None else None
        return found


@dataclass
class Match:
    """A match: ``kwargs`` (search argument -> graph node or Python scalar), ``nodes`` (the matched
    call nodes, inputs before their users) and the graph nodes of the search function's outputs."""

    bindings: _Bindings = field(repr=False)
    kwargs: dict[str, Any] = field(default_factory=dict)
    nodes: list[fx.Node] = field(default_factory=list)

    def extend(self, other: "Match") -> bool:
        """Add ``other``'s nodes and bindings; False (and the attempt fails) when a search argument
        would be bound to two different values."""
        if self.kwargs and any(self.kwargs[k] != other.kwargs[k] for k in self.kwargs.keys() & other.kwargs.keys()):
            self.bindings.conflict = True
            return False
        self.nodes.extend(other.nodes)
        self.kwargs.update(other.kwargs)
        return True

    def output_nodes(self) -> list[Optional[fx.Node]]:
        return [self.bindings.bound[p] if p is not None else None for p in self.bindings.outputs]

    def output_node(self) -> fx.Node:
        return next(node for node in self.output_nodes() if node)


def _node_arguments(expr: _Call, node: fx.Node) -> Optional[tuple[Sequence[Any], dict[str, Any]]]:
    """The node's positional arguments and the keyword arguments the pattern names (normalised
    to the op's schema when the node passes fewer keywords than the pattern)."""
    if len(node.kwargs) >= len(expr.kwargs):
        return node.args, {k: v for k, v in node.kwargs.items() if k in expr.kwargs}
    from torch.fx.operator_schemas import normalize_function

    normalized = normalize_function(node.target, node.args, node.kwargs)  # type: ignore[arg-type]  # a call_function node's target is a callable; fx types it as any Target
    if normalized is None:
        return None
    args, kwargs = normalized
    if len(args) != len(expr.args) or len(kwargs) < len(expr.kwargs):
        return None
    return args, {k: v for k, v in kwargs.items() if k in expr.kwargs}


def _match_call(expr: _Call, node: Any, bindings: _Bindings) -> Optional[Match]:
    if not expr.calls(node) or len(node.args) != len(expr.args):
        return None
    if expr not in bindings.outputs and len(node.users) != expr.users:
        return None  # a value computed inside the match is used outside it (or a use is missing)
    arguments = _node_arguments(expr, node)
    if arguments is None:
        return None
    items, spec = _flatten(arguments[0], arguments[1], expr.nested)
    if spec != expr.spec:
        return None
    found = Match(bindings)
    for pattern_item, value in zip(expr.items, items):
        if isinstance(pattern_item, _Expr):
            child = bindings.match(pattern_item, value)
            if child is None or not found.extend(child):
                return None
        elif isinstance(value, fx.Node) or value != pattern_item:
            return None
    found.nodes.append(node)
    return found


def _match_expr(expr: _Expr, value: Any, bindings: _Bindings) -> Optional[Match]:
    if isinstance(expr, _Input):
        return Match(bindings, kwargs={expr.name: value})
    if isinstance(expr, _Wildcard):
        return Match(bindings)
    if isinstance(expr, _Call):
        return _match_call(expr, value, bindings)
    if isinstance(expr, _Outputs):
        return _match_outputs(expr, value, bindings)
    raise TypeError(f"not a pattern node: {expr!r}")


def _candidates(expr: _Expr, bindings: _Bindings, searched: set[fx.Node]) -> Iterator[Any]:
    """Graph nodes ``expr`` may sit on, found from what the match has bound so far: the bound
    value itself, else the users of the values its arguments are bound to."""
    if expr in bindings.bound:
        yield bindings.bound[expr]
        return
    if not isinstance(expr, _Call):
        return
    for item in expr.items:
        if not isinstance(item, _Expr):
            continue
        for other in _candidates(item, bindings, searched):
            if not isinstance(other, fx.Node):
                continue
            for user in other.users:
                if user not in searched and expr.calls(user):
                    yield user
                    searched.add(user)


def _match_outputs(expr: _Outputs, node: Any, bindings: _Bindings) -> Optional[Match]:
    first = expr.outputs[0]
    assert first is not None
    found = bindings.match(first, node)
    if found is None:
        return None
    for output in expr.outputs[1:]:
        if output is None:
            continue
        before = dict(bindings.bound)
        child: Optional[Match] = None
        for candidate in _candidates(output, bindings, set()):
            child = bindings.match(output, candidate)
            if child is not None or bindings.conflict:
                break
            bindings.bound = dict(before)  # forget what the failed candidate bound
        if child is None or not found.extend(child):
            return None
    return found


# --------------------------------------------------------------------------- search patterns


class SearchPattern:
    """A traced search function as a pattern (see the module docstring for what matches)."""

    def __init__(self, root: _Expr, outputs: Sequence[Optional[_Expr]]) -> None:
        self.root = root
        self.outputs = list(outputs)
        first = outputs[0]
        if not isinstance(first, _Call):
            raise ValueError("a search function's first output must be computed by an op, not an input")
        self.anchor: tuple[str, Any] = ("call_function", first.target)

    @classmethod
    def from_graph(
        cls,
        graph_module: fx.GraphModule,
        argnames: Sequence[str],
        ignore_types: Sequence[type] = (),
        scalar_workaround: Optional[dict[str, Any]] = None,
    ) -> "SearchPattern":
        by_value = {value: name for name, value in (scalar_workaround or {}).items()}
        if len(by_value) != len(scalar_workaround or {}):
            raise ValueError(f"scalar_workaround values must differ: {scalar_workaround}")
        index_types = tuple(t for t in ignore_types if t is not int)

        def literal(value: Any, ignored: Sequence[type]) -> Any:
            if isinstance(value, (float, int)) and value in by_value:
                return _Input(by_value[value])
            if type(value) in ignored:
                return _Wildcard()
            if isinstance(value, list) and value and all(isinstance(v, _Wildcard) for v in value):
                return _Wildcard()
            return value

        env: dict[fx.Node, Any] = {}
        placeholders = 0
        result: Any = None
        for node in graph_module.graph.nodes:
            if node.op == "placeholder":
                name = argnames[placeholders] if placeholders < len(argnames) else re.sub(r"_\d+$", "", str(node.target))
                placeholders += 1
                env[node] = _Input(name)
            elif node.op == "call_function":
                ignored = index_types if node.target is operator.getitem else tuple(ignore_types)
                args, kwargs = pytree.tree_map(
                    lambda v, ignored=ignored: literal(v, ignored), fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
                )
                if list in ignore_types:  # a burned-in size [8, 16, 128] is one wildcard
                    args = [literal(a, ignored) for a in args]
                    kwargs = {k: literal(v, ignored) for k, v in kwargs.items()}
                env[node] = _Call(node.target, args, kwargs, users=len(node.users))
            elif node.op == "output":
                result = fx.node.map_arg(node.args[0], env.__getitem__)
            else:
                raise ValueError(f"a search function may only call ops, it has a {node.op} node ({node.name})")
        if isinstance(result, _Expr):
            return cls(result, [result])
        outputs = pytree.tree_leaves(result)
        root = _Outputs(outputs)
        return cls(root, outputs)

    def match(self, node: fx.Node) -> Optional[Match]:
        found = _Bindings(self.outputs).match(self.root, node)
        return None if found is None or found.bindings.conflict else found
