"""Old import paths of modules that moved, kept importable for a while.

When a module moves down a layer (docs/ARCHITECTURE.md), code written against its old path
(another branch, a user's script) should keep working until it is updated. Instead of a
re-export file at the old path — which would hide the move from git (a file that is edited
rather than deleted is no rename, so edits made elsewhere to the old file would conflict
instead of following it) and would be a second module object that ``monkeypatch`` could
patch without effect — the old name is an *alias*: importing it returns the moved module
itself, lazily (importing the old parent package imports nothing more).

`MOVED_MODULES` is the table: old name -> (new name, why it moved). `install` registers one
finder for the table on ``sys.meta_path`` (idempotent); the parent package of the old
names calls it. An entry is removed once nothing imports the old name.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Optional, Sequence

__all__ = ["MOVED_MODULES", "install"]

# old module name -> (new module name, why it moved)
MOVED_MODULES: dict[str, tuple[str, str]] = {
    "ascendgraph.runtime.capture": (
        "ascendgraph.compile.graph_wrapper",
        "the graph wrapper sits below the engine, as vLLM's CUDAGraphWrapper does (vllm/compilation/"
        "cuda_graph.py); compile/backend.py wraps the split pieces with it",
    ),
    "ascendgraph.runtime.forward_context": (
        "ascendgraph.forward_context",
        "the forward context sits below the models and the graph wrapper, as vLLM's does "
        "(vllm/forward_context.py); the attention op and the wrappers read it",
    ),
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the module that moved (the same object, its own spec kept)."""

    def __init__(self, target: str) -> None:
        self.target = target
        self._target_spec: Optional[importlib.machinery.ModuleSpec] = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target)
        self._target_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system stamped the alias's spec on the module; give it back its own.
        module.__spec__ = self._target_spec


class _MovedModuleFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]] = None, target: Optional[ModuleType] = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        moved = MOVED_MODULES.get(fullname)
        if moved is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(moved[0]))


def install() -> None:
    """Make the old names of `MOVED_MODULES` importable (once per process)."""
    if not any(isinstance(finder, _MovedModuleFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _MovedModuleFinder())
