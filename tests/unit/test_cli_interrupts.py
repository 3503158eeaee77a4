"""Ctrl-C while torch loads: held back until the import is whole, then exit 130.

torch's C++ start-up imports numpy and, if that import is interrupted, goes on without numpy
instead of raising, so a Ctrl-C in the first seconds of `ascendgraph run` used to be lost
(the run went on). The command line imports torch with SIGINT deferred."""

from __future__ import annotations

import signal
from typing import Iterator

import pytest

from ascendgraph.cli import app


@pytest.fixture
def python_sigint_handler() -> Iterator[None]:
    """The handler a fresh interpreter has (a test runner may have installed another)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


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
