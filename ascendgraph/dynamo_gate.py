"""Dynamo's "do not trace this" wrapper, paid for only once Dynamo is in the process.

Theory of operation. torch wraps every dispatch mode's ``__torch_dispatch__`` and every
``torch.library.custom_op`` kernel in ``torch._disable_dynamo`` (torch 2.13:
``torch/utils/_python_dispatch.py`` ``TorchDispatchMode.__init_subclass__``,
``torch/_library/custom_ops.py`` ``CustomOpDef.register_kernel``). That wrapper imports
``torch._dynamo`` on its first call (about 1.3 s on an idle 2-core machine, as long as
``import torch`` itself) and then runs every call through Dynamo's eval-frame guard. A run
whose compiled graph comes from the traced-graph cache never starts Dynamo, yet paid both:
the simulator's dispatch modes and kernels are called tens of thousands of times.

Dynamo can only be tracing a frame if ``torch._dynamo`` has been imported: its frame hook
is installed by that package alone. So `disabled_once_dynamo_loads` calls the function
directly while ``torch._dynamo`` is absent (or still importing), and from the first call
after it has loaded on, exactly as torch does: through ``torch._dynamo.disable(fn)``.
Nothing Dynamo would see is ever left unwrapped.

`LazyDynamoDispatchMode` is a ``TorchDispatchMode`` base that uses it for
``__torch_dispatch__`` (torch's own hook for opting out of its wrapper is the
``_should_skip_dynamo`` class method); `defer_kernel_dynamo_guard` does the same for a
custom op's kernels; `defer_torch_dynamo_guards` for the functions torch itself wrapped so
far (the Python meta kernels of ``torch._refs`` that the simulator's shape-only warm-ups
call, about 300 functions: found once, by their wrapper's code object). All of them rely on
torch 2.13 internals the project pins (``torch>=2.13,<2.14``);
tests/unit/test_dynamo_gate.py fails if a torch release moves them.
"""

from __future__ import annotations

import functools
import gc
import sys
import types
from typing import Any, Callable, TypeVar

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = [
    "disabled_once_dynamo_loads",
    "LazyDynamoDispatchMode",
    "defer_kernel_dynamo_guard",
    "defer_torch_dynamo_guards",
]

_F = TypeVar("_F", bound=Callable[..., Any])

# torch's own slot for the disabled twin of a function wrapped by torch._disable_dynamo
# (torch/_compile.py, `inner`): set it and torch's wrapper calls it instead of importing Dynamo.
_TORCH_DISABLE_SLOT = "__dynamo_disable"


def disabled_once_dynamo_loads(fn: _F, recursive: bool = True) -> _F:
    """`fn`, called directly until ``torch._dynamo`` is imported, then through
    ``torch._dynamo.disable(fn, recursive)`` (built once, on the first call after the import)."""
    disabled: Callable[..., Any] | None = None

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        nonlocal disabled
        if disabled is None:
            disable = getattr(sys.modules.get("torch._dynamo"), "disable", None)
            if disable is None:  # Dynamo absent or half-imported: its frame hook is not installed
                return fn(*args, **kwargs)
            disabled = disable(fn, recursive, wrapping=False)
        return disabled(*args, **kwargs)

    return call  # type: ignore[return-value]  # the gate calls through with the wrapped function's signature


class LazyDynamoDispatchMode(TorchDispatchMode):
    """A dispatch mode whose ``__torch_dispatch__`` does not import Dynamo on its first call."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # False: torch leaves __torch_dispatch__ alone; __init_subclass__ below wraps it lazily.
        return False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        raw = cls.__dict__.get("__torch_dispatch__")
        if raw is not None and not isinstance(raw, classmethod):
            cls.__torch_dispatch__ = disabled_once_dynamo_loads(raw)  # type: ignore[method-assign]  # wraps the class's dispatch hook in place


def defer_kernel_dynamo_guard(op: Any) -> None:
    """Let the kernels registered on a ``torch.library.custom_op`` so far skip the Dynamo
    import until Dynamo is in the process (then they go through ``torch._dynamo.disable``
    as torch would have). Call it after ``register_kernel``."""
    for wrapped in op._backend_fns.values():
        raw = getattr(wrapped, "__wrapped__", None)
        if raw is not None and getattr(raw, _TORCH_DISABLE_SLOT, None) is None:
            setattr(raw, _TORCH_DISABLE_SLOT, disabled_once_dynamo_loads(raw))


def _probe() -> None:
    return None


def defer_torch_dynamo_guards() -> int:
    """Give every function torch has wrapped in ``torch._disable_dynamo`` so far the behaviour
    of `disabled_once_dynamo_loads` (torch's wrapper calls the twin in its cache slot; the twin
    builds torch's own ``torch._dynamo.disable(fn, recursive)`` once Dynamo is imported).
    Returns how many it deferred; 0 when torch's wrapper no longer has the expected shape."""
    code = torch._disable_dynamo(_probe).__code__
    if code.co_freevars != ("fn", "recursive"):
        return 0
    deferred = 0
    # The wrappers are the functions whose code object is that one: its referrers (a third of
    # the time of a pass over every object the collector tracks, the same functions).
    for obj in gc.get_referrers(code):
        if type(obj) is not types.FunctionType or obj.__code__ is not code or not obj.__closure__:
            continue
        cells = dict(zip(code.co_freevars, obj.__closure__))
        fn, recursive = cells["fn"].cell_contents, cells["recursive"].cell_contents
        if getattr(fn, _TORCH_DISABLE_SLOT, None) is not None:
            continue
        try:
            setattr(fn, _TORCH_DISABLE_SLOT, disabled_once_dynamo_loads(fn, recursive))
        except (AttributeError, TypeError):  # an object without attributes: left as torch made it
            continue
        deferred += 1
    return deferred
