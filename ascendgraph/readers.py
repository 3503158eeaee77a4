"""The one bounded, typed reader for every JSON, TOML text and number ascendgraph parses.

Flags (``--compilation-config``, ``-O``, pasted ``vllm serve`` lines), model config files,
simulator profiles, scenario files and the JSON inside them all come through here, so a
pathological input is refused the same way everywhere: a ConfigError whose message names
where the text came from, never a RecursionError, an OverflowError or a ValueError from
Python's integer-conversion limit.

Bounds (docs/decisions.md "Bounded input"):

* an integer has at most ``MAX_INT_DIGITS`` digits (a 21-digit count is a typo, not a size);
* containers nest at most ``MAX_NESTING`` deep;
* one flag value or one file is at most ``MAX_TEXT_BYTES``;
* numbers are finite (no NaN, Infinity or a float that overflows to it);
* digits are ASCII (``int("²")`` and ``int("١٢")`` are refused, not read as 2 or 12).

Files (the one way to open an input, `open_input`, and to write an output, `write_output`):

* an input is a regular file (or standard input where a command documents ``-``): a FIFO, a
  socket, a device, a folder or anything under ``/proc``, ``/sys`` or ``/dev`` is refused with
  one line, opened without blocking so a FIFO nobody writes cannot hang a command;
* a cache entry that is missing is a miss; one that is broken (special, too large, too deep,
  not parseable) is a miss with one warning (`read_cache_entry`, `load_cache_json`);
* an output replaces only a regular file (never a device, FIFO, socket or folder, nor a link to
  one), through a temporary file in the same folder that is removed on every exit path
  (`ascendgraph.cli.app` turns SIGTERM into an exception, so ``finally`` blocks run).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import stat
import tempfile
import tomllib
from contextlib import contextmanager
from typing import Any, BinaryIO, Callable, Iterator, Optional, Union

from ascendgraph.errors import ConfigError

__all__ = [
    "MAX_INT_DIGITS",
    "MAX_NESTING",
    "MAX_TEXT_BYTES",
    "check_tree",
    "check_text_size",
    "load_json",
    "load_json_or_text",
    "load_toml",
    "read_text_file",
    "open_input",
    "read_input_bytes",
    "read_cache_entry",
    "load_cache_json",
    "check_output_path",
    "write_output",
    "output_directory",
    "live_temporaries",
    "read_int",
    "read_human_int",
    "read_float",
    "dump_json",
    "shown",
    "user_cache_root",
    "cache_miss",
]

MAX_INT_DIGITS = 20
MAX_NESTING = 64
MAX_TEXT_BYTES = 16 * 1024 * 1024
# A float literal longer than this is not a hand-written number (1e308 is 5 characters).
MAX_NUMBER_CHARS = 64

_INT_TEXT = re.compile(r"[+-]?[0-9]+")
# vLLM's human-readable counts (``--max-num-batched-tokens 8k``): a lowercase suffix is decimal
# and may follow a fraction (1.5k = 1500, truncated), an uppercase one binary and whole (8K = 8192).
_HUMAN_DECIMAL = re.compile(r"([0-9]+(?:\.[0-9]+)?)([kmgt])")
_HUMAN_BINARY = re.compile(r"([0-9]+)([KMGT])")
_HUMAN_POWERS = {"k": 1, "m": 2, "g": 3, "t": 4}
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _fail(where: str, detail: str, key: Optional[str]) -> ConfigError:
    return ConfigError(f"{where}: {detail}" if where else detail, key=key)


def check_text_size(text: Union[str, bytes], where: str, *, key: Optional[str] = None) -> None:
    """Refuse a flag value or file larger than ``MAX_TEXT_BYTES``."""
    size = len(text) if isinstance(text, bytes) else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        raise _fail(where, f"is {size} bytes; at most {MAX_TEXT_BYTES} bytes (16 MiB) are read", key)


def check_tree(value: Any, where: str, *, key: Optional[str] = None) -> Any:
    """``value`` (parsed JSON/TOML or a mapping given to the API) within the bounds; returned as is.

    Iterative, so a deeply nested value is refused instead of overflowing the stack.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, bool) or node is None or isinstance(node, str):
            continue
        if isinstance(node, int):
            if abs(node) >= 10**MAX_INT_DIGITS:
                raise _fail(where, f"an integer has more than {MAX_INT_DIGITS} digits", key)
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise _fail(where, f"numbers must be finite, got {node!r}", key)
        elif isinstance(node, dict) or isinstance(node, (list, tuple)):
            if depth > MAX_NESTING:
                raise _fail(where, f"nested more than {MAX_NESTING} levels deep", key)
            children = node.values() if isinstance(node, dict) else node
            stack.extend((child, depth + 1) for child in children)
    return value


def _parse_int_literal(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _TooLong(f"an integer has more than {MAX_INT_DIGITS} digits ({text[:12]}...)")
    return int(text)


def _parse_float_literal(text: str) -> float:
    if len(text) > MAX_NUMBER_CHARS:
        raise _TooLong(f"a number is {len(text)} characters long ({text[:12]}...)")
    value = float(text)
    if not math.isfinite(value):
        raise _TooLong(f"numbers must be finite, got {text}")
    return value


def _refuse_constant(text: str) -> float:
    raise _TooLong(f"numbers must be finite, got {text}")


class _TooLong(Exception):
    """Raised from inside the JSON/TOML parser hooks; turned into a ConfigError by the reader."""


def load_json(text: str, where: str, *, key: Optional[str] = None, hint: str = "") -> Any:
    """Parse JSON text within the bounds; ``hint`` is appended to syntax errors."""
    check_text_size(text, where, key=key)
    try:
        value = json.loads(
            text, parse_int=_parse_int_literal, parse_float=_parse_float_literal, parse_constant=_refuse_constant
        )
    except _TooLong as exc:
        raise _fail(where, str(exc), key) from None
    except RecursionError:
        raise _fail(where, f"nested more than {MAX_NESTING} levels deep", key) from None
    except json.JSONDecodeError as exc:
        raise _fail(
            where, f"invalid JSON at line {exc.lineno} column {exc.colno} (char {exc.pos}): {exc.msg}{hint}", key
        ) from None
    return check_tree(value, where, key=key)


def load_json_or_text(text: str, where: str, *, key: Optional[str] = None) -> Any:
    """A dotted option's value (``-cc.level=3``, ``-cc.mode=FULL``): JSON when it parses as
    JSON (within the bounds), the text itself otherwise."""
    check_text_size(text, where, key=key)
    try:
        value = json.loads(
            text, parse_int=_parse_int_literal, parse_float=_parse_float_literal, parse_constant=_refuse_constant
        )
    except _TooLong as exc:
        raise _fail(where, str(exc), key) from None
    except RecursionError:
        raise _fail(where, f"nested more than {MAX_NESTING} levels deep", key) from None
    except json.JSONDecodeError:
        return text
    return check_tree(value, where, key=key)


def load_toml(text: str, where: str, *, key: Optional[str] = None) -> dict[str, Any]:
    """Parse TOML text within the bounds."""
    check_text_size(text, where, key=key)
    try:
        value = tomllib.loads(text, parse_float=_parse_float_literal)
    except _TooLong as exc:
        raise _fail(where, str(exc), key) from None
    except RecursionError:
        raise _fail(where, f"nested more than {MAX_NESTING} levels deep", key) from None
    except tomllib.TOMLDecodeError as exc:
        raise _fail(where, f"invalid TOML: {exc}", key) from None
    except ValueError:  # an integer beyond Python's conversion limit
        raise _fail(where, f"an integer has more than {MAX_INT_DIGITS} digits", key) from None
    return check_tree(value, where, key=key)


SPECIAL_ROOTS = ("/proc", "/sys", "/dev")
_log = logging.getLogger("ascendgraph")
_KINDS = (
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISDIR, "a folder"),
)


def _file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _under_special_root(path: str) -> Optional[str]:
    """``/proc`` (or /sys, /dev) when ``path`` is, or links to, something there; with the link's
    target when it is a link (``z.json -> /dev/zero``)."""
    real = os.path.realpath(path)
    root = next((root for root in SPECIAL_ROOTS if real == root or real.startswith(root + "/")), None)
    if root is None or real == os.path.abspath(path):
        return root
    return f"{root} (it links to {real})"


def open_input(path: Union[str, os.PathLike[str]], where: str, *, key: Optional[str] = None,
               limit: int = MAX_TEXT_BYTES, kind: str = "file") -> BinaryIO:
    """The one way to open an input: a regular file of at most ``limit`` bytes, opened for
    binary reading. Anything else is a ConfigError naming ``where`` and what the path is:
    missing, unreadable, a folder, a FIFO, a socket, a device, or a file under /proc, /sys or
    /dev (whose size says nothing and whose reads may block or never end). The open itself
    never blocks (``O_NONBLOCK``; a FIFO is refused after the open, before any read)."""
    text = os.fspath(path)
    root = _under_special_root(text)
    if root is not None:
        raise _fail(where, f"is under {root}, not a regular {kind}", key)
    try:
        fd = os.open(text, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise _fail(where, "does not exist", key) from None
    except OSError as exc:
        raise _fail(where, f"cannot read it ({exc.strerror or exc})", key) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise _fail(where, f"is a folder, not a {kind}", key)
        if not stat.S_ISREG(info.st_mode):
            raise _fail(where, f"is {_file_kind(info.st_mode)}, not a regular {kind}", key)
        if info.st_size > limit:
            raise _fail(where, f"is {info.st_size} bytes; at most {limit} bytes are read (not a {kind})", key)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input_bytes(path: Union[str, os.PathLike[str]], where: str, *, key: Optional[str] = None,
                     limit: int = MAX_TEXT_BYTES, kind: str = "file") -> bytes:
    """A regular file's bytes (`open_input`), never more than ``limit`` (a file that grows
    while it is read is refused too)."""
    with open_input(path, where, key=key, limit=limit, kind=kind) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise _fail(where, f"cannot read it ({exc.strerror or exc})", key) from None
    if len(data) > limit:
        raise _fail(where, f"larger than {limit} bytes; not a {kind}", key)
    return data


def read_text_file(path: Union[str, os.PathLike[str]], where: str, *, key: Optional[str] = None,
                   kind: str = "text") -> str:
    """A UTF-8 text file of at most ``MAX_TEXT_BYTES`` (read in bounded time: never more bytes)."""
    data = read_input_bytes(path, where, key=key, kind=f"{kind} file")
    if b"\x00" in data:
        raise _fail(where, f"not a text file (it holds NUL bytes; expected UTF-8 {kind})", key)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(where, f"not a text file (expected UTF-8 {kind})", key) from None


def read_cache_entry(path: Union[str, os.PathLike[str]], what: str, *, limit: int = MAX_TEXT_BYTES) -> Optional[bytes]:
    """A cache entry's bytes, or None: a missing entry is a plain miss; a broken one (special
    file, too large, unreadable) is a miss with one warning naming it. Never raises."""
    try:
        return read_input_bytes(path, f"{what} {os.fspath(path)}", limit=limit, kind="cache entry")
    except ConfigError as exc:
        if os.path.lexists(path):
            cache_miss(path, what, str(exc))
        return None


def cache_miss(path: Union[str, os.PathLike[str]], what: str, reason: str) -> None:
    """The one warning for a broken cache entry: it is ignored (a miss) and rebuilt."""
    _log.warning("%s", shown(f"ignoring a broken {what} (a cache miss, it is rebuilt): {reason}"))


def load_cache_json(path: Union[str, os.PathLike[str]], what: str) -> Optional[Any]:
    """A JSON cache entry within the readers' bounds, or None (`read_cache_entry`; text that
    is not bounded JSON is a miss with one warning too)."""
    data = read_cache_entry(path, what)
    if data is None:
        return None
    where = f"{what} {os.fspath(path)}"
    try:
        return load_json(data.decode("utf-8"), where)
    except UnicodeDecodeError:
        cache_miss(path, what, f"{where}: not UTF-8 text")
    except ConfigError as exc:
        cache_miss(path, what, str(exc))
    return None


def check_output_path(path: Union[str, os.PathLike[str]], where: str, *, key: Optional[str] = None) -> None:
    """An output may replace only a regular file: refuse a path that is (or links to) a device,
    FIFO, socket or folder, one under /proc, /sys or /dev, and one whose folder is missing."""
    text = os.fspath(path)
    root = _under_special_root(text)
    if root is not None:
        raise _fail(where, f"is under {root}; write to a regular file", key)
    for follow in (False, True):
        try:
            info = os.stat(text, follow_symlinks=follow)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as exc:
            raise _fail(where, f"cannot be written ({exc.strerror or exc})", key) from None
        if not stat.S_ISREG(info.st_mode) and not stat.S_ISLNK(info.st_mode):
            raise _fail(where, f"is {_file_kind(info.st_mode)}; write to a regular file", key)
    folder = os.path.dirname(os.path.abspath(text)) or "."
    if not os.path.isdir(folder):
        what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
        raise _fail(where, f"folder {folder} {what}", key)


# Temporary files and folders being written right now: removed on every exit path; a signal
# handler (ascendgraph.cli.app) may remove what is left when it cannot unwind.
_LIVE: set[str] = set()


def live_temporaries() -> frozenset[str]:
    """Temporary outputs being written at this moment (for tests and signal handlers)."""
    return frozenset(_LIVE)


@contextmanager
def _temporary(path: str) -> Iterator[str]:
    _LIVE.add(path)
    try:
        yield path
    finally:
        _LIVE.discard(path)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                import shutil

                shutil.rmtree(path, ignore_errors=True)
            else:
                os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            pass


def write_output(path: Union[str, os.PathLike[str]], content: Union[bytes, str, Callable[[str], None]], where: str,
                 *, key: Optional[str] = None, suffix: str = ".tmp") -> None:
    """The one way to write an output file: ``content`` (bytes, text, or a function that writes
    the temporary path it is given) goes to a temporary file beside ``path``, which then
    replaces ``path`` — only ever a regular file (`check_output_path`). The temporary file is
    removed on every exit path. OSError (disk full, read-only) propagates with its errno."""
    text = os.fspath(path)
    check_output_path(text, where, key=key)
    folder = os.path.dirname(os.path.abspath(text))
    from ascendgraph.cache_temporaries import temporary_prefix  # names a later run can judge stale

    handle, temporary = tempfile.mkstemp(prefix=temporary_prefix(os.path.basename(text)), suffix=suffix, dir=folder)
    with _temporary(temporary):
        with os.fdopen(handle, "wb") as stream:
            if isinstance(content, str):
                stream.write(content.encode("utf-8"))
            elif isinstance(content, bytes):
                stream.write(content)
        if callable(content):
            content(temporary)
        check_output_path(text, where, key=key)  # nothing special appeared there meanwhile
        os.replace(temporary, text)


@contextmanager
def output_directory(path: Union[str, os.PathLike[str]], where: str, *, key: Optional[str] = None) -> Iterator[str]:
    """A temporary folder beside ``path`` to fill; on success it becomes ``path`` (which must
    not exist yet, or be a folder that is replaced only when empty); removed on every exit path."""
    text = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(text))
    root = _under_special_root(parent)
    if root is not None:
        raise _fail(where, f"is under {root}; write to a regular folder", key)
    os.makedirs(parent, exist_ok=True)
    from ascendgraph.cache_temporaries import temporary_prefix

    staging = tempfile.mkdtemp(prefix=temporary_prefix(os.path.basename(text)), dir=parent)
    with _temporary(staging):
        yield staging
        os.replace(staging, text)


def user_cache_root(env: Optional[Any] = None) -> str:
    """Where ascendgraph's caches live: ``$ASCENDGRAPH_CACHE_DIR``, else ``$XDG_CACHE_HOME/ascendgraph``
    (when absolute), else ``$HOME/.cache/ascendgraph`` — with an empty or relative ``HOME`` (``HOME=""``
    would put it in ``/.cache``) the home folder of the user's password entry, and without one a
    per-user folder in the temporary directory."""
    environment = os.environ if env is None else env
    value = str(environment.get("ASCENDGRAPH_CACHE_DIR", "")).strip()
    if value:
        return os.path.expanduser(value)
    xdg = str(environment.get("XDG_CACHE_HOME", "")).strip()
    if os.path.isabs(xdg):
        return os.path.join(xdg, "ascendgraph")
    home = str(environment.get("HOME", "")).strip()
    if not os.path.isabs(home):
        try:
            import pwd

            home = pwd.getpwuid(os.getuid()).pw_dir
        except (ImportError, KeyError, OSError):
            home = ""
    if not os.path.isabs(home):
        return os.path.join(tempfile.gettempdir(), f"ascendgraph-cache-{os.getuid()}")
    return os.path.join(home, ".cache", "ascendgraph")


# Characters never printed raw: C0 controls (ESC, BEL, CR, newline ...), DEL, C1 controls,
# lone surrogates and the Unicode line/paragraph separators and bidi overrides.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def shown(text: str, *, keep_newlines: bool = False) -> str:
    """Text from an input made safe to print: every control character (newline too, unless
    ``keep_newlines``), DEL, C1 control, lone surrogate and bidi override written as an escape
    (``\\x1b``, ``\\n``, ``\\ud800``), so it cannot forge a line or drive the terminal."""

    def escape(match: "re.Match[str]") -> str:
        char = match.group(0)
        if keep_newlines and char in "\n\t":
            return char
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(char) or (
            f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}")

    return _UNSAFE.sub(escape, text)


def read_int(text: Any, where: str, *, key: Optional[str] = None) -> int:
    """An integer written in ASCII digits (optional sign), at most ``MAX_INT_DIGITS`` digits."""
    if isinstance(text, bool):
        raise _fail(where, f"expected an integer, got {text!r}", key)
    if isinstance(text, int):
        return check_tree(text, where, key=key)
    if not isinstance(text, str):
        raise _fail(where, f"expected an integer, got {type(text).__name__}", key)
    stripped = text.strip()
    if not _INT_TEXT.fullmatch(stripped):
        shown = stripped if len(stripped) <= 24 else stripped[:24] + "..."
        raise _fail(where, f"expected an integer in ASCII digits, got {shown!r}", key)
    if len(stripped.lstrip("+-")) > MAX_INT_DIGITS:
        raise _fail(where, f"an integer has more than {MAX_INT_DIGITS} digits ({stripped[:12]}...)", key)
    return int(stripped)


def read_human_int(text: Any, where: str, *, key: Optional[str] = None) -> int:
    """An integer, or a count with vLLM's suffixes: k/m/g/t decimal (``1.5k`` = 1500, a fraction
    truncated as vLLM does), K/M/G/T binary (``8K`` = 8192). vLLM 0.32 takes these for
    ``--max-num-batched-tokens`` (and ``--max-model-len``); the same digit bound applies."""
    if not isinstance(text, str):
        return read_int(text, where, key=key)
    stripped = text.strip()
    decimal, binary = _HUMAN_DECIMAL.fullmatch(stripped), _HUMAN_BINARY.fullmatch(stripped)
    match = decimal or binary
    if match is None:
        return read_int(stripped, where, key=key)
    number, suffix = match.group(1), match.group(2)
    if len(number) > MAX_INT_DIGITS:
        raise _fail(where, f"an integer has more than {MAX_INT_DIGITS} digits ({number[:12]}...)", key)
    power = _HUMAN_POWERS[suffix.lower()]
    if binary is not None:
        value = int(number) * 1024**power
    else:
        whole, _, fraction = number.partition(".")
        scale = 1000**power
        value = int(whole) * scale + (int(fraction) * scale) // 10 ** len(fraction) if fraction else int(whole) * scale
    if len(str(value)) > MAX_INT_DIGITS:
        raise _fail(where, f"{stripped} is more than {MAX_INT_DIGITS} digits as an integer", key)
    return value


def read_float(text: Any, where: str, *, key: Optional[str] = None) -> float:
    """A finite number written in ASCII (``1.5``, ``2e3``); NaN and infinities refused."""
    if isinstance(text, bool):
        raise _fail(where, f"expected a number, got {text!r}", key)
    if isinstance(text, int):
        check_tree(text, where, key=key)
        return float(text)
    if isinstance(text, float):
        return check_tree(text, where, key=key)
    if not isinstance(text, str):
        raise _fail(where, f"expected a number, got {type(text).__name__}", key)
    stripped = text.strip()
    shown = stripped if len(stripped) <= 24 else stripped[:24] + "..."
    if len(stripped) > MAX_NUMBER_CHARS or not _FLOAT_TEXT.fullmatch(stripped):
        raise _fail(where, f"expected a finite number in ASCII digits, got {shown!r}", key)
    value = float(stripped)
    if not math.isfinite(value):
        raise _fail(where, f"numbers must be finite, got {shown!r}", key)
    return value


def _finite_or_null(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def dump_json(document: Any, *, indent: Optional[int] = 2) -> str:
    """The one JSON writer: strict JSON. A non-finite float (a figure nothing measured) is
    written as null, so no document ever holds NaN or Infinity."""
    return json.dumps(_finite_or_null(document), indent=indent, sort_keys=False, allow_nan=False)
