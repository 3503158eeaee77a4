"""The command line: one module per subcommand, plus the translation of pasted `vllm serve` lines.

`main(argv)` is the console script `ascendgraph`. It imports the command line only when
called, so a Ctrl-C while the modules load is exit 130 like a Ctrl-C later (no traceback).
Called as the console script (no ``argv``), a Ctrl-C that lands once the command has
returned, while the interpreter shuts down (flushing, atexit handlers, joining threads),
ends the process with 130 at once instead of a KeyboardInterrupt "ignored" in that code and
exit 0.

`console_main()` is what the ``ascendgraph`` script and ``python -m ascendgraph`` call: `main`,
then, when the process is the command's own, it ends without CPython's teardown
(`exit_without_teardown`).
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn, Optional, Sequence

from ascendgraph.caller_state import RUN_MIDDLE_GENERATION_THRESHOLD, RUN_YOUNG_GENERATION_THRESHOLD, run_thresholds

__all__ = ["main", "console_main"]

INTERRUPTED = 130  # 128 + SIGINT (ascendgraph.cli.streams.INTERRUPTED, not imported here: see above)


# The console script's young and middle generations (CPython's defaults: 700 allocations, 10
# young collections). A run keeps most of what it allocates (captured graphs, their records):
# with the defaults, the collector ran about 900 young and 6 full collections of one
# `ascendgraph run`, 0.45 s of CPU; with the young generation alone raised, 7 middle
# collections, 0.26 s. The same as `ascendgraph.run` uses while it runs
# (ascendgraph/caller_state.py, which imports nothing heavy).
YOUNG_GENERATION_THRESHOLD = RUN_YOUNG_GENERATION_THRESHOLD
MIDDLE_GENERATION_THRESHOLD = RUN_MIDDLE_GENERATION_THRESHOLD


def main(argv: Optional[Sequence[str]] = None) -> int:
    if argv is None:  # the console script: this process is the command's (a caller's own main(argv) is left alone)
        import gc

        gc.set_threshold(*run_thresholds(gc.get_threshold()))
    try:
        from ascendgraph.cli.app import main as app_main
    except KeyboardInterrupt:
        try:
            sys.stderr.write("ascendgraph: interrupted\n")
        except (OSError, ValueError, AttributeError):
            pass
        return INTERRUPTED
    code = app_main(argv)
    _forget_caught_interrupts()
    if argv is None:
        _late_ctrl_c_exits_130()
        _skip_the_closing_collection()
    return code


def _skip_the_closing_collection() -> None:
    """The console script's process ends when `main` returns: CPython's shutdown runs one full
    garbage collection over every live object (0.2 s after an ``ascendgraph run``), which frees
    nothing the exit would not. Freezing them first leaves it nothing to walk; atexit handlers
    and ``weakref.finalize`` callbacks still run, the output is already written."""
    import gc

    gc.freeze()


def _forget_caught_interrupts() -> None:
    """Let the exit status be the one `main` returns, also under ``python -m ascendgraph``.

    CPython records a KeyboardInterrupt that ended a string ``exec`` / ``eval`` (torch and the
    standard library run generated code that way) even when a caller catches it, and under
    ``-m`` it ends the process by SIGINT once the interpreter has shut down (CPython 3.11
    Python/pythonrun.c ``run_eval_code_obj`` sets ``unhandled_keyboard_interrupt``;
    Modules/main.c ``Py_RunMain`` checks it and calls ``exit_sigint``; a script or the console
    script exits through ``Py_Exit`` and never looks). A Ctrl-C the command answered with
    130 then came out as a death by SIGINT, at random. The record is cleared at the start of
    every string evaluation, so one that completes here clears it: the command has returned,
    so no interrupt is unhandled."""
    exec("")  # noqa: S102  (a string: evaluated through run_eval_code_obj, see above)


def _late_ctrl_c_exits_130() -> None:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return

    def exit_now(signum: int, frame: Any) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # a closed or full stream: nothing more to say
                pass
        os._exit(INTERRUPTED)

    signal.signal(signal.SIGINT, exit_now)


def console_main() -> NoReturn:
    """The ``ascendgraph`` console script and ``python -m ascendgraph``: `main`, then the
    process ends (`exit_without_teardown`) when it is the command's own: started as the script
    or with ``-m ascendgraph``, no profiler or tracer installed. A program that runs ascendgraph
    inside its own process (``python -m cProfile -m ascendgraph``, ``pdb``, ``runpy``) gets
    control back through the normal ``sys.exit``."""
    code = main()
    if _process_is_the_commands() and sys.getprofile() is None and sys.gettrace() is None:
        exit_without_teardown(code)
    sys.exit(code)


# Interpreter options that take the next argument as their value (python --help).
_INTERPRETER_OPTIONS_WITH_A_VALUE = ("-W", "-X")
COMMAND_MODULES = ("ascendgraph", "ascendgraph.__main__")


def _process_is_the_commands(orig_argv: Optional[Sequence[str]] = None, script: Optional[str] = None) -> bool:
    """Whether the interpreter was started to run ascendgraph itself: its command line
    (``sys.orig_argv``), after the interpreter's own options, is ``-m ascendgraph`` or the script
    ``sys.argv[0]`` names (the console script); not ``-c``, stdin or another module or script
    that runs ascendgraph inside it. The facade's launcher reads ``-m`` the same way
    (sim/launcher_process.py ``module_after_dash_m``); the two cannot share one function, as
    ascendgraph never imports sim and the launcher must start without importing ascendgraph."""
    argv = list(getattr(sys, "orig_argv", ()) if orig_argv is None else orig_argv)
    script = sys.argv[0] if script is None else script
    position = 1
    while position < len(argv):
        argument = argv[position]
        if argument == "-m":
            return argv[position + 1:position + 2] in ([name] for name in COMMAND_MODULES)
        if argument.startswith("-m"):
            return argument[2:] in COMMAND_MODULES
        if argument in ("-c", "-") or not argument.startswith("-"):
            return argument == script and argument not in ("-c", "-")
        position += 2 if argument in _INTERPRETER_OPTIONS_WITH_A_VALUE else 1
    return False


def exit_without_teardown(code: int) -> NoReturn:
    """End the process with ``code`` once its output is written and its atexit handlers ran,
    skipping what CPython's shutdown does after them: tearing down every module and freeing
    every object one by one (about 0.1 s after an ``ascendgraph run``, whose process holds
    1,800 modules and the captured graphs), which frees nothing the exit would not.

    Where that teardown could still do something, the process exits the normal way instead:
    a stream that does not flush (a closed pipe keeps CPython's own report and status), a
    thread that is not a daemon (CPython waits for it), an interpreter without the atexit
    runner. The atexit handlers run as at a normal exit (logging's flush, ``weakref.finalize``
    callbacks such as temporary directories' clean-up, multiprocessing's wait for its
    children). mypy ends its own process the same way (mypy/util.py ``hard_exit``)."""
    import atexit
    import threading

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    try:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        sys.exit(code)
    if run_exit_handlers is None or others or threading.current_thread() is not threading.main_thread():
        sys.exit(code)
    run_exit_handlers()
    try:
        for stream in (sys.stdout, sys.stderr):  # what the handlers wrote
            if stream is not None:
                stream.flush()
    except (OSError, ValueError):
        pass  # the handlers ran: a stream closed meanwhile has nothing left to say
    os._exit(code)
