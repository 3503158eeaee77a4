"""Reading the machine: package versions from distribution metadata (torch_npu is never imported),
the CANN and HDK versions from their install files, the cache folder, whether `--device npu` works
(`collect_facts`)."""

from __future__ import annotations

import glob
import os
import platform
import re
from importlib import metadata
from typing import Callable, Mapping, Optional, Sequence

from ascendgraph.errors import ConfigError
from ascendgraph.readers import read_input_bytes, user_cache_root
from ascendgraph.tools.doctor.facts import (
    DEFAULT_ASCEND_ROOTS,
    DoctorFacts,
    InstalledVersion,
    ReferenceConfig,
    stream_check,
)

__all__ = [
    "PACKAGES", "cache_dir_status", "cann_candidates", "collect_facts", "find_cann", "find_hdk",
    "package_version", "parse_version_numbers",
]

# --------------------------------------------------------------------------- probes

# Distribution names to report, and the names they may be published under.
PACKAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)),
    ("torch_npu", ("torch-npu", "torch_npu")),
    ("xlite", ("xlite",)),
    ("vllm", ("vllm",)),
    ("vllm_ascend", ("vllm-ascend", "vllm_ascend")),
    ("ascendgraph", ("ascendgraph",)),
)


def package_version(distribution: str) -> Optional[str]:
    """Installed version from distribution metadata (never imports the package)."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
    except Exception:  # a broken metadata directory is "not installed" for our purposes
        return None


def parse_version_numbers(text: Optional[str]) -> Optional[tuple[int, ...]]:
    """Leading numeric components: "25.5.1" -> (25, 5, 1), "24.1.rc2" -> (24, 1); None if none."""
    if not text:
        return None
    numbers = []
    for part in re.split(r"[.\-_]", text.strip()):
        if not (part.isascii() and part.isdigit()):  # isdigit alone takes "²", which int() refuses
            break
        numbers.append(int(part))
    return tuple(numbers) or None


# A toolkit's version/install-info file is a few lines; a bigger one (or a link to /dev/zero, a
# FIFO, a folder) is not one: read as "unknown", never blocking or filling memory.
MAX_TOOLKIT_FILE_BYTES = 1 << 20


def _read_key(path: str, keys: Sequence[str]) -> Optional[str]:
    if not os.path.lexists(path):
        return None
    try:
        data = read_input_bytes(path, path, limit=MAX_TOOLKIT_FILE_BYTES, kind="toolkit info file")
    except ConfigError:
        return None
    for line in data.decode("utf-8", "replace").splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip().lower() in keys:
            return value.strip().strip("\"'") or None
    return None


def cann_candidates(env: Mapping[str, str], ascend_roots: Sequence[str]) -> list[str]:
    """Where a CANN toolkit may live: the set_env.sh variables first, then the default installs."""
    candidates = [env[name] for name in ("ASCEND_TOOLKIT_HOME", "ASCEND_HOME_PATH") if env.get(name)]
    for root in ascend_roots:
        root = os.path.expanduser(root)
        candidates += [
            os.path.join(root, "ascend-toolkit", "latest"),
            os.path.join(root, "cann"),
            os.path.join(root, "nnae", "latest"),
        ]
    unique: list[str] = []
    for path in candidates:
        if path not in unique:
            unique.append(path)
    return unique


def find_cann(env: Mapping[str, str], ascend_roots: Sequence[str]) -> tuple[Optional[InstalledVersion], list[str]]:
    """The first CANN install found (its ``ascend_*_install.info`` version) and the places searched."""
    searched = cann_candidates(env, ascend_roots)
    for home in searched:
        if not os.path.isdir(home):
            continue
        infos = sorted(glob.glob(os.path.join(home, "ascend_*_install.info")))
        infos += sorted(glob.glob(os.path.join(home, "*-linux", "ascend_*_install.info")))
        for info in infos:
            version = _read_key(info, ("version",))
            if version:
                return InstalledVersion(version=version, path=os.path.realpath(home)), searched
        return InstalledVersion(version="unknown (no install.info)", path=os.path.realpath(home)), searched
    return None, searched


def find_hdk(ascend_roots: Sequence[str]) -> Optional[InstalledVersion]:
    """The HDK (driver) version from ``<root>/driver/version.info``."""
    for root in ascend_roots:
        info = os.path.join(os.path.expanduser(root), "driver", "version.info")
        if os.path.isfile(info):
            version = _read_key(info, ("version",))
            return InstalledVersion(version=version or "unknown", path=info)
    return None


def cache_dir_status(env: Mapping[str, str]) -> tuple[str, Optional[str]]:
    """(cache directory, problem or None). A directory that does not exist yet is fine if creatable.
    The directory is the one ascendgraph uses in that environment (`ascendgraph.readers.user_cache_root`)."""
    path = user_cache_root(env)
    if os.path.exists(path):
        if not os.path.isdir(path):
            return path, "it exists and is not a directory"
        if not os.access(path, os.W_OK | os.X_OK):
            return path, "not writable"
        return path, None
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.exists(parent):
        next_parent = os.path.dirname(parent)
        if next_parent == parent:
            break
        parent = next_parent
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
        return path, f"it does not exist and {parent} is not writable"
    return path, None


def _availability(name: str) -> tuple[bool, str]:
    from ascendgraph.device import backend_availability

    try:
        return backend_availability(name)
    except Exception as exc:  # an unknown name (no entry point) is "unusable", with the reason
        return False, f"{type(exc).__name__}: {exc}"


def _probe_soc() -> Optional[str]:
    """The SoC of the visible NPU, through the device layer only (called when npu is usable)."""
    from ascendgraph.device import get_device

    try:
        device = get_device("npu")
    except Exception:
        return None
    soc, name = device.profile.soc, device.profile.name
    if soc and name and name != soc:
        return f"{soc} ({name})"
    return soc or name


def collect_facts(
    env: Optional[Mapping[str, str]] = None,
    *,
    reference: ReferenceConfig = ReferenceConfig(),
    ascend_roots: Sequence[str] = DEFAULT_ASCEND_ROOTS,
    package_version: Callable[[str], Optional[str]] = package_version,
    availability: Callable[[str], tuple[bool, str]] = _availability,
    soc_probe: Callable[[], Optional[str]] = _probe_soc,
) -> DoctorFacts:
    """Gather the facts (every probe is injectable; ``env`` defaults to the process environment)."""
    if env is None:
        # Report the user's own autoload setting, not the default ascendgraph set on import.
        import ascendgraph

        environment: dict[str, str] = dict(os.environ)
        original = ascendgraph.ORIGINAL_TORCH_DEVICE_BACKEND_AUTOLOAD
        if original is None:
            environment.pop("TORCH_DEVICE_BACKEND_AUTOLOAD", None)
        else:
            environment["TORCH_DEVICE_BACKEND_AUTOLOAD"] = original
    else:
        environment = dict(env)
    packages: dict[str, Optional[str]] = {}
    for label, names in PACKAGES:
        packages[label] = next((v for v in map(package_version, names) if v is not None), None)
    cann, searched = find_cann(environment, ascend_roots)
    npu_usable, npu_reason = availability("npu")
    sim_usable, sim_reason = availability("sim")
    cache_dir, cache_problem = cache_dir_status(environment)
    return DoctorFacts(
        env=environment,
        python_version=platform.python_version(),
        python_implementation=platform.python_implementation(),
        platform=f"{platform.system()} {platform.machine()}",
        packages=packages,
        cann=cann,
        cann_searched=tuple(searched),
        hdk=find_hdk(ascend_roots),
        npu_usable=npu_usable,
        npu_reason=npu_reason,
        sim_usable=sim_usable,
        sim_reason=sim_reason,
        soc=soc_probe() if npu_usable else None,
        stream=stream_check(reference, environment.get("HCCL_OP_EXPANSION_MODE")),
        cache_dir=cache_dir,
        cache_dir_problem=cache_problem,
    )
