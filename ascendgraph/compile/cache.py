"""Compile cache: the pass manager's rewritten graph, kept across runs.

Theory of operation. Every run compiles the same model the same way, and the costliest
part of the passes is not matching but importing torch's inductor pattern matcher and
registering the patterns (SIMULATOR-NOTES: import ~1.4 s). So the `PassManager` keys each
graph it is handed and, on a hit, swaps in the graph the passes produced last time —
without importing the pattern matcher at all. On a miss it runs the passes and stores
the result.

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
(the static-kernel build installs kernels on the device) is never cached. A graph with
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import fx

from ascendgraph.readers import cache_miss, read_cache_entry, user_cache_root, write_output

__all__ = ["CACHE_FORMAT", "CACHE_SUBDIR", "CACHEABLE_PASSES", "CachedGraph", "CompileCache", "cache_key"]

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
    for family in getattr(graph_pass, "families", ()) or ():
        parts.append(f"family={family.name}")
        parts.extend(f"pattern={pattern.name}" for pattern in family.patterns())
    return "|".join(parts)


def cacheable(passes: Sequence[Any]) -> bool:
    """Whether every pass is a pure graph rewrite (and there is at least one)."""
    return bool(passes) and all(type(p).__name__ in CACHEABLE_PASSES for p in passes)


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
        try:
            buffer = io.BytesIO()
            pickle.dump({"format": CACHE_FORMAT, "key": key, "module": graph_module, "matches": dict(matches)},
                        buffer, protocol=pickle.HIGHEST_PROTOCOL)
            directory.mkdir(parents=True, exist_ok=True)
            target = directory / f"{key}.pkl"
            write_output(target, buffer.getvalue(), f"compile cache entry {target}")  # never over a special file
            return True
        except Exception as exc:
            log.debug("compile cache: cannot write to %s: %s: %s", directory, type(exc).__name__, exc)
            return False
