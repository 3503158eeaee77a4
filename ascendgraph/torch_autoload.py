"""torch's device-backend autoload, off for torch's own import and nowhere else.

Why. torch_npu registers itself in the ``torch.backends`` entry-point group, and torch's
``__init__`` loads every backend of that group at the end of its import unless
``TORCH_DEVICE_BACKEND_AUTOLOAD`` is something other than ``"1"`` (torch 2.13.0
torch/__init__.py ``_is_device_backend_autoload_enabled``, read once, during that import).
With torch_npu installed but the CANN libraries missing, a plain ``import torch`` then fails;
ascendgraph never relies on autoload (hw/ imports torch_npu itself, behind a guard).

What. `install()` (called by ``import ascendgraph`` while torch is not imported yet and the
variable is unset) puts a finder at the front of ``sys.meta_path`` that acts on the next
import of ``torch`` only: the variable is ``"0"`` while torch's ``__init__`` runs and is
removed again as soon as it returns (or raises), so nothing of ascendgraph stays in the
caller's ``os.environ`` — child processes and later reads see the caller's environment. The
finder removes itself at that import, and torch's module keeps its own loader. A value the
caller set (``1``, ``0`` or anything else) is never touched.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any, Optional, Sequence

__all__ = ["AUTOLOAD_VARIABLE", "install", "installed"]

AUTOLOAD_VARIABLE = "TORCH_DEVICE_BACKEND_AUTOLOAD"


class _AutoloadOffLoader:
    """Wraps torch's loader: the variable is "0" only while torch's ``__init__`` executes."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Optional[ModuleType]:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        set_here = AUTOLOAD_VARIABLE not in os.environ
        if set_here:
            os.environ[AUTOLOAD_VARIABLE] = "0"
        try:
            self._loader.exec_module(module)
        finally:
            if set_here and os.environ.get(AUTOLOAD_VARIABLE) == "0":
                del os.environ[AUTOLOAD_VARIABLE]
            module.__loader__ = self._loader
            if module.__spec__ is not None:
                module.__spec__.loader = self._loader

    def __getattr__(self, name: str) -> Any:  # anything else a loader offers (get_resource_reader, ...)
        return getattr(self._loader, name)


class _TorchImportWithoutAutoload:
    """A meta-path finder for the top-level ``torch`` import only; it removes itself there."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None, target: Any = None) -> Any:
        if fullname != "torch":
            return None
        _uninstall()
        from importlib.util import find_spec

        spec = find_spec(fullname)  # the finders after this one, as if it were not there
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _AutoloadOffLoader(spec.loader)  # type: ignore[assignment]  # duck-typed Loader: importlib.abc is not imported for this
        return spec


_FINDER = _TorchImportWithoutAutoload()


def _uninstall() -> None:
    try:
        sys.meta_path.remove(_FINDER)
    except ValueError:
        pass


def installed() -> bool:
    """Whether the next import of torch will run with autoload off (for tests)."""
    return _FINDER in sys.meta_path


def install() -> None:
    """Switch autoload off for torch's first import, when torch is not imported yet and the
    caller did not set the variable; a no-op otherwise (also when called twice)."""
    if "torch" in sys.modules or AUTOLOAD_VARIABLE in os.environ or installed():
        return
    sys.meta_path.insert(0, _FINDER)
