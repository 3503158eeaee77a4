"""The command line's streams and signals: results to stdout, messages to stderr, and how a
command ends when its reader or its process goes away.

* stdout (`emit_result`, `emit_json`): text from inputs escaped (`ascendgraph.readers.shown`,
  newlines kept), written in whatever encoding stdout has (``PYTHONIOENCODING=ascii``: what it
  cannot carry becomes a backslash escape, never a UnicodeEncodeError); a write that fails is
  tagged so `ascendgraph.cli.app.main` reports it as a stdout failure; a reader that went away
  with the output unread is a closed pipe (exit 141) even when the pipe buffer took it all.
* stderr (`emit_text`): best effort, escaped, in stderr's encoding.
* SIGTERM while a command runs raises `Terminated` (exit 143), so temporary outputs are
  removed by the ``finally`` blocks that own them.
* A Ctrl-C or SIGTERM is never lost (`signals_never_lost`): Python runs a signal's handler
  between any two bytecodes, inside a weakref callback or a ``__del__`` method too (an
  exception raised there is printed as "Exception ignored" and dropped), and inside Python
  code that C code called and whose errors it clears; a watch delivers it again.
"""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator, Optional

from ascendgraph.errors import StdoutWriteError, Terminated
from ascendgraph.readers import dump_json, shown

__all__ = ["emit_json", "emit_result", "emit_text", "write_stdout", "Terminated", "sigterm_unwinds",
           "signals_never_lost", "interrupt_handled", "is_default_interrupt_handler", "REDELIVERY_DELAY_S", "LOST_AFTER_LOOKS", "INTERRUPTED",
           "TERMINATED", "PIPE_CLOSED", "ClosedStdout", "is_stdout_error", "silence_stdout"]

def emit_json(document: dict[str, Any]) -> None:
    """The ``--json`` document on stdout: with ``--json`` it is the only thing there."""
    write_stdout(dump_json(document) + "\n")


def emit_result(text: str) -> None:
    """A command's result (its report, table or plan) on stdout, where ``| less`` and ``>``
    find it; logs, progress and warnings go to stderr (`emit_text`, logging)."""
    write_stdout(text + "\n")


def _encodable(text: str) -> str:
    """``text`` as stdout's encoding can carry it (``PYTHONIOENCODING=ascii``, a C locale, a lone
    surrogate from a file name): what it cannot encode is written as a backslash escape."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
        return text
    except (UnicodeEncodeError, LookupError):
        try:
            return text.encode(encoding, "backslashreplace").decode(encoding, "replace")
        except LookupError:
            return text.encode("ascii", "backslashreplace").decode("ascii")


def _reader_left_unread() -> bool:
    """stdout is a pipe whose reader is gone (POLLERR) with our bytes still unread in it: what
    was written never arrived (``| head -c 10`` of a document the pipe buffer swallowed whole).
    The write itself succeeded, so this is the only sign; reported like a closed pipe (141)."""
    try:
        import fcntl
        import select
        import stat
        import struct
        import termios

        fd = sys.stdout.fileno()
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return False
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        if not any(events & select.POLLERR for _, events in poller.poll(0)):
            return False
        unread = struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]
        return unread > 0
    except (OSError, ValueError, AttributeError, ImportError):
        return False


def write_stdout(text: str) -> None:
    try:
        sys.stdout.write(_encodable(shown(text, keep_newlines=True)))
        sys.stdout.flush()
        if _reader_left_unread():
            raise BrokenPipeError(errno.EPIPE, "the reader of stdout went away before reading it")
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise StdoutWriteError(exc.errno, exc.strerror or str(exc)) from exc


def emit_text(text: str) -> None:
    """A line on stderr (errors, notes, progress); best effort (a closed or full stderr must not
    turn into a traceback)."""
    try:
        line = shown(text, keep_newlines=True) + "\n"
        encoding = getattr(sys.stderr, "encoding", None) or "utf-8"
        sys.stderr.write(line.encode(encoding, "backslashreplace").decode(encoding, "replace"))
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError, LookupError):
        pass



INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a process ended by Ctrl-C
TERMINATED = 143  # 128 + SIGTERM


@contextmanager
def sigterm_unwinds() -> Iterator[None]:
    """While the command runs, SIGTERM raises `Terminated` instead of killing the process on the
    spot, so temporary files are removed; the previous handler is restored afterwards. A no-op
    off the main thread or when the embedding program handles SIGTERM itself."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    signal.signal(signal.SIGTERM, _unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _unwind(signum: int, frame: Any) -> None:
    raise Terminated()


# How often the watch over a received Ctrl-C / SIGTERM looks at the main thread, and how many
# looks in a row must find it in ordinary code (not handling the interrupt) before the
# interrupt counts as lost and is delivered again. Unwinding runs ``finally`` and ``except``
# blocks with the interrupt as the exception being handled; a few milliseconds outside one is
# normal, tens of milliseconds in ordinary code mean it was swallowed.
REDELIVERY_DELAY_S = 0.01
LOST_AFTER_LOOKS = 3


class _Delivery:
    """One command's watch over the interrupts it received (`signals_never_lost`)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.RLock()  # a signal handler may run while the main thread holds it
        self.main_ident = threading.main_thread().ident
        self.signum: Optional[int] = None  # received and not yet handled by the command
        self.last_signum: Optional[int] = None  # the last one delivered again
        self.handled = False
        self.closed = False
        self.redelivery_pending = False  # interrupt_main called, the handler has not run yet
        self.watch: Optional[threading.Thread] = None

    def received(self, signum: int) -> None:
        import threading

        with self.lock:
            self.redelivery_pending = False
            if self.closed:
                return
            self.signum, self.handled = signum, False
            if self.watch is None or not self.watch.is_alive():
                self.watch = threading.Thread(target=self._watch, name="ascendgraph-interrupt-watch", daemon=True)
                self.watch.start()

    def _unwinding(self, signum: int) -> bool:
        """Whether the main thread is handling the interrupt now (in a ``finally`` / ``except``)."""
        found: Any = sys._current_exceptions().get(self.main_ident or 0)
        current = found[1] if isinstance(found, tuple) else found  # Python < 3.12: (type, value, traceback)
        expected = Terminated if signum == _sigterm() else KeyboardInterrupt
        return isinstance(current, expected)

    def _watch(self) -> None:
        import _thread
        import signal
        import time

        misses = 0
        while True:
            time.sleep(REDELIVERY_DELAY_S)
            with self.lock:
                if self.closed or self.handled or self.signum is None:
                    return
                if self.redelivery_pending or self._unwinding(self.signum):
                    misses = 0
                    continue
                misses += 1
                if misses >= LOST_AFTER_LOOKS:  # swallowed: raise it again in ordinary code
                    misses = 0
                    self.redelivery_pending, self.last_signum = True, self.signum
                    _thread.interrupt_main(signal.Signals(self.signum))

    def close(self) -> Optional[int]:
        """Stop watching; the signal received and never handled by the command, if any."""
        with self.lock:
            self.closed = True
            lost = None if self.handled else self.signum
            self.signum = None
        return lost


_DELIVERIES: list[_Delivery] = []  # the main thread's open `signals_never_lost` blocks, innermost last


def _sigterm() -> int:
    import signal

    return int(signal.SIGTERM)


def is_default_interrupt_handler(handler: Any) -> bool:
    """Python's own SIGINT handler, or `signals_never_lost`'s wrapper of it."""
    import signal

    return signal.default_int_handler in (handler, getattr(handler, "ascendgraph_wraps", None))


def interrupt_handled() -> None:
    """The command caught the interrupt and is ending because of it (`ascendgraph.cli.app`):
    the watch stops, nothing is delivered again."""
    if _DELIVERIES:
        delivery = _DELIVERIES[-1]
        with delivery.lock:
            delivery.handled = True


@contextmanager
def signals_never_lost() -> Iterator[None]:
    """While the block runs, a Ctrl-C or SIGTERM is never lost, wherever it lands.

    Python runs a signal's handler between any two bytecodes. The KeyboardInterrupt (or
    `Terminated`) it raises is dropped when that happens inside a weakref callback or a
    ``__del__`` method (it reaches ``sys.unraisablehook`` instead of the command), and it
    vanishes when the interrupted Python code was called by C code that clears every error
    (torch's C++ attribute lookups do, CPython's ``PyObject_HasAttr`` does): the command then
    ran on and exited 0. So the interrupt is watched until the command handles it
    (`interrupt_handled`) or the block ends: a thread looks at the main thread every
    ``REDELIVERY_DELAY_S``; when ``LOST_AFTER_LOOKS`` looks in a row find it in ordinary code
    rather than unwinding (no ``finally`` / ``except`` block handling the interrupt), the
    interrupt was lost and is delivered again (``_thread.interrupt_main`` with the same
    signal). An interrupt received and never handled when the block ends is raised there.
    Dropped interrupts are not printed ("Exception ignored"); other unraisable exceptions go
    to the previous hook unchanged. The Python-level SIGINT handler (and `sigterm_unwinds`'s
    SIGTERM handler) is wrapped for the block; someone else's handler is left alone. A no-op
    off the main thread."""
    import signal
    import threading
    import time

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    delivery = _Delivery()
    previous_hook = sys.unraisablehook
    wrapped: dict[int, Any] = {}

    def recorder(handler: Any) -> Any:
        def record_then_raise(signum: int, frame: Any) -> None:
            closed = delivery.closed
            delivery.received(signum)
            if not closed:
                handler(signum, frame)

        record_then_raise.ascendgraph_wraps = handler  # type: ignore[attr-defined]  # a marker attribute on a function object
        return record_then_raise

    for signum, ours in ((signal.SIGINT, signal.default_int_handler), (signal.SIGTERM, _unwind)):
        if signal.getsignal(signum) is ours:
            wrapped[signum] = ours
            signal.signal(signum, recorder(ours))

    def drop(unraisable: Any) -> None:
        exc_type = unraisable.exc_type
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            delivery.received(signal.SIGINT)
        elif exc_type is not None and issubclass(exc_type, Terminated):
            delivery.received(signal.SIGTERM)
        else:
            previous_hook(unraisable)

    sys.unraisablehook = drop
    _DELIVERIES.append(delivery)
    try:
        yield
    except (KeyboardInterrupt, Terminated):
        interrupt_handled()  # it reached the end of the block: the caller's handlers take it
        raise
    finally:
        _DELIVERIES.remove(delivery)
        lost = delivery.close()
        # A redelivery the watch made just now lands here (any call runs a pending handler),
        # in the wrapper, which no longer raises once the delivery is closed; then the
        # handlers are put back.
        deadline = time.monotonic() + 1.0
        while delivery.redelivery_pending and delivery.last_signum in wrapped and time.monotonic() < deadline:
            pass
        for wrapped_signum, handler in wrapped.items():
            signal.signal(wrapped_signum, handler)
        sys.unraisablehook = previous_hook
        if lost is not None:
            if lost == signal.SIGTERM:
                raise Terminated()
            raise KeyboardInterrupt


PIPE_CLOSED = 141  # 128 + SIGPIPE, what a shell reports when the reader went away


class ClosedStdout:
    """Stands in for ``sys.stdout`` when file descriptor 1 is closed (``ascendgraph ... >&-``):
    writing to it is the same OSError a write to a closed descriptor gives."""

    def write(self, text: str) -> int:
        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        return None


def is_stdout_error(exc: OSError) -> bool:
    if isinstance(exc, StdoutWriteError):
        return True
    return exc.filename is None and exc.errno in (errno.ENOSPC, errno.EBADF)


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        if sys.stdout is not None and not isinstance(sys.stdout, ClosedStdout):
            try:
                os.dup2(devnull, sys.stdout.fileno())
            except (OSError, ValueError, AttributeError):
                pass
        sys.stdout = open(devnull, "w")
    except OSError:
        pass
