"""Compile cache: the traced graph of a model, and the pass manager's rewritten graph, kept across runs.

Two kinds of entries. *Traced* entries (the second half of this module, `traced_key`) hold
the whole compile's result — the aten graph Dynamo and aot_autograd produced, lowered and
rewritten by the passes — so a later run of the same model, mode and passes traces nothing.
*Pass* entries (below) are the finer-grained fallback used when a model is traced: they
skip the passes' pattern matching for a graph seen before.

Theory of operation. Every run compiles the same model the same way, and the passes spend
their time tracing: each pattern once when it is registered, each replacement once per
match. So the `PassManager` keys each graph it is handed and, on a hit, swaps in the graph
the passes produced last time — without tracing anything. On a miss it runs the passes and
stores the result.

Where: ``$ASCENDGRAPH_CACHE_DIR/compile/<key>.pkl`` (default ``~/.cache/ascendgraph``;
the test suite gives every test its own directory). The key is a SHA-256 of everything
the rewritten graph depends on:

=========================  ==============================================================
part                       why
=========================  ==============================================================
cache format               a new layout never reads an old file
torch version              FX code generation and aten schemas change between releases
ascendgraph version        the custom ops and the lowering
pass sources               a digest of ``ascendgraph/compile/passes/*.py``: editing a pattern
                           invalidates the cache even without a version bump
passes and their patterns  the pass list (per mode and flag), each fusion pass's families
                           and pattern names (they carry eps and other baked-in scalars)
the input graph's code     the aten graph Dynamo + aot_autograd produced: model shapes,
                           dtypes, dims, eps literals, graph mode
=========================  ==============================================================

Only pure graph rewrites are cached (`CACHEABLE_PASSES`); a pass list with anything else
(the static-kernel build installs kernels on the device) is never cached here. A traced-graph
entry (below) may also hold the passes that only read the graph (`GRAPH_READERS`): it keeps
what they read, and a hit hands that back to them. A graph with
``call_module`` / ``get_attr`` nodes is not stored (the pickled form would not carry the
modules). Any failure to read or write the cache is a miss, logged at debug level: the
cache can only make a run faster, never change what it computes. Cached graphs are
pickled ``torch.fx.GraphModule``s (rebuilt from their Python code): only point
``ASCENDGRAPH_CACHE_DIR`` at a directory you trust, as for any pickle cache.
"""

from __future__ import annotations

import hashlib
import io
import logging
import os
import pickle
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import fx

from ascendgraph.cache_temporaries import sweep_once
from ascendgraph.readers import cache_miss, read_cache_entry, user_cache_root, write_output

__all__ = ["CACHE_FORMAT", "CACHE_SUBDIR", "CACHEABLE_PASSES", "GRAPH_READERS", "graph_readers", "traceable", "CachedGraph", "CompileCache", "cache_key",
           "TracedGraph", "traced_key", "load_traced", "store_traced", "parse_source", "resolve_source"]

log = logging.getLogger(__name__)
MAX_ENTRY_BYTES = 256 << 20  # a compiled graph entry larger than this is no entry of ours

CACHE_FORMAT = 1
CACHE_SUBDIR = "compile"
CACHE_ENV = "ASCENDGRAPH_CACHE_DIR"
# Pass types whose whole effect is the rewritten graph (class name -> reason).
CACHEABLE_PASSES: dict[str, str] = {
    "FusionPass": "pattern replacement: the output graph is all it produces",
    "NoopEliminationPass": "drops no-op views: the output graph is all it produces",
}
# Stages that read the graph and act elsewhere, never changing it. A traced entry keeps what such
# a stage read (`reader_state`); a hit hands it back (`read_cached`), and the stage acts again.
GRAPH_READERS: dict[str, str] = {
    "StaticKernelStage": "reads the fixed-shape launches at each size; builds (or reuses) and installs their kernels",
}
_PASSES_DIR = Path(__file__).resolve().parent / "passes"
_source_digest_memo: Optional[str] = None


def _source_digest() -> str:
    global _source_digest_memo
    if _source_digest_memo is None:
        digest = hashlib.sha256()
        for path in sorted(_PASSES_DIR.glob("*.py")):
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
        _source_digest_memo = digest.hexdigest()
    return _source_digest_memo


def _pass_token(graph_pass: Any) -> str:
    parts = [type(graph_pass).__name__, str(getattr(graph_pass, "name", ""))]
    token = getattr(graph_pass, "cache_token", None)  # a graph reader's settings (its sizes and flags)
    if token is not None:
        parts.append(f"settings={token}")
    for family in getattr(graph_pass, "families", ()) or ():
        parts.append(f"family={family.name}")
        parts.extend(f"pattern={pattern.name}" for pattern in family.patterns())
    return "|".join(parts)


def cacheable(passes: Sequence[Any]) -> bool:
    """Whether every pass is a pure graph rewrite (and there is at least one)."""
    return bool(passes) and all(type(p).__name__ in CACHEABLE_PASSES for p in passes)


def traceable(passes: Sequence[Any]) -> bool:
    """Whether a traced-graph entry may hold this pass list: rewrites and graph readers only."""
    return all(type(p).__name__ in CACHEABLE_PASSES or type(p).__name__ in GRAPH_READERS for p in passes)


def graph_readers(passes: Sequence[Any]) -> list[Any]:
    """The passes of ``passes`` that only read the graph (`GRAPH_READERS`): each has
    ``read_state()`` (plain data) and ``resume(state)``."""
    return [p for p in passes if type(p).__name__ in GRAPH_READERS]


def cache_key(graph_module: fx.GraphModule, passes: Sequence[Any]) -> str:
    from ascendgraph import __version__

    digest = hashlib.sha256()
    for part in (f"format={CACHE_FORMAT}", f"torch={torch.__version__}", f"ascendgraph={__version__}",
                 f"passes-src={_source_digest()}", *(_pass_token(p) for p in passes), graph_module.code):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class CachedGraph:
    """What a hit hands back: the rewritten graph and the passes' match counts."""

    graph: fx.Graph
    matches: dict[str, int]


def _storable(graph_module: fx.GraphModule) -> bool:
    return all(node.op not in ("call_module", "get_attr") for node in graph_module.graph.nodes)


class CompileCache:
    """The directory of cached graphs (``root`` None: read from ``$ASCENDGRAPH_CACHE_DIR``)."""

    def __init__(self, root: Optional[Path] = None) -> None:
        self._root = root

    @property
    def directory(self) -> Path:
        if self._root is not None:
            return self._root / CACHE_SUBDIR
        base = Path(user_cache_root())  # $ASCENDGRAPH_CACHE_DIR, else the user's cache folder
        return base / CACHE_SUBDIR

    def load(self, key: str) -> Optional[CachedGraph]:
        path = self.directory / f"{key}.pkl"
        sweep_once(path.parent)  # what killed runs left behind (ascendgraph.cache_temporaries)
        data = read_cache_entry(path, "compile cache entry", limit=MAX_ENTRY_BYTES)  # regular files only
        if data is None:
            return None
        try:
            document = pickle.loads(data)
            if not isinstance(document, dict) or document.get("format") != CACHE_FORMAT or document.get("key") != key:
                return None
            module = document["module"]
            matches = {str(k): int(v) for k, v in document["matches"].items()}
            if not isinstance(module, fx.GraphModule):
                return None
            return CachedGraph(module.graph, matches)
        except Exception as exc:  # a broken entry (RecursionError too) is a miss with one warning, never an error
            cache_miss(path, "compile cache entry", f"{path}: {type(exc).__name__}: {str(exc)[:200]}")
            return None

    def store(self, key: str, graph_module: fx.GraphModule, matches: dict[str, int]) -> bool:
        if not _storable(graph_module):
            return False
        directory = self.directory
        document = {"format": CACHE_FORMAT, "key": key, "module": graph_module, "matches": dict(matches)}
        return _store_entry(directory, key, document, "compile cache entry")


def _store_entry(directory: Path, key: str, document: dict[str, Any], what: str) -> bool:
    """Pickle ``document`` to ``directory/<key>.pkl`` through the readers' one way to write an
    output (never over a special file, no temporary left behind); False when it cannot be written."""
    sweep_once(directory)
    try:
        buffer = io.BytesIO()
        pickle.dump(document, buffer, protocol=pickle.HIGHEST_PROTOCOL)
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / f"{key}.pkl"
        write_output(target, buffer.getvalue(), f"{what} {target}")
        return True
    except Exception as exc:
        log.debug("compile cache: cannot write a %s to %s: %s: %s", what, directory, type(exc).__name__, exc)
        return False


# --------------------------------------------------------------------------- traced graphs
#
# The entries above skip the passes; the ones below skip Dynamo and aot_autograd too. A traced
# entry holds the aten graph the backend received from aot_autograd, after the lowering and the
# passes — the graph it splits and wraps — and the sources of its inputs as Dynamo named them
# (``L['model']._modules['layers']._modules['0']._parameters['weight']``, ``L['input_ids']``,
# ``L['input_ids'].size()[0]``). A later run with the same key binds those sources to its own
# model and inputs and calls the graph directly: nothing is traced. Stored only when the call
# needs nothing of aot_autograd's runtime wrapper (no input mutation, one output that aliases
# nothing, one graph input per Dynamo input), which `AscendGraphBackend` checks.

TRACED_FORMAT = 2  # 2: the graph readers' state
TRACED_SUBDIR = "traced"  # $ASCENDGRAPH_CACHE_DIR/compile/traced/<key>.pkl
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
_package_digest_memo: Optional[str] = None
_ROOTS = ("model", "input_ids", "positions")
_SOURCE_RE = re.compile(r"^L\['(model|input_ids|positions)'\]((?:\.(?:_modules|_parameters|_buffers)\['[A-Za-z0-9_.]+'\]"
                        r"|\.size\(\)\[\d+\])*)$")
_STEP_RE = re.compile(r"\.(_modules|_parameters|_buffers)\['([A-Za-z0-9_.]+)'\]|\.size\(\)\[(\d+)\]")


def package_digest() -> str:
    """A digest of every ``ascendgraph/**/*.py`` source: any edit invalidates the traced entries."""
    global _package_digest_memo
    if _package_digest_memo is None:
        digest = hashlib.sha256()
        for path in sorted(_PACKAGE_DIR.rglob("*.py")):
            digest.update(str(path.relative_to(_PACKAGE_DIR)).encode())
            digest.update(path.read_bytes())
        _package_digest_memo = digest.hexdigest()
    return _package_digest_memo


def traced_key(model_spec: str, mode: str, attention_split: bool, passes: Sequence[Any], device_type: str) -> str:
    """The key of a traced entry: the model and how it is built, the mode, the split, the passes,
    the device type, the torch / ascendgraph versions and the package's sources."""
    from ascendgraph import __version__

    digest = hashlib.sha256()
    for part in (f"traced-format={TRACED_FORMAT}", f"torch={torch.__version__}", f"ascendgraph={__version__}",
                 f"sources={package_digest()}", f"model={model_spec}", f"mode={mode}", f"split={attention_split}",
                 f"device={device_type}", *(_pass_token(p) for p in passes)):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


Step = tuple[str, str]


def parse_source(text: str) -> tuple[str, tuple[Step, ...]]:
    """A Dynamo input source as (root, steps); ValueError for anything else (never evaluated)."""
    match = _SOURCE_RE.match(text)
    if match is None:
        raise ValueError(f"not a model/input source: {text!r}")
    steps: list[Step] = []
    for found in _STEP_RE.finditer(match.group(2)):
        steps.append(("size", found.group(3)) if found.group(3) is not None else (found.group(1), found.group(2)))
    return match.group(1), tuple(steps)


def resolve_source(source: tuple[str, tuple[Step, ...]], roots: dict[str, Any]) -> Any:
    """The value a parsed source names among ``roots`` (model, input_ids, positions)."""
    root, steps = source
    value = roots[root]
    for kind, name in steps:
        value = int(value.size()[int(name)]) if kind == "size" else getattr(value, kind)[name]
    return value


@dataclass(frozen=True)
class TracedGraph:
    """A traced entry: the aten graph after lowering and passes, its input sources, the passes' matches."""

    module: fx.GraphModule
    sources: tuple[str, ...]
    matches: dict[str, int]
    # per graph-reader pass name, what it read (plain lists and numbers: `GRAPH_READERS`)
    readers: dict[str, Any] = field(default_factory=dict)


def load_traced(cache: "CompileCache", key: str) -> Optional[TracedGraph]:
    """The traced entry for ``key``, or None. A corrupt, foreign or unreadable entry is a miss
    with one warning naming the file (the run then traces as if there were no cache)."""
    path = cache.directory / TRACED_SUBDIR / f"{key}.pkl"
    sweep_once(path.parent)
    data = read_cache_entry(path, "traced-graph cache entry", limit=MAX_ENTRY_BYTES)  # regular files only
    if data is None:
        return None
    try:
        document = pickle.loads(data)
        if not isinstance(document, dict) or document.get("format") != TRACED_FORMAT or document.get("key") != key:
            raise ValueError("not a traced-graph entry of this key and format (a foreign file)")
        module, sources = document["module"], tuple(str(s) for s in document["sources"])
        if not isinstance(module, fx.GraphModule) or not _storable(module):
            raise ValueError("the entry holds no storable graph module")
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        if len(placeholders) != len(sources):
            raise ValueError(f"{len(placeholders)} graph inputs for {len(sources)} sources")
        for source in sources:
            parse_source(source)
        matches = {str(k): int(v) for k, v in document["matches"].items()}
        readers = document["readers"]
        if not isinstance(readers, dict) or not all(isinstance(k, str) for k in readers):
            raise ValueError("the graph readers' state is not a mapping of pass names")
        return TracedGraph(module, sources, matches, dict(readers))
    except Exception as exc:  # a broken entry is a miss with one warning, never an error
        cache_miss(path, "traced-graph cache entry", f"{path}: {type(exc).__name__}: {str(exc)[:200]}")
        return None


def store_traced(cache: "CompileCache", key: str, traced: TracedGraph) -> bool:
    if not _storable(traced.module):
        return False
    try:
        for source in traced.sources:
            parse_source(source)
    except Exception as exc:  # a source of a shape the loader would refuse: not stored
        log.debug("compile cache: not storing a traced graph: %s", exc)
        return False
    document = {"format": TRACED_FORMAT, "key": key, "module": traced.module, "sources": list(traced.sources),
                "matches": dict(traced.matches), "readers": dict(traced.readers)}
    # Pickled with fx's plain tracer, not make_fx's: loading re-traces the graph's code, and
    # make_fx's tracer (torch 2.13 proxy_tensor.py `_should_save_eager_input_vals`) reads
    # torch._higher_order_ops.triton_kernel_wrap, a module only Dynamo's import loads.
    tracer = traced.module._tracer_cls
    traced.module._tracer_cls = None
    try:
        return _store_entry(cache.directory / TRACED_SUBDIR, key, document, "traced-graph cache entry")
    finally:
        traced.module._tracer_cls = tracer
