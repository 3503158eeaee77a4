"""Taking one of the simulator's modes off torch's mode stacks, wherever it sits.

A capture, a task update and the facade's task-group guard are opened by one call and closed
by another (torch_npu's begin/end API), so their mode stays on torch's thread-local mode stack
in between. torch's own ``__exit__`` pops whatever mode is on top (torch 2.13:
``torch/utils/_python_dispatch.py`` ``TorchDispatchMode.__exit__`` calls ``_pop_mode(None)``,
``torch/overrides.py`` ``TorchFunctionMode.__exit__`` calls ``_pop_mode()``): when the closing
call comes after another mode was pushed above, or never comes (an exception in between, a
test that stopped half-way), ``__exit__`` takes the wrong mode off, or the mode stays there
and every later op of the process goes through it (a task update's collector turns every
later eager op into an uncomputed output).

`withdraw` takes exactly the given modes off the current thread's stacks and leaves the
others where they were. torch also keeps three "a dispatch mode is in force" flags, each mode
saving the previous value when it enters and restoring it when it exits, which is right only
for last-in-first-out exits; after a withdrawal `withdraw` sets them (and the values the
remaining modes saved) from the stack as it now is. It is meant for the begin/end calls of the
simulator and the facade, which run outside any mode's ``__torch_dispatch__``.

`reentered` is what a mode's ``__torch_dispatch__`` uses to see the kernels a wrapper op's
Python implementation issues: the mode back on top for the block (torch has taken it off while
its ``__torch_dispatch__`` runs and puts it back afterwards), and that entry taken off again
after the block, not whatever is on top (a task group opened inside a wrapper op pushed the
facade's guard above it, and the guard must stay). `on_stack` says whether a mode is there.
`run_functionalized_ops_under(mode_type)` lets a dispatch mode type see through torch's
``auto_functionalized(_v2)`` higher-order ops (a compiled graph's mutating ops), which reach no
``__torch_dispatch__`` and ask each mode type for an implementation.
tests/sim/test_mode_stack.py pins the torch internals this relies on.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Union

import torch.utils._python_dispatch as _dispatch
from torch._C._dynamo.guards import set_is_in_mode_without_ignore_compile_internals
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.overrides import _pop_mode as _pop_function_mode, _push_mode as _push_function_mode
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._python_dispatch import _pop_mode as _pop_dispatch_mode, _push_mode as _push_dispatch_mode

__all__ = ["withdraw", "on_stack", "reentered", "run_functionalized_ops_under"]

Mode = Union[TorchDispatchMode, TorchFunctionMode]
# The values a TorchDispatchMode saves on entry (torch 2.13 TorchDispatchMode.__enter__), in
# the order of `_flags`.
_SAVED = ("old_dispatch_mode_flags", "old_non_infra_dispatch_mode_flags",
          "old_without_ignore_compile_internals_dispatch_mode_flags")


def _stack(mode: Mode) -> list[Any]:
    if isinstance(mode, TorchDispatchMode):
        return _get_current_dispatch_mode_stack()
    return _get_current_function_mode_stack()


def on_stack(mode: Mode) -> bool:
    """True while ``mode`` is on the current thread's mode stack."""
    return any(entry is mode for entry in _stack(mode))


def _pop(mode: Mode) -> Any:
    if isinstance(mode, TorchDispatchMode):
        return _pop_dispatch_mode(getattr(mode, "_mode_key", None))
    return _pop_function_mode()


def _push(mode: Any) -> None:
    if isinstance(mode, TorchDispatchMode):
        _push_dispatch_mode(mode)
    else:
        _push_function_mode(mode)


def _take_off_top_entry(mode: Mode) -> None:
    """Take the topmost entry of ``mode`` off the stack; the entries above go back in order.
    No flag is touched (torch's own pushes and pops of a mode around its dispatch touch none)."""
    above: list[Any] = []
    while on_stack(mode):
        top = _stack(mode)[-1]
        _pop(top)
        if top is mode:
            break
        above.append(top)
    for other in reversed(above):
        _push(other)


def _flags(modes: list[Any]) -> tuple[bool, bool, bool]:
    """torch's three flags for a stack holding ``modes``."""
    return (
        bool(modes),
        any(not mode.is_infra_mode() for mode in modes),
        any(not mode.ignore_compile_internals() for mode in modes),
    )


def _set_flags_from_the_stack() -> None:
    stack = _get_current_dispatch_mode_stack()
    seen: dict[int, int] = {}
    for position, mode in enumerate(stack):  # what each entry saved: the flags of the stack below it
        occurrence = seen[id(mode)] = seen.get(id(mode), -1) + 1
        saved: list[Any] = [getattr(mode, name, None) for name in _SAVED]
        if all(queue is not None and len(queue) == stack.count(mode) for queue in saved):
            for queue, value in zip(saved, _flags(stack[:position])):
                queue[occurrence] = value
    in_mode, non_infra, without_ignore = _flags(stack)
    _dispatch._is_in_torch_dispatch_mode = in_mode
    _dispatch._is_in_non_infra_torch_dispatch_mode = non_infra
    _dispatch._is_in_any_mode_without_ignore_compile_internals = without_ignore
    set_is_in_mode_without_ignore_compile_internals(without_ignore)


def withdraw(*modes: Mode) -> None:
    """Take each of ``modes`` off the current thread's mode stacks (a mode not there is left
    alone); every other mode keeps its place, and torch's dispatch-mode flags follow."""
    dispatch = False
    for mode in modes:
        while on_stack(mode):
            _take_off_top_entry(mode)
            if isinstance(mode, TorchDispatchMode):
                dispatch = True
                for name in _SAVED:
                    queue = getattr(mode, name, None)
                    if queue:
                        queue.pop()
    if dispatch:
        _set_flags_from_the_stack()


@contextlib.contextmanager
def reentered(mode: Mode) -> Iterator[None]:
    """``mode`` back on top of the stack for the block, and that entry off again after it (see
    the module docstring). Called from ``mode``'s own ``__torch_dispatch__``, where torch holds
    the mode in force already: its flags stay as they are."""
    _push(mode)
    try:
        yield
    finally:
        _take_off_top_entry(mode)


def _functionalized_op_runs_under_the_mode(mode: TorchDispatchMode, _mutable_op: Any, **kwargs: Any) -> Any:
    """The dense implementation of ``auto_functionalized(_v2)`` (clone the mutated bases, call the
    op, return the results) with ``mode`` re-entered, so the ops it issues reach the mode."""
    from torch._higher_order_ops.auto_functionalize import (auto_functionalized, auto_functionalized_dense,
                                                            auto_functionalized_v2_dense)

    dense = auto_functionalized_dense if kwargs.pop("_hop", None) is auto_functionalized else auto_functionalized_v2_dense
    with reentered(mode):
        return dense(_mutable_op, **kwargs)


def run_functionalized_ops_under(mode_type: type) -> None:
    """A compiled graph calls a mutating op (vLLM's compiled model: its attention op writes
    ``output`` in place) through torch's ``auto_functionalized`` / ``_v2`` higher-order op. A
    higher-order op does not reach ``__torch_dispatch__``: it asks for an implementation per mode
    type, and refuses a mode type it has none for. Under ``mode_type`` it runs its dense
    implementation with the mode re-entered."""
    from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2

    auto_functionalized.py_impl(mode_type)(
        lambda mode, _mutable_op, **kwargs: _functionalized_op_runs_under_the_mode(
            mode, _mutable_op, _hop=auto_functionalized, **kwargs))
    auto_functionalized_v2.py_impl(mode_type)(
        lambda mode, _mutable_op, **kwargs: _functionalized_op_runs_under_the_mode(mode, _mutable_op, **kwargs))
