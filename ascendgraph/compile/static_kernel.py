"""Static kernels (``enable_static_kernel``, docs/semantics.md §10): fixed-shape kernels for the decode sizes.

Theory of operation. npugraph_ex's static-kernel compilation runs the optimised FX graph
once per size of interest, dumps every kernel launch (op, input shapes and dtypes) and
compiles one fixed-shape binary per launch; at run time a launch whose shape was compiled
uses that binary (no shape-dependent tiling on the host). ascendgraph does the same on the
aten graph the passes produced, as the last compile stage (`StaticKernelStage`, a pass
that fuses nothing):

1. sizes: the capture sizes s with q <= s <= q * max_num_seqs (q = 1 + speculative tokens,
   vLLM Ascend's ``_vllm_aclnn_static_kernel_sym_range``);
2. signatures: the graph is run on fake tensors at each size and every kernel it launches
   is noted (`collect_signatures`) — views, allocations and kernels whose arguments change
   every step (attention with its task-group updates) are not static (`NOT_STATIC`);
3. build directory ``<cache>/static_kernels/<key>`` where the key hashes the torch
   version, the flags and the signatures; ``<cache>`` is ``$ASCENDGRAPH_CACHE_DIR`` or
   ``~/.cache/ascendgraph``. If a complete build is there it is reused silently; otherwise
   the Python warning ``Starting static kernel compilation, the build directory is <path>``
   (a UserWarning: visible by default) is emitted and the build is written to a temporary
   directory renamed into place at the end — a failed build leaves nothing behind;
4. the build is handed to the stage's listeners: the engine installs it on the device
   (`attach_static_kernels` -> ``device.install_static_kernels``), and graphs captured
   afterwards run those launches as static kernels (the simulator prices them lower and
   names them ``<op>_static_kernel_<id>``, which is what op_statistic.csv shows).

A build is a ``manifest.json`` listing each kernel: id, op, size, input shapes and dtypes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence

import torch
from torch import fx
from ascendgraph.device import Device, StaticKernels
from ascendgraph.dynamo_gate import LazyDynamoDispatchMode

from ascendgraph.ops import argument_tensors
from ascendgraph.cache_temporaries import sweep_once, temporary_prefix
from ascendgraph.readers import load_cache_json, user_cache_root

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.compile.pass_manager import PassManager
    from ascendgraph.resolve import Resolution

__all__ = [
    "STATIC_KERNEL_BUILD_WARNING",
    "CACHE_DIR_ENV",
    "NOT_STATIC",
    "KernelSignature",
    "signatures_to_plain",
    "signatures_from_plain",
    "StaticKernelBuild",
    "StaticKernelStage",
    "static_sizes",
    "cache_root",
    "collect_signatures",
    "build_static_kernels",
    "attach_static_kernels",
]

log = logging.getLogger(__name__)

STATIC_KERNEL_BUILD_WARNING = "Starting static kernel compilation, the build directory is {path}"
CACHE_DIR_ENV = "ASCENDGRAPH_CACHE_DIR"
MANIFEST = "manifest.json"
BUILD_FORMAT = 1

# Launches that get no fixed-shape kernel, with the reason (op name prefix -> why).
NOT_STATIC: dict[str, str] = {
    "ascendgraph.paged_attention": "its sequence lengths change every step (task-group updates)",
    "ascendgraph_attn.": "the attention wrapper op is not a kernel; it issues paged_attention",
    "aten.empty": "an allocation, not a kernel",
    "aten.empty_like": "an allocation, not a kernel",
    "aten.empty_strided": "an allocation, not a kernel",
    "aten._assert_scalar": "a host-side shape assertion",
    "prim.": "a tensor metadata query, not a kernel",
}


@dataclass(frozen=True)
class KernelSignature:
    """One kernel launch: op name (``aten.mm.default``), input shapes and dtypes, the size it ran at."""

    op: str
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    num_tokens: int

    @property
    def key(self) -> tuple:
        """The device's signature (`sim.cost.task_signature`): op, shapes, dtypes."""
        return (self.op, self.input_shapes, self.input_dtypes)

    @property
    def kernel_id(self) -> str:
        text = json.dumps([self.op, self.input_shapes, self.input_dtypes])
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.kernel_id,
            "op": self.op,
            "num_tokens": self.num_tokens,
            "input_shapes": [list(s) for s in self.input_shapes],
            "input_dtypes": list(self.input_dtypes),
        }


@dataclass(frozen=True)
class StaticKernelBuild:
    """A static-kernel build: where it lives, its key, its kernels, and whether it was reused."""

    directory: Path
    key: str
    sizes: tuple[int, ...]
    kernels: tuple[KernelSignature, ...]
    reused: bool

    def kernel_table(self) -> dict[tuple, str]:
        """signature -> kernel id (what ``device.install_static_kernels`` takes)."""
        return {k.key: k.kernel_id for k in self.kernels}


# --------------------------------------------------------------------------- sizes, cache


def static_sizes(capture_sizes: Iterable[int], query_len: int, max_num_seqs: int) -> list[int]:
    """Capture sizes s with q <= s <= q * max_num_seqs (the uniform-decode sizes)."""
    return sorted({int(s) for s in capture_sizes if query_len <= s <= query_len * max_num_seqs})


def cache_root(env: Optional[Mapping[str, str]] = None) -> Path:
    """``$ASCENDGRAPH_CACHE_DIR``, else ``~/.cache/ascendgraph`` (`ascendgraph.readers.user_cache_root`:
    never ``/.cache`` for an empty ``HOME``)."""
    return Path(user_cache_root(env))


# --------------------------------------------------------------------------- signatures


def is_static_candidate(op: str) -> bool:
    return not any(op.startswith(prefix) for prefix in NOT_STATIC)


class _LaunchCollector(LazyDynamoDispatchMode):
    """Notes every kernel launch (non-view op with tensor inputs) while a graph runs on fakes."""

    def __init__(self, num_tokens: int, found: dict[tuple, KernelSignature]) -> None:
        super().__init__()
        self.num_tokens = num_tokens
        self.found = found

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if not func.is_view and is_static_candidate(name):
            inputs = argument_tensors(list(args) + list(kwargs.values()))
            if inputs:
                signature = KernelSignature(
                    name,
                    tuple(tuple(int(d) for d in t.shape) for t in inputs),
                    tuple(str(t.dtype).replace("torch.", "") for t in inputs),
                    self.num_tokens,
                )
                self.found.setdefault(signature.key, signature)
        return out


def _concrete(value: Any, num_tokens: int) -> Any:
    """Substitute num_tokens for every symbolic size (the graph's only dynamic dimension)."""
    if isinstance(value, torch.SymInt):
        expr = value.node.expr
        return int(expr.xreplace({symbol: num_tokens for symbol in expr.free_symbols}))
    return int(value)


def signatures_to_plain(signatures: Optional[Sequence[KernelSignature]]) -> Optional[list[list[Any]]]:
    """Signatures as plain lists (what a cache entry stores: no class of ours in the pickle)."""
    if signatures is None:
        return None
    return [[s.op, [list(shape) for shape in s.input_shapes], list(s.input_dtypes), s.num_tokens] for s in signatures]


def signatures_from_plain(plain: Any) -> Optional[list[KernelSignature]]:
    """The inverse of `signatures_to_plain`; ValueError for anything else."""
    if plain is None:
        return None
    if not isinstance(plain, list):
        raise ValueError(f"static-kernel signatures: expected a list, got {type(plain).__name__}")
    signatures = []
    for entry in plain:
        if not (isinstance(entry, list) and len(entry) == 4 and isinstance(entry[0], str)
                and isinstance(entry[1], list) and isinstance(entry[2], list) and type(entry[3]) is int):
            raise ValueError(f"static-kernel signature: not [op, shapes, dtypes, num_tokens]: {entry!r}"[:200])
        shapes = tuple(tuple(int(d) for d in shape) for shape in entry[1])
        signatures.append(KernelSignature(entry[0], shapes, tuple(str(d) for d in entry[2]), entry[3]))
    return signatures


def collect_signatures(graph_module: fx.GraphModule, sizes: Iterable[int]) -> list[KernelSignature]:
    """The kernel launches of ``graph_module`` at each size, in first-seen order (no duplicates)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    found: dict[tuple, KernelSignature] = {}
    for size in sizes:
        with FakeTensorMode():
            args: list[Any] = []
            for node in placeholders:
                value = node.meta.get("val")
                if isinstance(value, torch.Tensor):
                    shape = [_concrete(d, size) for d in value.shape]
                    stride = [_concrete(d, size) for d in value.stride()]
                    args.append(torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device))
                elif isinstance(value, (torch.SymInt, int)):
                    args.append(_concrete(value, size))
                else:
                    args.append(value)
            with _LaunchCollector(size, found), torch.no_grad():
                graph_module(*args)
    return list(found.values())


# --------------------------------------------------------------------------- build


def _build_key(signatures: Sequence[KernelSignature], flags: Mapping[str, bool], sizes: Sequence[int]) -> str:
    document = {
        "format": BUILD_FORMAT,
        "torch": torch.__version__,
        "flags": dict(sorted(flags.items())),
        "sizes": list(sizes),
        "kernels": sorted(json.dumps(k.as_dict(), sort_keys=True) for k in signatures),
    }
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode()).hexdigest()


def _read_manifest(directory: Path, key: str) -> Optional[dict[str, Any]]:
    manifest = load_cache_json(directory / MANIFEST, "static kernel manifest")  # bounded; broken = miss
    if not isinstance(manifest, dict) or manifest.get("key") != key:
        return None
    return manifest


def build_static_kernels(
    signatures: Sequence[KernelSignature],
    *,
    sizes: Sequence[int],
    flags: Mapping[str, bool],
    cache_dir: Optional[Path] = None,
) -> StaticKernelBuild:
    """Build (or reuse) the static kernels for ``signatures`` under ``cache_dir`` (see the
    module docstring). Warns when it builds; OSError when the cache cannot be written."""
    key = _build_key(signatures, flags, sizes)
    root = (cache_dir if cache_dir is not None else cache_root()) / "static_kernels"
    sweep_once(root)  # staging folders of killed builds (ascendgraph.cache_temporaries)
    directory = root / key[:16]
    kernels = tuple(signatures)
    if _read_manifest(directory, key) is not None:
        log.debug("static kernels reused from %s (%d kernels)", directory, len(kernels))
        return StaticKernelBuild(directory, key, tuple(sizes), kernels, reused=True)
    warnings.warn(STATIC_KERNEL_BUILD_WARNING.format(path=directory), UserWarning, stacklevel=2)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=temporary_prefix(key[:16]), dir=root))
    try:
        manifest = {
            "format": BUILD_FORMAT,
            "key": key,
            "torch": torch.__version__,
            "flags": dict(sorted(flags.items())),
            "sizes": list(sizes),
            "kernels": [k.as_dict() for k in kernels],
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        if directory.is_symlink() or (directory.exists() and not directory.is_dir()):
            directory.unlink()  # not a build folder (a file, a FIFO, a link): replace it, never follow it
        elif directory.exists():  # an incomplete or stale build: replace it
            shutil.rmtree(directory)
        try:
            os.replace(staging, directory)
        except OSError:
            if _read_manifest(directory, key) is None:  # not another process's identical build
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("built %d static kernels for %d sizes (%s..%s) in %s", len(kernels), len(sizes), min(sizes, default=0),
             max(sizes, default=0), directory)
    return StaticKernelBuild(directory, key, tuple(sizes), kernels, reused=False)


# --------------------------------------------------------------------------- the stage


@dataclass
class StaticKernelStage:
    """The last compile stage when ``enable_static_kernel`` resolved on (a GraphPass that fuses
    nothing: it returns 0). ``builds`` has one entry per compiled graph; ``listeners`` get each."""

    sizes: tuple[int, ...]
    flags: dict[str, bool]
    cache_dir: Optional[Path] = None  # None: $ASCENDGRAPH_CACHE_DIR or ~/.cache/ascendgraph, read at build time
    builds: list[StaticKernelBuild] = field(default_factory=list)
    listeners: list[Callable[[StaticKernelBuild], None]] = field(default_factory=list)
    name: str = "static_kernel"
    fuses: bool = False
    # The launches the last graph read gave (None: none read yet, or no size to build for): what
    # a traced-graph cache entry keeps of this stage, whose cached graph has no fake values to
    # read them from again (ascendgraph.compile.cache GRAPH_READERS).
    signatures: Optional[list[KernelSignature]] = None

    @classmethod
    def for_resolution(cls, resolution: "Resolution", cache_dir: Optional[Path] = None) -> "StaticKernelStage":
        config = resolution.config
        acc = config.ascend_compilation_config
        flags = {
            "npugraph_ex": resolution.npugraph_ex,
            "static_kernel": resolution.static_kernel,
            "super_kernel": resolution.super_kernel,
            "fuse_norm_quant": acc.fuse_norm_quant,
            "fuse_qknorm_rope": acc.fuse_qknorm_rope,
            "fuse_muls_add": acc.fuse_muls_add,
        }
        sizes = static_sizes(resolution.capture_sizes, resolution.uniform_decode_query_len, config.max_num_seqs)
        return cls(sizes=tuple(sizes), flags=flags, cache_dir=cache_dir)

    @property
    def build(self) -> Optional[StaticKernelBuild]:
        return self.builds[0] if self.builds else None

    @property
    def cache_token(self) -> str:
        """What the signatures depend on besides the graph: part of a traced-graph cache key."""
        return json.dumps({"sizes": list(self.sizes), "flags": self.flags}, sort_keys=True)

    def __call__(self, graph_module: fx.GraphModule) -> int:
        if not self.sizes:
            log.info("static kernel: no capture size in the decode range; nothing to build")
            return 0
        self.signatures = collect_signatures(graph_module, self.sizes)
        self.apply(self.signatures)
        return 0

    def read_state(self) -> Optional[list[list[Any]]]:
        """What this graph reader read, as plain data a traced-graph entry keeps."""
        return signatures_to_plain(self.signatures)

    def resume(self, state: Any) -> None:
        """Act on what a traced-graph entry kept (`read_state`); ValueError for anything else."""
        self.apply(signatures_from_plain(state))

    def apply(self, signatures: Optional[list[KernelSignature]]) -> None:
        """Build (or reuse) and install the kernels of ``signatures``: the stage's work after
        reading a graph, also what a traced-graph cache hit runs (None: nothing to build)."""
        if signatures is None:
            log.info("static kernel: no capture size in the decode range; nothing to build")
            return
        self.signatures = signatures
        try:
            build = build_static_kernels(signatures, sizes=self.sizes, flags=self.flags, cache_dir=self.cache_dir)
        except OSError as exc:
            log.warning(
                "static kernel build failed (%s); running without static kernels — set %s to a writable directory",
                exc, CACHE_DIR_ENV,
            )
            return
        self.builds.append(build)
        for listener in self.listeners:
            listener(build)


def attach_static_kernels(pass_manager: "PassManager", device: Device) -> Optional[StaticKernelStage]:
    """Install each static-kernel build of the compile ``pass_manager`` runs on ``device``
    (None when its passes build none)."""
    stage = next((p for p in pass_manager.passes if isinstance(p, StaticKernelStage)), None)
    if stage is None:
        return None
    if not isinstance(device, StaticKernels):
        log.warning(
            "device %s cannot install ascendgraph's static kernels (on an NPU they are built by npugraph_ex); "
            "the build only records the fixed-shape launches", device.name,
        )
        return stage
    installer: StaticKernels = device
    stage.listeners.append(lambda build: installer.install_static_kernels(build.kernel_table()))
    return stage
