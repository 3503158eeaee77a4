"""The pass manager: the FX passes run on the aten-level graph before it is split.

Theory of operation. The compile backend lowers the Dynamo graph to aten (aot_autograd),
then hands it to a `PassManager`, which runs its passes in order and counts, per pass, how
many matches each one replaced. Which passes run depends on the resolved mode
(docs/semantics.md §3 step 8 and §10): npugraph_ex passes for FULL / FULL_DECODE_ONLY when enabled,
the basic fusion passes for piecewise modes, none for NONE.

The pass list is built per pass-manager instance by `build_passes(resolution)`. This
module ships an empty list; the npugraph_ex issue provides the passes in
`ascendgraph.compile.passes`, whose ``build_passes(resolution) -> list[GraphPass]`` is used
automatically when that module exists. Building fresh pass objects per manager keeps
pattern registrations per instance (no process-global registry leaking between tests).
"""

from __future__ import annotations

import importlib
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional, Protocol, Sequence, runtime_checkable

from torch import fx

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.compile.cache import CompileCache
    from ascendgraph.resolve import Resolution

__all__ = ["GraphPass", "PassManager", "PassRun", "build_passes", "PASSES_MODULE"]

log = logging.getLogger(__name__)

PASSES_MODULE = "ascendgraph.compile.passes"


@runtime_checkable
class GraphPass(Protocol):
    """An in-place FX graph rewrite. Returns how many matches it replaced."""

    name: str

    def __call__(self, graph_module: fx.GraphModule) -> int: ...


@dataclass(frozen=True)
class PassRun:
    """What one run of the pass manager did on one compiled graph."""

    matches: dict[str, int]
    seconds: float


def build_passes(resolution: Optional["Resolution"]) -> list[GraphPass]:
    """The passes for a resolved configuration: ``ascendgraph.compile.passes.build_passes``
    when that module exists, else none."""
    if resolution is None:
        return []
    try:
        module = importlib.import_module(PASSES_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name != PASSES_MODULE:
            raise
        return []
    factory = getattr(module, "build_passes", None)
    if factory is None:
        return []
    return list(factory(resolution))


@dataclass
class PassManager:
    """Runs a list of passes over each compiled graph and keeps per-pass match counts.

    ``runs`` has one entry per compiled graph (Dynamo may compile more than once, e.g.
    a re-specialised size); `matches` reports the first, so a fused op is counted once.
    """

    passes: Sequence[GraphPass] = ()
    runs: list[PassRun] = field(default_factory=list)
    # The compile cache (`ascendgraph.compile.cache`): None reads $ASCENDGRAPH_CACHE_DIR; use_cache
    # False never reads or writes it. cache_status: "off" | "hit" | "miss" (of the last graph).
    cache: Optional["CompileCache"] = None
    use_cache: bool = True
    cache_status: str = "off"

    @classmethod
    def for_resolution(cls, resolution: Optional["Resolution"]) -> "PassManager":
        return cls(passes=build_passes(resolution))

    @property
    def pass_names(self) -> list[str]:
        return [p.name for p in self.passes]

    @property
    def matches(self) -> dict[str, int]:
        """Per-pass match counts of the first compiled graph ({} before any compile)."""
        return dict(self.runs[0].matches) if self.runs else {name: 0 for name in self.pass_names}

    def reader_state(self) -> dict[str, Any]:
        """What the graph-reader passes read of the last graph (`ascendgraph.compile.cache.GRAPH_READERS`),
        as plain data a traced-graph entry keeps."""
        from ascendgraph.compile.cache import graph_readers

        return {p.name: p.read_state() for p in graph_readers(self.passes)}

    def read_cached(self, state: dict[str, Any]) -> None:
        """Hand the graph readers what a traced-graph entry kept for them; ValueError when it
        lacks a reader of this pass list (the caller traces instead)."""
        from ascendgraph.compile.cache import graph_readers

        readers = graph_readers(self.passes)
        missing = [p.name for p in readers if p.name not in state]
        if missing:
            raise ValueError(f"the traced entry keeps nothing for {', '.join(missing)}")
        for reader in readers:
            reader.resume(state[reader.name])

    def __call__(self, graph_module: fx.GraphModule) -> PassRun:
        start = time.perf_counter()
        from ascendgraph.compile.cache import CompileCache, cache_key, cacheable

        key: Optional[str] = None
        if self.use_cache and cacheable(self.passes):
            if self.cache is None:
                self.cache = CompileCache()
            key = cache_key(graph_module, self.passes)
            hit = self.cache.load(key)
            if hit is not None:
                graph_module.graph = hit.graph  # regenerates the module's code
                self.cache_status = "hit"
                run = PassRun(matches=dict(hit.matches), seconds=time.perf_counter() - start)
                self.runs.append(run)
                log.debug("compile cache hit %s: %s", key[:12], run.matches)
                return run
            self.cache_status = "miss"
        matches: dict[str, int] = {}
        for graph_pass in self.passes:
            count = int(graph_pass(graph_module))
            matches[graph_pass.name] = matches.get(graph_pass.name, 0) + count
            if count:
                log.debug("pass %s replaced %d match(es)", graph_pass.name, count)
        if self.passes:
            graph_module.graph.lint()
            graph_module.recompile()
        if key is not None and self.cache is not None:
            self.cache.store(key, graph_module, matches)
        run = PassRun(matches=matches, seconds=time.perf_counter() - start)
        self.runs.append(run)
        return run
