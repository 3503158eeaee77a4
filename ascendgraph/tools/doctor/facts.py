"""What the doctor knows about a machine (`DoctorFacts`), the reference configuration its stream
check plans for, and the environment variables that change graph mode."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from ascendgraph.modes import GraphMode
from ascendgraph.sizes import (
    DEFAULT_MAX_STREAMS,
    ascend_default_max_capture_size,
    compute_capture_sizes,
    plan_stream_budget,
)

__all__ = [
    "BROKEN_EXIT", "DEFAULT_ASCEND_ROOTS", "DEFAULT_CACHE_DIR", "DoctorFacts", "GRAPH_ENV_NAMES",
    "GRAPH_ENV_VARS", "HDK_SUBJECT", "InstalledVersion", "MIN_HDK", "OK_EXIT", "ReferenceConfig",
    "SCHEMA_VERSION", "STREAM_SUBJECT", "Severity", "StreamCheck", "WRAP", "stream_check",
]

SCHEMA_VERSION = 1
OK_EXIT = 0
BROKEN_EXIT = 1

# HDK 25.5.1 is the first stack without the `Alloc sq cq fail` capture failure (docs/semantics.md §8).
MIN_HDK = (25, 5, 1)
DEFAULT_CACHE_DIR = "$XDG_CACHE_HOME/ascendgraph or ~/.cache/ascendgraph"  # ascendgraph.readers.user_cache_root
DEFAULT_ASCEND_ROOTS = ("/usr/local/Ascend", "~/Ascend")
WRAP = 110


class Severity(str, enum.Enum):
    BREAKS = "breaks"
    WEAKENS = "weakens"
    NOTE = "note"

    def __str__(self) -> str:
        return self.value


# Every environment variable that changes graph mode, and what it does (the doctor lists
# all of them, set or not).
GRAPH_ENV_VARS: tuple[tuple[str, str], ...] = (
    ("HCCL_OP_EXPANSION_MODE", "where HCCL expands collectives (AIV, AI_CPU, HOST, HOST_TS); sets the streams each graph costs"),
    ("ASCEND_LAUNCH_BLOCKING", "synchronous kernel launches for debugging; 1 is incompatible with graph mode"),
    ("TASK_QUEUE_ENABLE", "torch_npu's asynchronous launch queue (0 off, 1 on, 2 on + extra optimisation)"),
    ("PYTORCH_NPU_ALLOC_CONF", "torch_npu caching-allocator options; the graph memory pool comes from this allocator"),
    ("TORCH_DEVICE_BACKEND_AUTOLOAD", "whether `import torch` also imports torch_npu (torch: only \"1\" or unset loads it)"),
    ("TORCH_COMPILE_DISABLE", "torch.compile off for the whole process (torch/_dynamo/config.py `disable`: \"1\" only)"),
    ("ASCENDGRAPH_CACHE_DIR", f"ascendgraph's cache: static-kernel builds, the parity environment (default {DEFAULT_CACHE_DIR})"),
)
GRAPH_ENV_NAMES = tuple(name for name, _ in GRAPH_ENV_VARS)
HDK_SUBJECT = "HDK driver"
STREAM_SUBJECT = "stream budget"


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True)
class ReferenceConfig:
    """The configuration the stream-budget check plans for (vLLM Ascend defaults on a 0.6B model)."""

    num_hidden_layers: int = 28
    tensor_parallel_size: int = 2
    data_parallel_size: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    mode: GraphMode = GraphMode.FULL_AND_PIECEWISE
    stream_limit: int = DEFAULT_MAX_STREAMS

    def describe(self) -> str:
        return (
            f"{self.num_hidden_layers} layers, {self.mode.name}, tp={self.tensor_parallel_size}, "
            f"dp={self.data_parallel_size}, default capture sizes for max_num_seqs={self.max_num_seqs}, "
            f"{self.stream_limit} streams"
        )


@dataclass(frozen=True)
class StreamCheck:
    """How many of the reference config's capture sizes fit the stream budget, per expansion mode."""

    reference: ReferenceConfig
    num_sizes: int
    current_mode: str  # the expansion mode the environment selects ("AIV" or "FFTS+")
    fit_ffts: int
    fit_aiv: int
    sizes_ffts: list[int]
    sizes_aiv: list[int]

    @property
    def fit_current(self) -> int:
        return self.fit_aiv if self.current_mode == "AIV" else self.fit_ffts

    def as_dict(self) -> dict[str, Any]:
        ref = self.reference
        return {
            "reference": {
                "num_hidden_layers": ref.num_hidden_layers,
                "tensor_parallel_size": ref.tensor_parallel_size,
                "data_parallel_size": ref.data_parallel_size,
                "max_num_seqs": ref.max_num_seqs,
                "max_num_batched_tokens": ref.max_num_batched_tokens,
                "cudagraph_mode": ref.mode.name,
                "stream_limit": ref.stream_limit,
            },
            "num_sizes": self.num_sizes,
            "expansion_mode": self.current_mode,
            "fit_current": self.fit_current,
            "fit_ffts": self.fit_ffts,
            "fit_aiv": self.fit_aiv,
        }


def stream_check(reference: ReferenceConfig, hccl_op_expansion_mode: Optional[str]) -> StreamCheck:
    """Plan the reference config's default sizes with FFTS+ and with AIV (docs/semantics.md §9)."""
    sizes = compute_capture_sizes(
        max_num_seqs=reference.max_num_seqs,
        max_num_batched_tokens=reference.max_num_batched_tokens,
        max_capture_size=ascend_default_max_capture_size(reference.max_num_seqs),
    ).sizes

    def plan(expansion: Optional[str]):  # type: ignore[no-untyped-def]  # a local helper returning the planner's StreamPlan
        return plan_stream_budget(
            num_hidden_layers=reference.num_hidden_layers,
            capture_sizes=sizes,
            mode=reference.mode,
            tensor_parallel_size=reference.tensor_parallel_size,
            data_parallel_size=reference.data_parallel_size,
            hccl_op_expansion_mode=expansion,
            max_streams=reference.stream_limit,
        )

    ffts, aiv = plan(None), plan("AIV")
    current = "AIV" if (hccl_op_expansion_mode or "").strip().upper() == "AIV" else "FFTS+"
    return StreamCheck(
        reference=reference,
        num_sizes=len(sizes),
        current_mode=current,
        fit_ffts=min(ffts.max_num_sizes, len(sizes)),
        fit_aiv=min(aiv.max_num_sizes, len(sizes)),
        sizes_ffts=list(ffts.sizes),
        sizes_aiv=list(aiv.sizes),
    )


@dataclass(frozen=True)
class InstalledVersion:
    version: str
    path: str


@dataclass(frozen=True)
class DoctorFacts:
    """Everything the rules may look at. Built by `collect_facts`; tests build it directly."""

    env: Mapping[str, str]
    python_version: str
    python_implementation: str
    platform: str
    packages: Mapping[str, Optional[str]]
    cann: Optional[InstalledVersion]
    cann_searched: tuple[str, ...]
    hdk: Optional[InstalledVersion]
    npu_usable: bool
    npu_reason: str
    sim_usable: bool
    sim_reason: str
    soc: Optional[str]
    stream: StreamCheck
    cache_dir: str
    cache_dir_problem: Optional[str]

    def value(self, subject: str) -> Optional[str]:
        """The value a rule's subject has: an environment variable, or the HDK version."""
        if subject == HDK_SUBJECT:
            return self.hdk.version if self.hdk else None
        if subject == STREAM_SUBJECT:
            return str(self.stream.reference.stream_limit)
        return self.env.get(subject)

    @property
    def torch_npu_installed(self) -> bool:
        return self.packages.get("torch_npu") is not None

    @property
    def cann_found(self) -> bool:
        return self.cann is not None
