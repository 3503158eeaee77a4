"""`FusionPass`: a set of search/replace patterns applied with ascendgraph's FX pattern matcher.

Theory of operation. A `Pattern` is a pair of plain functions — ``search`` written the way
the model computes something (``rms_norm(x + r, w, eps)``), ``replace`` calling the fused
op (``add_rms_norm(x, r, w, eps)``) — and example inputs on the meta device, so tracing
runs no kernel. A `FusionPass` owns one `PatternMatcherPass` (per instance: nothing is
registered process-wide, two engines or two tests never share patterns) and registers
each of its patterns the first time it meets a graph that calls one of the pattern
family's anchor ops, once per pattern name — the name carries the scalars baked into the
pattern (``add_rms_norm[eps=1e-06]``), so a pattern is registered once per (pattern, eps).

Matching is `ascendgraph.compile.passes.matcher`'s and replacing `rewrite`'s (torch.fx only,
with the semantics of torch's inductor pattern matcher, which vLLM Ascend's passes use): the
search function traced once up front, scalars such as eps compared literally, and the few
literals that depend on num_tokens (view sizes) treated as wildcards and checked in the
pattern's own ``check``. Every match is also checked for the stream-scope rule
(`same_stream_scope`); the fused nodes inherit the matched nodes' stream label. The pass
returns how many matches it replaced.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch import fx
from torch._ops import OpOverload

from ascendgraph.compile.passes.matcher import Match, SearchPattern, trace
from ascendgraph.compile.passes.rewrite import PatternRewriter
from ascendgraph.compile.passes.stream_scope import STREAM_LABEL_KEY, call_labels, same_stream_scope, stream_label

__all__ = ["Pattern", "PatternFamily", "FusionPass", "Match", "match_value", "meta_tensor"]

log = logging.getLogger(__name__)


def _always(match: Match) -> bool:
    return True


def meta_tensor(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """An example input for tracing a pattern: shape and dtype only, no storage, no kernel."""
    return torch.empty(shape, dtype=dtype, device="meta")


def match_value(match: Match, name: str) -> Any:
    """The fake value (or Python scalar) bound to a search-function argument in a match."""
    value = match.kwargs.get(name)
    if isinstance(value, fx.Node):
        return value.meta.get("val")
    return value


@dataclass(frozen=True)
class Pattern:
    """One search/replace pair.

    ``name`` identifies the registration (it includes eps and any other baked-in scalar);
    ``ignore_types`` are literal types matched as wildcards (then ``check`` must verify
    them); ``scalar_workaround`` names search arguments that are Python scalars (e.g. a
    scale) with the example value used while tracing.
    """

    name: str
    search: Callable[..., Any]
    replace: Callable[..., Any]
    example_inputs: Callable[[], Sequence[Any]]
    check: Callable[[Match], bool] = _always
    ignore_types: tuple[type, ...] = ()
    scalar_workaround: Optional[dict[str, float]] = None


@dataclass(frozen=True)
class PatternFamily:
    """The patterns one fusion is found by, registered only for graphs that call an anchor op."""

    name: str
    anchors: tuple[OpOverload, ...]
    patterns: Callable[[], Sequence[Pattern]]


@contextlib.contextmanager
def _stream_annotation(label: Any) -> Iterator[None]:
    """Nodes traced inside carry ``meta["custom"]["stream_label"] = label`` (none for None)."""
    if label is None:
        yield
        return
    from torch.fx import traceback as fx_traceback

    with fx_traceback.annotate({STREAM_LABEL_KEY: label}):
        yield


@dataclass
class FusionPass:
    """A GraphPass replacing the matches of its pattern families (see the module docstring)."""

    name: str
    families: Sequence[PatternFamily]
    registered: list[str] = field(default_factory=list)
    _matcher: Optional[PatternRewriter] = field(default=None, repr=False)
    _families_done: set[str] = field(default_factory=set, repr=False)
    _pending_label: Any = field(default=None, repr=False)

    def __call__(self, graph_module: fx.GraphModule) -> int:
        self._register_for(graph_module.graph)
        if self._matcher is None:
            return 0
        count = self._matcher.apply(graph_module.graph)
        if count:
            _promote_stream_labels(graph_module.graph)
        return count

    # -- registration ------------------------------------------------------------------
    def _register_for(self, graph: fx.Graph) -> None:
        pending = [f for f in self.families if f.name not in self._families_done]
        if not pending:
            return
        called = {node.target for node in graph.nodes if node.op == "call_function"}
        for family in pending:
            if not called.intersection(family.anchors):
                continue
            self._families_done.add(family.name)
            for pattern in family.patterns():
                self._register(pattern)

    def _register(self, pattern: Pattern) -> None:
        if pattern.name in self.registered:
            return
        if self._matcher is None:
            self._matcher = PatternRewriter(self.name)
        argnames = list(inspect.signature(pattern.search).parameters)
        workaround = dict(pattern.scalar_workaround or {})
        examples = iter(pattern.example_inputs())
        trace_args = [workaround[name] if name in workaround else next(examples) for name in argnames]
        search = SearchPattern.from_graph(
            trace(pattern.search, trace_args), argnames, ignore_types=pattern.ignore_types, scalar_workaround=workaround
        )
        self._matcher.register(pattern.name, search, argnames, self._replacement(pattern), self._checker(pattern))
        self.registered.append(pattern.name)
        log.debug("pass %s: registered pattern %s", self.name, pattern.name)

    def _checker(self, pattern: Pattern) -> Callable[[Match], bool]:
        def check(match: Match) -> bool:
            labels = call_labels(match.nodes)
            if not same_stream_scope(labels):
                log.debug("pass %s: %s refused, its nodes sit on streams %s", self.name, pattern.name, labels)
                return False
            if not pattern.check(match):
                return False
            self._pending_label = labels[0] if labels else None
            return True

        return check

    def _replacement(self, pattern: Pattern) -> Callable[..., Any]:
        def replace(*args: Any) -> Any:
            with _stream_annotation(self._pending_label):
                return pattern.replace(*args)

        return replace


def _promote_stream_labels(graph: fx.Graph) -> None:
    """Give nodes traced under a stream annotation the top-level ``meta["stream_label"]``."""
    for node in graph.nodes:
        if node.op == "call_function" and STREAM_LABEL_KEY not in node.meta:
            label = stream_label(node)
            if label is not None:
                node.meta[STREAM_LABEL_KEY] = label
