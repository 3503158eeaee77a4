"""torch's intra-op thread count: one process-wide policy shared by every engine.

Theory of operation. ``torch.set_num_threads`` changes the whole process, so engines must
not change it for each other (issue 17 item 10: two engines closed in creation order used
to leave the process at the first engine's value). The rule (docs/decisions.md "One thread policy per process"):

* the first engine that asks for a thread count saves the process's value and sets its own;
* further engines asking for the *same* count share it; one asking for a different count
  while another is live is a `ConfigError` (nothing is changed);
* the last engine to let go restores the saved value, whatever order they close in.

What an engine asks for (`EngineOptions.num_threads`):

=============  ========================================================================
value          meaning
=============  ========================================================================
``"auto"``     the CLI's policy (the default): 1 thread, unless ``OMP_NUM_THREADS`` is
               set, in which case torch's own setting is left alone. The simulator issues
               many small ops, where more intra-op threads only add synchronisation (and
               spin-waiting threads fight other processes on a loaded machine)
``None``       leave torch's thread count alone (take no part in the policy)
an int >= 1    exactly that many threads
=============  ========================================================================

An engine that is never closed lets go when it is garbage-collected (`ThreadLease` holds a
finaliser), so a forgotten ``close()`` cannot pin the process's thread count for ever.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, Optional, Union

import torch

from ascendgraph.errors import ConfigError

__all__ = ["AUTO", "CLI_NUM_THREADS", "ThreadRequest", "resolve_num_threads", "acquire", "ThreadLease", "live_request"]

AUTO = "auto"
CLI_NUM_THREADS = 1  # what `ascendgraph run` uses when OMP_NUM_THREADS is not set
MAX_THREADS = 4096

ThreadRequest = Union[int, str, None]


def resolve_num_threads(request: ThreadRequest, environ: Optional[dict[str, str]] = None) -> Optional[int]:
    """The thread count an engine asks for (None: leave torch alone). ConfigError on a bad value."""
    if request is None:
        return None
    if request == AUTO:
        env = os.environ if environ is None else environ
        return None if env.get("OMP_NUM_THREADS") else CLI_NUM_THREADS
    if isinstance(request, bool) or not isinstance(request, int) or not 1 <= request <= MAX_THREADS:
        raise ConfigError(
            f"num_threads must be 'auto', None or an integer from 1 to {MAX_THREADS}, got {request!r}",
            key="num_threads",
        )
    return request


class _Policy:
    """The process's one record of who holds the thread count (guarded by a lock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.holders: dict[int, int] = {}  # lease id -> requested count
        self.saved: Optional[int] = None
        self.next_id = 0


_POLICY = _Policy()


def live_request() -> Optional[int]:
    """The count live engines share (None when no engine holds the thread count)."""
    with _POLICY.lock:
        return next(iter(_POLICY.holders.values()), None)


def _release(lease_id: int) -> None:
    with _POLICY.lock:
        if _POLICY.holders.pop(lease_id, None) is None:
            return
        if not _POLICY.holders and _POLICY.saved is not None:
            torch.set_num_threads(_POLICY.saved)
            _POLICY.saved = None


class ThreadLease:
    """One engine's hold on the thread count; `release` is idempotent."""

    def __init__(self, owner: Any, count: Optional[int]) -> None:
        self.count = count
        self._finalizer: Optional[weakref.finalize] = None
        if count is None:
            return
        with _POLICY.lock:
            held = next(iter(_POLICY.holders.values()), None)
            if held is not None and held != count:
                raise ConfigError(
                    f"num_threads={count} conflicts with another live engine in this process that uses "
                    f"{held} torch thread(s): torch's thread count is process-wide; close that engine first "
                    "or ask for the same count (num_threads=None leaves it alone)",
                    key="num_threads",
                )
            if not _POLICY.holders:
                _POLICY.saved = torch.get_num_threads()
                if _POLICY.saved != count:
                    torch.set_num_threads(count)
            lease_id = _POLICY.next_id
            _POLICY.next_id += 1
            _POLICY.holders[lease_id] = count
        self._finalizer = weakref.finalize(owner, _release, lease_id)

    @property
    def active(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive

    def release(self) -> None:
        if self._finalizer is not None:
            self._finalizer()


def acquire(owner: Any, request: ThreadRequest) -> ThreadLease:
    """Join the process's thread policy for ``owner`` (an engine); see the module docstring."""
    return ThreadLease(owner, resolve_num_threads(request))
