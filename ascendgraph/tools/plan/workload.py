"""Reading a plan's workload: a file of batch sizes, or the batches the engine's scheduler
generates (the same ones `ascendgraph run` serves with the same flags)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any, Optional

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.readers import open_input, read_int, read_text_file

__all__ = [
    "DEFAULT_REQUESTS", "Workload", "check_workload_fits", "file_workload", "generated_workload",
    "read_workload_file",
]

DEFAULT_REQUESTS = 16  # the same default as `ascendgraph run`, so both see the same workload


# --------------------------------------------------------------------------- workload


@dataclass(frozen=True)
class Workload:
    """Batch sizes (tokens) of a workload: all of them, and those a graph can serve."""

    source: str  # "file" | "generated"
    description: str
    batch_sizes: list[int]  # every batch, in order
    counted: list[int]  # the batches that count for padding (graph-eligible kind)
    details: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        sizes = self.batch_sizes
        return {
            "min": min(sizes),
            "median": statistics.median(sizes),
            "mean": sum(sizes) / len(sizes),
            "max": max(sizes),
        }


# Generated requests `plan` simulates at most (about a millisecond each on one core): more would
# take minutes; a workload file of any length is read in linear time instead.
MAX_GENERATED_REQUESTS = 20_000


def _short(text: str) -> str:
    shown = repr(text)
    return shown if len(shown) <= 40 else shown[:37] + "..."


def read_workload_file(path: str, *, max_tokens: Optional[int] = None) -> list[int]:
    """One batch size in tokens per line; blank lines and ``#`` comments are skipped.

    A bad line is a ConfigError naming the file, the line number and the text; so is a
    batch size above ``max_tokens`` (the config's max_num_batched_tokens: no batch is larger).
    """
    open_input(path, f"cannot read the workload file {path}", key="workload").close()  # regular files only
    lines = read_text_file(path, str(path), key="workload", kind="text, one batch size in tokens per line").splitlines()
    sizes: list[int] = []
    for number, line in enumerate(lines, 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        try:
            value: Optional[int] = read_int(text, "")  # ASCII digits, at most 20
        except ConfigError:
            value = None
        if value is None or value < 1:
            raise ConfigError(
                f"{path}:{number}: expected a batch size in tokens (an integer >= 1), got {_short(text)}", key="workload"
            )
        if max_tokens is not None and value > max_tokens:
            raise ConfigError(f"{path}:{number}: {_above_max_text(value, max_tokens)}", key="workload")
        sizes.append(value)
    if not sizes:
        raise ConfigError(f"{path}: no batch sizes found (expected one batch size in tokens per line)", key="workload")
    return sizes


def _above_max_text(value: int, max_tokens: int) -> str:
    return (
        f"batch size {value} is above max_num_batched_tokens ({max_tokens}), and no batch holds more tokens; "
        f"remove it or raise --max-num-batched-tokens"
    )


def check_workload_fits(workload: "Workload", max_tokens: int) -> None:
    """Every batch of ``workload`` must fit max_num_batched_tokens (ConfigError naming the first that does not)."""
    for index, value in enumerate(workload.batch_sizes, 1):
        if value > max_tokens:
            raise ConfigError(f"workload {workload.description}, batch {index}: {_above_max_text(value, max_tokens)}",
                              key="workload")


def _counts_for_mode(mode: GraphMode) -> str:
    """Which batches a graph can serve: 'all', or 'decode' when mixed batches run eagerly."""
    return "decode" if mode.mixed_mode() is GraphMode.NONE and mode is not GraphMode.NONE else "all"


def generated_workload(config: GraphConfig, mode: GraphMode, *, requests: int, seed: int) -> Workload:
    """The batches the engine's scheduler forms for ``requests`` generated requests (at most
    `MAX_GENERATED_REQUESTS`, refused up front: the scheduler is simulated request by request)."""
    if requests > MAX_GENERATED_REQUESTS:
        raise ConfigError(
            f"--requests {requests}: a generated workload is simulated through the scheduler request by request "
            f"(about a millisecond each), so at most {MAX_GENERATED_REQUESTS} requests are planned (seconds, not "
            f"minutes); pass the batch sizes as a file (--workload FILE) to plan for more", key="requests")
    from ascendgraph.runtime.workload import WorkloadSpec, generate_workload, simulate_batches

    spec = WorkloadSpec(num_requests=requests, seed=seed)
    batches = simulate_batches(
        generate_workload(spec, vocab_size=config.model.vocab_size),
        max_num_seqs=config.max_num_seqs,
        max_num_batched_tokens=config.max_num_batched_tokens,
        num_speculative_tokens=config.num_speculative_tokens,
        block_size=config.block_size,
        vocab_size=config.model.vocab_size,
        seed=seed,
    )
    sizes = [b.num_tokens for b in batches]
    decode_only = _counts_for_mode(mode) == "decode"
    counted = [b.num_tokens for b in batches if b.uniform_decode] if decode_only else list(sizes)
    kinds: dict[str, int] = {}
    for b in batches:
        kinds[b.kind] = kinds.get(b.kind, 0) + 1
    return Workload(
        source="generated",
        description=f"{requests} generated requests (seed {seed})",
        batch_sizes=sizes,
        counted=counted,
        details={"requests": requests, "seed": seed, "kinds": kinds,
                 "counted": "uniform-decode batches" if decode_only else "all batches"},
    )


def file_workload(path: str, *, max_tokens: Optional[int] = None) -> Workload:
    sizes = read_workload_file(path, max_tokens=max_tokens)
    return Workload(source="file", description=f"{path}", batch_sizes=sizes, counted=list(sizes),
                    details={"path": path, "counted": "all batches"})
