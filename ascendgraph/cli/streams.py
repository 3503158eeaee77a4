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
  between any two bytecodes, inside a weakref callback or a ``__del__`` method too, and an
  exception raised there is printed as "Exception ignored" and dropped.
"""

from __future__ import annotations

import errno
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from ascendgraph.errors import StdoutWriteError, Terminated
from ascendgraph.readers import dump_json, shown

__all__ = ["emit_json", "emit_result", "emit_text", "write_stdout", "Terminated", "sigterm_unwinds",
           "signals_never_lost", "REDELIVERY_DELAY_S", "INTERRUPTED",
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

    def unwind(signum: int, frame: Any) -> None:
        raise Terminated()

    signal.signal(signal.SIGTERM, unwind)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# How long after a dropped interrupt it is delivered again: long enough that the callback it
# was dropped in has returned (they take microseconds), short enough that nobody notices.
REDELIVERY_DELAY_S = 0.01


@contextmanager
def signals_never_lost() -> Iterator[None]:
    """While the block runs, a KeyboardInterrupt or `Terminated` that Python dropped because the
    signal handler ran inside a weakref callback or a ``__del__`` method (it reaches
    ``sys.unraisablehook`` instead of the command) is delivered again: a timer thread calls
    ``_thread.interrupt_main`` with the same signal ``REDELIVERY_DELAY_S`` later, when the main
    thread is back in ordinary code, and the handler raises it there. A capture runs torch's
    weakref callbacks thousands of times; without this, a Ctrl-C landing in one was printed as
    "Exception ignored ... KeyboardInterrupt" and the run went on to exit 0. Should the block
    end before the timer fires, the interrupt is raised as the block ends. A no-op off the
    main thread. Other unraisable exceptions go to the previous hook unchanged."""
    import _thread
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = sys.unraisablehook
    pending: list[threading.Timer] = []

    def redeliver(unraisable: Any) -> None:
        exc_type = unraisable.exc_type
        if exc_type is not None and issubclass(exc_type, KeyboardInterrupt):
            signum = signal.SIGINT
        elif exc_type is not None and issubclass(exc_type, Terminated):
            signum = signal.SIGTERM
        else:
            previous(unraisable)
            return
        timer = threading.Timer(REDELIVERY_DELAY_S, _thread.interrupt_main, (signum,))
        timer.daemon = True
        pending.append(timer)
        timer.start()

    sys.unraisablehook = redeliver
    try:
        yield
    finally:
        sys.unraisablehook = previous
        # A redelivery still waiting: cancel it and raise here, at a safe point, instead of
        # letting it land after the command (and its handlers) returned.
        waiting = [timer for timer in pending if timer.is_alive()]
        for timer in waiting:
            timer.cancel()
        if waiting:
            if tuple(waiting[0].args)[0] == signal.SIGTERM:  # the timer's one argument: the signal number
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
