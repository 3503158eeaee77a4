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
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from typing import Any, Optional, Union

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
    "read_int",
    "read_human_int",
    "read_float",
    "dump_json",
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


def read_text_file(path: Union[str, os.PathLike[str]], where: str, *, key: Optional[str] = None,
                   kind: str = "text") -> str:
    """A UTF-8 text file of at most ``MAX_TEXT_BYTES`` (read in bounded time: never more bytes)."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_TEXT_BYTES + 1)
    except IsADirectoryError:
        raise _fail(where, "is a folder, not a file", key) from None
    except OSError as exc:
        raise _fail(where, f"cannot read it ({exc.strerror or exc})", key) from None
    if len(data) > MAX_TEXT_BYTES:
        raise _fail(where, f"larger than {MAX_TEXT_BYTES} bytes (16 MiB); not a {kind} file", key)
    if b"\x00" in data:
        raise _fail(where, f"not a text file (it holds NUL bytes; expected UTF-8 {kind})", key)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise _fail(where, f"not a text file (expected UTF-8 {kind})", key) from None


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
