"""Scenario items as Ray tasks (``ascendgraph scenario run --ray ADDRESS|auto``; docs/ranks.md).

The only module of ascendgraph that imports ``ray`` (the optional extra,
``pip install 'ascendgraph[ray]'``). `connect` joins a running cluster: ``auto`` (the cluster
``RAY_ADDRESS`` or ``ray start`` on this machine names), ``HOST:PORT`` (the head's GCS
address) or ``ray://HOST:PORT`` (Ray Client). An address nothing answers at, or Ray missing,
is bad input: a `ConfigError` (one line, exit 2). `run_on_ray` submits every item as a task
(one CPU each; the cluster schedules them), then yields the results in the items' order, so
the report is the one a serial run prints. Each task carries its loaded scenario, so a worker
needs ascendgraph installed (the same version) but not the scenario files.
"""

from __future__ import annotations

import socket
from typing import Any, Iterator, Sequence

from ascendgraph.errors import ConfigError
from ascendgraph.tools.scenario.items import ItemResult, ScenarioItem, run_item

__all__ = ["connect", "run_on_ray", "check_address", "RayTaskFailed", "PROBE_TIMEOUT_S"]

PROBE_TIMEOUT_S = 5.0  # how long a HOST:PORT may take to accept a TCP connection
_FIX = "give the head node's GCS address HOST:PORT (`ray start --head` prints it), ray://HOST:PORT, or auto"


def check_address(address: str) -> None:
    """Refuse an address of the wrong form or one where nothing accepts a connection."""
    if address == "auto":
        return
    target = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = target.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"--ray {address!r} is not an address; {_FIX}", key="ray")
    try:
        with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"--ray {address}: nothing answers there ({reason}); start the cluster or {_FIX}",
                          key="ray") from None


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("--ray needs Ray: pip install 'ascendgraph[ray]' (on every node of the cluster)",
                          key="ray") from None
    return ray


def connect(address: str) -> tuple[Any, bool]:
    """(the ray module, whether this call connected): joins the cluster at ``address`` unless
    this process is connected already."""
    ray = _ray()
    if ray.is_initialized():
        return ray, False
    check_address(address)
    try:
        ray.init(address=address, logging_level="WARNING", log_to_driver=True)
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError: Ray's own words, one line
        words = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise ConfigError(f"--ray {address}: no Ray cluster could be joined: {words}; {_FIX}", key="ray") from None
    return ray, True


class RayTaskFailed(RuntimeError):
    """A task did not come back (a worker or node lost): the run failed (exit 1)."""


def run_on_ray(items: Sequence[ScenarioItem], address: str, *, quiet: bool = True) -> Iterator[ItemResult]:
    """Join the cluster now (bad address: ConfigError), then every item as a Ray task; the
    results come back in the items' order. Disconnects at the end when this call connected."""
    ray, connected = connect(address)
    return _gather(ray, connected, items, quiet)


def _gather(ray: Any, connected: bool, items: Sequence[ScenarioItem], quiet: bool) -> Iterator[ItemResult]:
    try:
        task = ray.remote(num_cpus=1, max_retries=0)(run_item)
        pending = [(item, task.remote(item, quiet)) for item in items]
        for item, ref in pending:
            try:
                yield ray.get(ref)
            except ray.exceptions.RayError as exc:
                words = " ".join(str(exc).split())[:300]
                raise RayTaskFailed(f"the Ray task of {item.name} failed: {words}") from None
    finally:
        if connected:
            ray.shutdown()
