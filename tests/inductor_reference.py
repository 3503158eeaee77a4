"""The reference the FX pattern matcher is compared with: `FusionPass` as it registered its
patterns with torch's inductor pattern matcher (torch 2.13.0, torch/_inductor/pattern_matcher.py
``register_replacement`` with a pre-traced ``search_fn_pattern``, ``fwd_only`` without
decompositions, one ``PatternMatcherPass`` per pass instance).

Tests only: importing it imports ``torch._inductor.pattern_matcher`` (and with it
``torch._inductor.lowering``), which ascendgraph itself never does.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Sequence

from torch import fx

from ascendgraph.compile.passes.fusion import FusionPass, Pattern


def inductor_trace(fn: Any, args: Sequence[Any], get_decomp_fn: Any = None) -> fx.GraphModule:
    """What `FusionPass` traced patterns and replacements with: ``fwd_only`` with no decompositions."""
    from torch._inductor.pattern_matcher import fwd_only

    return fwd_only(fn, args, get_decomp_fn=lambda: {})


@dataclass
class InductorFusionPass(FusionPass):
    """`FusionPass` with inductor's matcher in place of ascendgraph's (same families, checks,
    stream-scope rule and stream labels: only the registration differs)."""

    def _register(self, pattern: Pattern) -> None:
        if pattern.name in self.registered:
            return
        from torch._inductor.pattern_matcher import PatternMatcherPass, fx_to_pattern, register_replacement

        if self._matcher is None:
            self._matcher = PatternMatcherPass(pass_name=self.name)  # type: ignore[assignment]
        argnames = list(inspect.signature(pattern.search).parameters)
        workaround = dict(pattern.scalar_workaround or {})
        examples = list(pattern.example_inputs())
        trace_args, inputs = [], iter(examples)
        for argname in argnames:
            trace_args.append(workaround[argname] if argname in workaround else next(inputs))
        expression = fx_to_pattern(
            inductor_trace(pattern.search, trace_args), ignore_types=pattern.ignore_types, argnames=argnames,
            scalar_workaround=workaround,
        )
        register_replacement(
            pattern.search, self._replacement(pattern), examples, inductor_trace, self._matcher,
            extra_check=self._checker(pattern), scalar_workaround=workaround or None, search_fn_pattern=expression,
        )
        self.registered.append(pattern.name)


def with_inductor(passes: Sequence[Any]) -> list[Any]:
    """The same pass list with every `FusionPass` registering through inductor."""
    return [InductorFusionPass(p.name, p.families) if isinstance(p, FusionPass) else p for p in passes]
