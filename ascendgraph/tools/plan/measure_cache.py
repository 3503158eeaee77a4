"""The plan's measurement, kept: one meta-tensor capture per (resolution, sample, profile, source, torch).

Why. `measure_capture` builds an engine, traces the model with Dynamo and captures a sample
of sizes on the meta-tensor simulator; most of the time of ``ascendgraph plan`` is that
(profiled on the README example: importing Dynamo and torch's meta kernels, building and
compiling the model, warm-ups and captures — about 8 of its 11 seconds), yet its answer
depends only on what went into it. A contributor re-planning the same model with another
``--budget``, ``--workload`` or ``--requests`` asks the same measurement again: everything
the plan varies (selections, padding, the stream answer) is computed from the measured keys.

What. The measurement is stored as JSON under ``$ASCENDGRAPH_CACHE_DIR/plan/<key>.json``
(default ``~/.cache/ascendgraph``, as the compile cache). The key is a SHA-256 of
everything the measured numbers depend on: the resolution (mode, sizes, config, every
decision), the measured sizes and method, the simulator profile (its file's bytes when it is
a file), the HCCL expansion mode, the seed, the environment variables the engine and the
simulator read, the installed torch version, and the bytes of every ``ascendgraph`` and
``sim`` source file — any edit measures again. A hit says so in the plan ("cached"); an entry
that does not parse, or holds another key, is ignored with one warning and measured over.
``ASCENDGRAPH_PLAN_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import replace
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from ascendgraph.cache_temporaries import sweep_once
from ascendgraph.errors import ConfigError
from ascendgraph.readers import user_cache_root, write_output
from ascendgraph.resolve import Resolution

__all__ = ["PLAN_CACHE_ENV", "PLAN_CACHE_FORMAT", "PLAN_SUBDIR", "ENV_PREFIXES", "ENV_IGNORED", "measurement_key", "cached"]

log = logging.getLogger(__name__)

PLAN_CACHE_FORMAT = 1
PLAN_SUBDIR = "plan"
PLAN_CACHE_ENV = "ASCENDGRAPH_PLAN_CACHE"  # "0": measure every time
# Environment variables that can change what the engine and the simulator do (name prefixes).
# (Not TORCH*: torch itself sets TORCHINDUCTOR_CACHE_DIR while compiling, which would change the key.)
ENV_PREFIXES = ("ASCEND", "HCCL", "TASK_QUEUE", "VLLM", "NPU", "ACL", "PYTORCH_NPU", "OMP_NUM_THREADS")
# Where caches live does not change what is measured.
ENV_IGNORED = frozenset({"ASCENDGRAPH_CACHE_DIR", "ASCENDGRAPH_DOWNLOAD_CACHE_DIR", PLAN_CACHE_ENV})
_ROOTS = (Path(__file__).resolve().parents[2], Path(__file__).resolve().parents[3] / "sim")
_source_memo: dict[str, str] = {}


def _source_digest() -> str:
    if "digest" not in _source_memo:
        digest = hashlib.sha256()
        for root in _ROOTS:
            for path in sorted(root.rglob("*.py")):
                digest.update(str(path.relative_to(root.parent)).encode())
                digest.update(path.read_bytes())
        _source_memo["digest"] = digest.hexdigest()
    return _source_memo["digest"]


def _torch_version() -> str:
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:  # pragma: no cover - torch is a dependency
        return "unknown"


def measurement_key(
    resolution: Resolution,
    *,
    method: str,
    sample: int,
    profile: Optional[str],
    hccl_op_expansion_mode: Optional[str],
    seed: int,
    env: Optional[Mapping[str, str]],
) -> str:
    """The SHA-256 naming one measurement (module docstring)."""
    environment = os.environ if env is None else env
    profile_bytes = ""
    if profile and os.path.isfile(profile):
        profile_bytes = hashlib.sha256(Path(profile).read_bytes()).hexdigest()
    material = {
        "format": PLAN_CACHE_FORMAT,
        "resolution": repr(resolution),
        "method": method,
        "sample": sample,
        "profile": profile,
        "profile_file": profile_bytes,
        "hccl": hccl_op_expansion_mode,
        "seed": seed,
        "env": sorted(
            (k, str(v)) for k, v in environment.items() if k.startswith(ENV_PREFIXES) and k not in ENV_IGNORED
        ),
        "torch": _torch_version(),
        "source": _source_digest(),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()


def _directory() -> Path:
    return Path(user_cache_root()) / PLAN_SUBDIR


_CACHE_ON = frozenset({"", "1", "true", "yes", "on"})
_CACHE_OFF = frozenset({"0", "false", "no", "off"})


def _enabled() -> bool:
    value = os.environ.get(PLAN_CACHE_ENV, "1").strip().lower()
    if value in _CACHE_ON or value in _CACHE_OFF:
        return value not in _CACHE_OFF
    raise ConfigError(f"{PLAN_CACHE_ENV}={os.environ[PLAN_CACHE_ENV]!r} is neither on nor off: set it to 0 to "
                      "measure every plan again, or unset it (1) to reuse a stored measurement", key=PLAN_CACHE_ENV)


def _load(path: Path, key: str, resolution: Resolution) -> Any:
    from ascendgraph.tools.plan.measure import KeyCost, Measurement

    if not path.exists():
        return None
    try:
        document = json.loads(path.read_text())
        if document.get("format") != PLAN_CACHE_FORMAT or document.get("key") != key:
            raise ValueError("it holds another key or format")
        body = document["measurement"]
        keys = [
            KeyCost(mode=str(k["mode"]), num_tokens=int(k["num_tokens"]), uniform=bool(k["uniform"]),
                    graphs=int(k["graphs"]), seconds=float(k["capture_seconds"]), pool_bytes=int(k["pool_bytes"]))
            for k in body["keys"]
        ]
        return Measurement(
            method=str(body["method"]), profile=str(body["profile"]), sizes=[int(s) for s in body["sizes_measured"]],
            keys=keys, graphs_captured=int(body["graphs_captured"]), pool_bytes=int(body["pool_bytes"]),
            capture_seconds=float(body["capture_seconds"]), compile_seconds=float(body["compile_seconds"]),
            wall_seconds=float(body["wall_seconds"]), resolution=resolution, cached=True,
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        log.warning("ignoring the plan cache entry %s (%s); measuring again", path, exc)
        return None


def _store(path: Path, key: str, measurement: Any) -> None:
    """Written through a temporary beside the entry that is removed on every error path (a full
    or read-only cache costs the next plan a measurement, nothing else, and leaves no file)."""
    document = {"format": PLAN_CACHE_FORMAT, "key": key, "measurement": measurement.as_dict()}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_output(path, json.dumps(document), f"plan cache entry {path}")
    except (OSError, ConfigError) as exc:
        log.warning("could not store the plan's measurement in %s (%s)", path.parent, exc)


def cached(
    resolution: Resolution,
    measure: Callable[[], Any],
    *,
    method: str,
    sample: int,
    profile: Optional[str],
    hccl_op_expansion_mode: Optional[str],
    seed: int,
    env: Optional[Mapping[str, str]],
) -> Any:
    """The stored measurement for these inputs, else ``measure()``'s (then stored)."""
    if not _enabled():
        return measure()
    key = measurement_key(resolution, method=method, sample=sample, profile=profile,
                          hccl_op_expansion_mode=hccl_op_expansion_mode, seed=seed, env=env)
    path = _directory() / f"{key}.json"
    sweep_once(path.parent)  # what killed plans left behind (ascendgraph.cache_temporaries)
    hit = _load(path, key, resolution)
    if hit is not None:
        return hit
    measurement = measure()
    _store(path, key, replace(measurement, cached=False))
    return measurement
