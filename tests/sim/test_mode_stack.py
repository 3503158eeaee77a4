"""`sim.mode_stack.withdraw` takes exactly the given modes off torch's mode stacks: a mode
pushed above one the simulator opened keeps its place and keeps working (torch's own
``__exit__`` would have popped it instead)."""

from __future__ import annotations

from typing import Any

import torch
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

from sim.mode_stack import on_stack, reentered, withdraw


class Counting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.calls += 1
        return func(*args, **(kwargs or {}))


class Zeroing(TorchDispatchMode):
    """Stands for a task update's collector: ops under it do not compute."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        return out.zero_() if isinstance(out, torch.Tensor) else out


class Naming(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_a_mode_below_a_foreign_one_is_withdrawn_and_the_foreign_one_keeps_working() -> None:
    x = torch.ones(2)
    below, above = Zeroing(), Counting()
    below.__enter__()
    above.__enter__()
    try:
        zeroed = x + 1  # the zeroing mode is in force
        withdraw(below)
        assert _get_current_dispatch_mode_stack() == [above] and not on_stack(below)
        computed = x + 1
        calls = above.calls
        torch.ones(2) * 3
        assert above.calls > calls  # the foreign mode is still on the stack, in force
    finally:
        withdraw(above)
    assert _get_current_dispatch_mode_stack() == []
    assert torch.equal(zeroed, torch.zeros(2)) and torch.equal(computed, torch.full((2,), 2.0))


def test_function_modes_are_withdrawn_in_place_and_absent_modes_are_left_alone() -> None:
    first, second = Naming(), Naming()
    first.__enter__()
    second.__enter__()
    withdraw(first)
    assert _get_current_function_mode_stack() == [second]
    withdraw(first)  # no longer there: nothing happens
    withdraw(second)
    assert _get_current_function_mode_stack() == []


def test_torch_still_knows_whether_a_dispatch_mode_is_in_force_after_a_withdrawal() -> None:
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode

    below, above = Zeroing(), Counting()
    below.__enter__()
    above.__enter__()
    withdraw(below)
    assert is_in_torch_dispatch_mode()  # the mode above is still in force
    withdraw(above)
    assert not is_in_torch_dispatch_mode()  # and none is once it is gone too


class OpensAGuardInsideAWrapper(TorchDispatchMode):
    """Stands for the capture recorder running hw's attention wrapper op, whose Python
    implementation opens a task group (the facade pushes its guard) that closes after it."""

    def __init__(self) -> None:
        super().__init__()
        self.guard = Counting()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func is torch.ops.aten.neg.default:
            with reentered(self):  # the wrapper's implementation issues its kernels under the mode
                self.guard.__enter__()
                return torch.mul(args[0], -1)
        return func(*args, **(kwargs or {}))


def test_a_mode_pushed_inside_a_reentered_dispatch_stays_and_everything_leaves_cleanly() -> None:
    from torch.utils._python_dispatch import is_in_torch_dispatch_mode

    recorder = OpensAGuardInsideAWrapper()
    recorder.__enter__()
    torch.neg(torch.ones(2))
    assert on_stack(recorder.guard)  # torch's own exit of the re-entry would have popped the guard
    withdraw(recorder.guard)
    assert _get_current_dispatch_mode_stack() == [recorder] and is_in_torch_dispatch_mode()
    withdraw(recorder)
    assert _get_current_dispatch_mode_stack() == [] and not is_in_torch_dispatch_mode()
