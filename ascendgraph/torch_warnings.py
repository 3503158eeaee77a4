"""Warnings raised inside torch that are not ours, kept away from the caller's warning filters.

A caller who runs with ``PYTHONWARNINGS=error`` (or ``python -W error``, or
``warnings.simplefilter("error")``) turns every warning into an exception. For ascendgraph's
own warnings that is the caller's right, and they still honour it. But torch can raise
warnings from inside its own code about torch's own internals (importing torch's inductor
pattern matcher raises ``DeprecationWarning: `torch.jit.script_method` is deprecated``):
turned into exceptions on one of ascendgraph's paths, they would fail every ``ascendgraph
run`` or ``plan``, and nothing the caller can change in their code would fix it.

Each such warning reached on one of our paths is a row of `FOREIGN_WARNINGS` (category,
message, where torch raises it and on which of our paths) and is ignored only around the
torch call that raises it (`foreign_warnings_ignored`), so a filter the caller set is back
in place as soon as the call returns. The filter change is made under a lock and undone in
the order it was made, so two threads calling ascendgraph at once cannot leave a filter
behind. None is reached now (the fusion passes match with ascendgraph's own FX matcher,
``ascendgraph.compile.passes.matcher``, and import no inductor pass):
tests/unit/test_caller_warnings.py runs ``run`` under ``PYTHONWARNINGS=error`` and ``plan``
under ``-W error`` to keep it so.
"""

from __future__ import annotations

import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

__all__ = ["ForeignWarning", "FOREIGN_WARNINGS", "foreign_warnings_ignored"]


@dataclass(frozen=True)
class ForeignWarning:
    """A warning torch raises from its own code on one of our paths."""

    category: type[Warning]
    message: str  # a regular expression matched at the start of the message (warnings.filterwarnings)
    raised_by: str  # where torch raises it (torch 2.13.0)
    reached_from: str  # which of our calls reaches it


FOREIGN_WARNINGS: tuple[ForeignWarning, ...] = ()

_LOCK = threading.RLock()


@contextmanager
def foreign_warnings_ignored() -> Iterator[None]:
    """Ignore the warnings of `FOREIGN_WARNINGS` inside the block; every other filter (the
    caller's ``error`` too) stays in force, and the filters are as they were afterwards."""
    with _LOCK, warnings.catch_warnings():
        for foreign in FOREIGN_WARNINGS:
            warnings.filterwarnings("ignore", message=foreign.message, category=foreign.category)
        yield
