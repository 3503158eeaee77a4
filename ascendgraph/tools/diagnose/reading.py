"""Reading a log: streaming, bounded lines, gzip, and refusing input that is not a text log."""

from __future__ import annotations

import gzip
import io
import sys
import zlib
from typing import Any, BinaryIO, Iterator, Optional, cast

from ascendgraph.errors import ConfigError
from ascendgraph.readers import open_input
from ascendgraph.sizes import DEFAULT_MAX_STREAMS
from ascendgraph.tools.diagnose.classes import UnreadableLog
from ascendgraph.tools.diagnose.diagnosis import Diagnosis, diagnose_lines


# --------------------------------------------------------------------------- reading


MAX_LOG_BYTES = 1 << 40  # logs are streamed: a file size bound only against sparse/absurd files (1 TiB)
MAX_LINE_BYTES = 1 << 20  # longer physical lines are cut (binary junk, giant dumps)


MAX_NUL_RUN = 64 << 20  # a longer run of NUL bytes is no log (/dev/zero, a zero-filled disk image)


class _NulRun:
    """Counts consecutive NUL bytes across reads; too many is UnreadableLog (bounded time
    on an endless stream of zeros)."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.length = 0

    def add(self, data: bytes) -> None:
        stripped = data.rstrip(b"\0")
        if stripped:
            self.length = len(data) - len(stripped)
            return
        self.length += len(data)
        if self.length > MAX_NUL_RUN:
            raise UnreadableLog(
                f"{self.source} holds a run of more than {MAX_NUL_RUN >> 20} MiB of NUL bytes: not a text log; "
                f"{_READ_HINT}",
                key="LOGFILE",
            )


def iter_log_lines(stream: BinaryIO, source: str = "the log") -> Iterator[str]:
    """Decoded lines of a byte stream; invalid UTF-8 becomes U+FFFD, over-long lines are cut
    (`MAX_LINE_BYTES`), and a run of NUL bytes longer than `MAX_NUL_RUN` is UnreadableLog."""
    nuls = _NulRun(source)
    while True:
        chunk = stream.readline(MAX_LINE_BYTES)
        if not chunk:
            return
        nuls.add(chunk)
        if len(chunk) == MAX_LINE_BYTES and not chunk.endswith(b"\n"):
            while True:  # skip the rest of the physical line
                rest = stream.readline(MAX_LINE_BYTES)
                nuls.add(rest)
                if not rest or rest.endswith(b"\n"):
                    break
        yield chunk.decode("utf-8", errors="replace").rstrip("\r\n")


def _maybe_gunzip(stream: BinaryIO) -> BinaryIO:
    peek = getattr(stream, "peek", None)
    head = peek(2)[:2] if peek else b""
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=stream)  # type: ignore[return-value]  # a GzipFile is a readable binary stream
    return stream


_READ_HINT = "pass a readable vLLM log file, or - to read standard input"

SNIFF_BYTES = 64 * 1024  # how much of the (decompressed) log the text check looks at
MAX_CONTROL_SHARE = 0.08  # control bytes (NUL included; tab, newlines, form feed and ESC excepted)
MAX_UNDECODABLE_SHARE = 0.75  # bytes that are not UTF-8 (other encodings stay readable below this)
_TEXT_CONTROLS = frozenset("\t\n\r\f\v\x1b")


class _Rejoined(io.RawIOBase):
    """The bytes already read for the text check, then the rest of the stream."""

    def __init__(self, head: bytes, rest: BinaryIO) -> None:
        super().__init__()
        self._head = memoryview(head)
        self._rest = rest

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._head:
            count = min(len(buffer), len(self._head))
            buffer[:count] = self._head[:count]
            self._head = self._head[count:]
            return count
        data = self._rest.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def binary_share(head: bytes) -> tuple[float, float]:
    """(control share, undecodable share) of a sample; a leading run of NULs (a log truncated
    in place, e.g. by logrotate's copytruncate) is left out."""
    text = head.lstrip(b"\0").decode("utf-8", errors="replace")
    if not text:
        return 0.0, 0.0
    controls = sum(1 for c in text if (c < " " and c not in _TEXT_CONTROLS) or c == "\x7f")
    return controls / len(text), text.count("\ufffd") / len(text)


def _check_text(source: str, head: bytes) -> None:
    controls, undecodable = binary_share(head)
    if controls > MAX_CONTROL_SHARE or undecodable > MAX_UNDECODABLE_SHARE:
        raise UnreadableLog(
            f"{source} does not look like a text log ({controls:.0%} control bytes, {undecodable:.0%} not UTF-8 "
            f"in its first {len(head)} bytes); {_READ_HINT} (plain text or .gz)",
            key="LOGFILE",
        )


def _skip_leading_nuls(source: str, stream: BinaryIO) -> bytes:
    """Skip a leading run of NUL bytes (a log truncated in place); return what follows it,
    up to `SNIFF_BYTES`. Only NULs to the end, or a run longer than `MAX_NUL_RUN` (an endless
    source such as /dev/zero), is UnreadableLog."""
    nuls = _NulRun(source)
    skipped = 0
    while True:
        head = stream.read(SNIFF_BYTES)
        if not head:
            if skipped:
                raise UnreadableLog(
                    f"{source} holds only NUL bytes ({skipped} of them): not a text log; {_READ_HINT}", key="LOGFILE"
                )
            return b""
        text = head.lstrip(b"\0")
        if text:
            return text + stream.read(SNIFF_BYTES - len(text)) if len(text) < SNIFF_BYTES else text
        skipped += len(head)
        nuls.add(head)


def _text_stream(source: str, stream: BinaryIO) -> BinaryIO:
    """The (gunzipped) stream, after checking that its start looks like text."""
    stream = _maybe_gunzip(stream)
    head = _skip_leading_nuls(source, stream)
    _check_text(source, head)
    return io.BufferedReader(_Rejoined(head, stream))


def diagnose_file(
    path: str,
    *,
    num_layers: Optional[int] = None,
    stream_limit: int = DEFAULT_MAX_STREAMS,
    stdin: Optional[BinaryIO] = None,
) -> Diagnosis:
    """Diagnose a log file (plain or gzip), or standard input for ``-``.

    Unreadable, or not text (its first 64 KiB, after gunzip, hold more than 8 % control
    bytes or more than 75 % bytes that are not UTF-8) -> UnreadableLog."""
    source = "<stdin>" if path == "-" else path
    try:
        if path == "-":
            raw = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
            if raw is None:
                raise UnreadableLog(f"cannot read log {source!r}: standard input is closed; {_READ_HINT}",
                                    key="LOGFILE")
            handle: BinaryIO = raw if hasattr(raw, "peek") else io.BufferedReader(cast(Any, raw))
            return diagnose_lines(iter_log_lines(_text_stream(source, handle), source), source=source,
                                  num_layers=num_layers, stream_limit=stream_limit)
        try:  # regular files only: a FIFO, a device or /proc/kmsg would block or never end
            opened = open_input(path, f"log {path!r}", key="LOGFILE", limit=MAX_LOG_BYTES, kind="log file")
        except ConfigError as exc:
            raise UnreadableLog(f"cannot read {exc}; {_READ_HINT}", key="LOGFILE") from None
        with opened as handle:
            return diagnose_lines(iter_log_lines(_text_stream(source, handle), source), source=source,
                                  num_layers=num_layers, stream_limit=stream_limit)
    except (OSError, EOFError, zlib.error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        raise UnreadableLog(f"cannot read log {source!r}: {reason}; {_READ_HINT}", key="LOGFILE") from None
