"""Ctrl-C while torch loads: held back until the import is whole, then exit 130.

torch's C++ start-up imports numpy and, if that import is interrupted, goes on without numpy
instead of raising, so a Ctrl-C in the first seconds of `ascendgraph run` used to be lost
(the run went on). The command line imports torch with SIGINT deferred.

And Ctrl-C / SIGTERM that Python dropped in a weakref callback, or that C code swallowed: delivered
again, exit 130 / 143."""

from __future__ import annotations

import argparse
import signal
import sys
import time
import weakref
from typing import Iterator

import pytest

from ascendgraph.cli import app, streams


def _fresh_interpreter_handler(signum: signal.Signals, handler: object) -> Iterator[None]:
    """The handler a fresh interpreter has for ``signum`` (a test runner may have installed another)."""
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


@pytest.fixture
def python_sigint_handler() -> Iterator[None]:
    yield from _fresh_interpreter_handler(signal.SIGINT, signal.default_int_handler)


def test_a_ctrl_c_during_the_block_is_raised_after_it_completes(python_sigint_handler):
    finished = []
    with pytest.raises(KeyboardInterrupt):
        with app._interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
            finished.append("the import went on to the end")
    assert finished == ["the import went on to the end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_without_a_ctrl_c_nothing_is_raised_and_the_handler_is_restored(python_sigint_handler):
    with app._interrupts_deferred():
        pass
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_someone_elses_handler_is_left_alone():
    calls = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: calls.append(signum))
    try:
        with app._interrupts_deferred():
            signal.raise_signal(signal.SIGINT)
        assert calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_while_torch_loads_is_exit_130(python_sigint_handler, monkeypatch, capsys):
    def interrupted_torch_import() -> None:
        with app._interrupts_deferred():
            signal.raise_signal(signal.SIGINT)  # arrives mid-import; torch would swallow it

    monkeypatch.setattr(app, "_import_torch_whole", interrupted_torch_import)
    assert app.main(["run", "--requests", "1"]) == app.INTERRUPTED
    assert capsys.readouterr().err.strip().endswith("interrupted")
    assert "run" in app.COMMANDS_USING_TORCH and "explain" not in app.COMMANDS_USING_TORCH


# A signal handler runs between any two bytecodes, also inside a weakref callback, where the
# exception it raises is dropped ("Exception ignored in ..."). A Ctrl-C landing in one of
# torch's weakref callbacks during a capture was lost and the run went on to exit 0.


class _Referent:
    pass


def _dropped_in_a_weakref_callback(error: type[BaseException]) -> None:
    """What the handler does when the signal lands in a callback: raise where Python drops it."""

    def callback(ref: object) -> None:
        raise error()

    referent = _Referent()
    ref = weakref.ref(referent, callback)
    del referent  # the callback runs here; its exception goes to sys.unraisablehook
    assert ref() is None


def _busy(seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.001)


@pytest.fixture
def python_sigterm_handler() -> Iterator[None]:
    yield from _fresh_interpreter_handler(signal.SIGTERM, signal.SIG_DFL)


def test_other_dropped_exceptions_go_to_the_previous_hook(monkeypatch):
    seen: list[type] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: seen.append(unraisable.exc_type))
    recorder = sys.unraisablehook
    with streams.signals_never_lost():
        _dropped_in_a_weakref_callback(ValueError)
    assert seen == [ValueError]
    assert sys.unraisablehook is recorder


# An interrupt can also vanish without reaching sys.unraisablehook: when the Python code the
# handler interrupts was called by C code that clears every error (torch's C++ attribute
# lookups, CPython's PyObject_HasAttr). The command ran on and exited 0. Here C code that
# clears errors is PyObject_HasAttrString, called through ctypes on an object whose
# __getattr__ is where the signal lands.

import ctypes  # noqa: E402

_has_attr = ctypes.pythonapi.PyObject_HasAttrString
_has_attr.argtypes = (ctypes.py_object, ctypes.c_char_p)
_has_attr.restype = ctypes.c_int


class _SignalInGetattr:
    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __getattr__(self, name: str) -> object:
        signal.raise_signal(self.signum)  # the handler runs in this frame; its exception goes to C
        _busy(0.01)
        raise AttributeError(name)


def _swallowed_by_c_code(signum: int) -> None:
    assert _has_attr(_SignalInGetattr(signum), b"anything") == 0  # C cleared the interrupt


def _lost_in_a_weakref_callback(signum: int) -> None:
    _dropped_in_a_weakref_callback(KeyboardInterrupt if signum == signal.SIGINT else streams.Terminated)


LOST = {"in a weakref callback": _lost_in_a_weakref_callback, "in C code that clears errors": _swallowed_by_c_code}


@pytest.mark.parametrize("where", sorted(LOST))
def test_a_lost_ctrl_c_is_raised_in_the_command(python_sigint_handler, capsys, where):
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with streams.signals_never_lost():
            LOST[where](signal.SIGINT)
            reached.append("after it was lost")
            _busy(5.0)  # delivered again long before 5 s
            reached.append("the command ran on")
    assert reached == ["after it was lost"]
    assert "Exception ignored" not in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("where", sorted(LOST))
def test_a_lost_sigterm_is_raised_as_terminated(python_sigterm_handler, where):
    with pytest.raises(streams.Terminated):
        with streams.sigterm_unwinds(), streams.signals_never_lost():
            LOST[where](signal.SIGTERM)
            _busy(5.0)


@pytest.mark.parametrize("where", sorted(LOST))
def test_a_block_that_ends_before_the_redelivery_raises_at_its_end_and_nothing_later(python_sigint_handler, where):
    with pytest.raises(KeyboardInterrupt):
        with streams.signals_never_lost():
            LOST[where](signal.SIGINT)
    _busy(20 * streams.REDELIVERY_DELAY_S)  # no late interrupt lands here
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("where", sorted(LOST))
def test_the_command_line_turns_a_lost_ctrl_c_into_exit_130(python_sigint_handler, monkeypatch, capsys, where):
    ran_to_the_end = []

    def command(argv: object) -> int:
        LOST[where](signal.SIGINT)
        _busy(5.0)
        ran_to_the_end.append(True)
        return 0

    monkeypatch.setattr(app, "_main", command)
    assert app.main(["run"]) == app.INTERRUPTED
    assert ran_to_the_end == []
    assert capsys.readouterr().err == "ascendgraph: interrupted\n"


def test_a_slow_cleanup_while_unwinding_is_not_interrupted_again(python_sigint_handler):
    cleaned = []
    with pytest.raises(KeyboardInterrupt):
        with streams.signals_never_lost():
            try:
                signal.raise_signal(signal.SIGINT)
                _busy(5.0)
            finally:
                _busy(30 * streams.REDELIVERY_DELAY_S)  # e.g. removing temporary outputs
                cleaned.append(True)
    assert cleaned == [True]


def test_a_ctrl_c_the_command_handled_is_not_delivered_again(python_sigint_handler, monkeypatch, capsys):
    def command(name: str) -> app.Command:
        def run(args: object) -> int:
            signal.raise_signal(signal.SIGINT)
            return 0
        return app.Command(name, "", "", lambda parser: None, run)

    after = []
    monkeypatch.setattr(app, "_import_torch_whole", lambda: None)
    with streams.signals_never_lost():
        code = app._run_command(command("explain"), argparse.Namespace())
        _busy(30 * streams.REDELIVERY_DELAY_S)  # no second interrupt lands here
        after.append(True)
    assert code == app.INTERRUPTED and after == [True]
