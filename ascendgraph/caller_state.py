"""What `ascendgraph.run` leaves of its caller's process: as it found it.

A library call must not change the process it runs in behind the caller's back. `run` goes
through `kept_as_found`, which puts back afterwards what a run (or torch underneath it)
changes on the way:

* environment variables: any variable the run added is removed and any it changed is put
  back (torch's inductor sets ``TORCHINDUCTOR_CACHE_DIR`` on first use, for instance);
* threads: tqdm's monitor thread, started by the first capture progress bar, is stopped when
  the run started it;
* the garbage collector's thresholds: during the run the young generation collects every
  `RUN_YOUNG_GENERATION_THRESHOLD` allocations when the caller's is smaller (CPython's default
  is 700: a run keeps most of what it allocates, and the default ran about 900 young and 6 full
  collections of a default run), the middle generation every `RUN_MIDDLE_GENERATION_THRESHOLD`
  young collections when the caller's is smaller (CPython's default is 10: each middle
  collection walked the up to 100,000 objects that survived the young ones, which the run keeps
  to its end, 30-40 ms each and about 0.26 s of a default run; at 100 a default run, about 80
  young collections, has none), and the caller's thresholds are put back afterwards. Nothing
  is frozen and every cycle is still collected.

The caller's torch defaults are refused rather than silently overridden (`check_torch_defaults`):
the engine builds its weights and inputs on the CPU in float32 unless told otherwise, so a
default device other than the CPU (``torch.set_default_device("meta")``) or a default dtype
other than float32 is a ConfigError naming the setting and the fix.

Import time changes nothing that stays: ``import ascendgraph`` (torch not imported yet, the
variable unset) makes torch's first import run with ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (so that
`import torch` works with torch_npu installed but CANN missing) and removes the variable again as
that import ends (`ascendgraph.torch_autoload`); the caller's own value is never overwritten, and
`ascendgraph.ORIGINAL_TORCH_DEVICE_BACKEND_AUTOLOAD` keeps it.
"""

from __future__ import annotations

import gc
import os
import sys
from contextlib import contextmanager
from typing import Iterator

from ascendgraph.errors import ConfigError

__all__ = [
    "check_torch_defaults", "kept_as_found", "collector_tuned_for_a_run", "run_thresholds",
    "RUN_YOUNG_GENERATION_THRESHOLD", "RUN_MIDDLE_GENERATION_THRESHOLD",
]

# The young and middle generations' thresholds during a run (the console script's own too,
# ascendgraph.cli): see the module docstring.
RUN_YOUNG_GENERATION_THRESHOLD = 10_000
RUN_MIDDLE_GENERATION_THRESHOLD = 100


def run_thresholds(thresholds: tuple[int, int, int]) -> tuple[int, int, int]:
    """The collector's thresholds for a run, from ``thresholds`` (``gc.get_threshold()``): the
    young and middle generations raised to the run's where smaller, the oldest kept."""
    young, middle, oldest = thresholds
    return max(young, RUN_YOUNG_GENERATION_THRESHOLD), max(middle, RUN_MIDDLE_GENERATION_THRESHOLD), oldest


def check_torch_defaults() -> None:
    """Refuse a caller's torch default device other than the CPU or default dtype other than float32."""
    import torch

    device = torch.get_default_device() if hasattr(torch, "get_default_device") else torch.device("cpu")
    if device.type != "cpu":
        raise ConfigError(
            f"torch's default device is {device.type!r} (torch.set_default_device was called); ascendgraph.run "
            "builds on the CPU: call torch.set_default_device('cpu') (or None) before run(), and pass "
            "device=... to choose the simulator or the NPU", key="device")
    dtype = torch.get_default_dtype()
    if dtype != torch.float32:
        raise ConfigError(
            f"torch's default dtype is {dtype} (torch.set_default_dtype was called); ascendgraph.run expects "
            "float32 there: call torch.set_default_dtype(torch.float32) before run(), and pass dtype=... to "
            "choose the run's dtype", key="dtype")


def _tqdm_monitor() -> object:
    tqdm = sys.modules.get("tqdm")
    cls = getattr(tqdm, "tqdm", None)
    return getattr(cls, "monitor", None)


@contextmanager
def collector_tuned_for_a_run() -> Iterator[None]:
    """The collector at `run_thresholds` inside (the engine's imports and the run), the
    caller's thresholds put back afterwards (see the module docstring)."""
    thresholds = gc.get_threshold()
    gc.set_threshold(*run_thresholds(thresholds))
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


@contextmanager
def kept_as_found() -> Iterator[None]:
    """Put back the environment and stop the threads a run started (see the module docstring)."""
    environment = dict(os.environ)
    monitor = _tqdm_monitor()
    try:
        yield
    finally:
        for name in set(os.environ) - set(environment):
            os.environ.pop(name, None)
        for name, value in environment.items():
            if os.environ.get(name) != value:
                os.environ[name] = value
        started = _tqdm_monitor()
        if started is not None and started is not monitor:
            cls = sys.modules["tqdm"].tqdm
            try:
                started.exit()  # type: ignore[attr-defined]  # tqdm's TMonitor thread, not in its stubs
                started.join(timeout=5)  # type: ignore[attr-defined]  # tqdm's TMonitor thread, not in its stubs
            except Exception:  # noqa: BLE001 - a thread that already ended
                pass
            cls.monitor = None
