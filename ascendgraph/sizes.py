"""Capture sizes: defaults, validation, spec-decode rounding, TP alignment, padding, and the
stream-budget planner (docs/semantics.md §2 and §9).

Theory of operation. A *capture size* is a num_tokens value for which graphs are
captured. A batch of t tokens (1 <= t <= max) is padded up to the smallest capture size
>= t and replays that size's graph; larger batches run eagerly. The vLLM rule that picks
the sizes lives in `compute_capture_sizes`; the Ascend-only adjustments (a smaller default
max, TP alignment, A5 pruning) are separate functions that `resolve` applies in order.

The stream planner answers "how many sizes fit the stack's streams?" with vLLM Ascend's
formula. The simulator never charges the planner's numbers: it counts what each captured
graph holds (sim/budget.py), so "the planner's N + 1-th size is the first capture that
fails" is evidence, checked end to end by tests/engine/test_plan_vs_sim.py.

Upstream sources of the constants (docs/semantics.md §2 and §9 give the full citations;
tests/unit/test_constants_sources.py pins each value to its source):

* ASCEND_MAX_CAPTURE_SIZE_CAP and the Ascend default max: vLLM Ascend
  `vllm_ascend/platform.py` `_get_default_max_cudagraph_capture_size` (PR #7572).
* TP alignment and its error text: vLLM Ascend `vllm_ascend/platform.py`
  `NPUPlatform.check_and_update_config`, the `enable_sp` branch (commit 8243ecf5).
* DEFAULT_MAX_STREAMS, FFTS_STREAMS_PER_COMM_GROUP, CONTEXT_PARALLEL_RESERVED_STREAMS, the
  FFTS+/AIV factors and the even sampling: vLLM Ascend `vllm_ascend/config/aclgraph.py`
  `update_aclgraph_sizes` (commit 41896bc9), since removed upstream (PR #9962).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional, Sequence

from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode

__all__ = [
    "pad_sorted",
    "CaptureSizes",
    "StreamPlan",
    "DEFAULT_MAX_STREAMS",
    "ASCEND_MAX_CAPTURE_SIZE_CAP",
    "compute_capture_sizes",
    "ascend_default_max_capture_size",
    "align_sizes_to_tp",
    "round_sizes_for_spec_decode",
    "round_up",
    "padding_table",
    "pad_num_tokens",
    "sample_sizes",
    "plan_stream_budget",
    "select_sizes",
    "padding_waste",
    "HCCL_EXPANSION_MODES",
    "HCCL_PLANNER_MODES",
    "check_hccl_expansion_mode",
    "hccl_expansion_mode_from_env",
]

# vLLM's cap of the default max, kept by vLLM Ascend's default (docs/semantics.md §2).
ASCEND_MAX_CAPTURE_SIZE_CAP = 512
# vLLM Ascend's MAX_CAPTURE_SIZE in update_aclgraph_sizes: 2048 streams less a buffer (§9).
DEFAULT_MAX_STREAMS = 1800
# FFTS+/AICPU expansion keeps this many streams per communication group out of the budget
# (the `- num_comm_groups * 40` of update_aclgraph_sizes' FFTS+ branch, §9).
FFTS_STREAMS_PER_COMM_GROUP = 40
# CP_ADDITIONAL_STREAM_NUM of update_aclgraph_sizes: each of pcp > 1 and dcp > 1 costs 100 (§9).
CONTEXT_PARALLEL_RESERVED_STREAMS = 100
PERFORMANCE_MODES = ("balanced", "interactivity", "throughput")

# The two warnings vLLM emits while choosing sizes (and no others).
TRUNCATE_MAX_WARNING = "Truncating max_cudagraph_capture_size to {size}"
OVERRIDDEN_SIZES_WARNING = (
    "cudagraph_capture_sizes specified in compilation_config {user} is overridden by config {final}"
)
INCONSISTENT_MAX_ERROR = (
    "customized max_cudagraph_capture_size(={user_max}) should be consistent with the max value "
    "of cudagraph_capture_sizes(={size_max})"
)


@dataclass(frozen=True)
class CaptureSizes:
    """The result of the vLLM size rule: sorted sizes, their max (0 when empty), warnings."""

    sizes: list[int]
    max_size: int
    warnings: list[str] = field(default_factory=list)


def round_up(value: int, multiple: int) -> int:
    return ((value + multiple - 1) // multiple) * multiple


def _check_positive_int(name: str, value: object, *, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(
            f"{name} must be an integer, got {value!r} ({type(value).__name__})", key=name
        )
    if value < 0 or (value == 0 and not allow_zero):
        lowest = 0 if allow_zero else 1
        raise ConfigError(f"{name} must be >= {lowest}, got {value}", key=name)
    return value


def request_counts(max_num_seqs: int) -> list[int]:
    """Request counts whose decode batches get a capture size by default (vLLM 0.32)."""
    r = min(max_num_seqs, 512)
    counts = {n for n in (1, 2, 4) if n <= r}
    counts.update(range(8, min(r + 1, 256), 8))
    counts.update(range(256, r + 1, 16))
    counts.add(r)
    return sorted(counts)


def _generated_sizes(max_size: int, performance_mode: str) -> list[int]:
    sizes = {s for s in (1, 2, 4) if s <= max_size}
    sizes.update(range(8, min(max_size + 1, 256), 8))
    sizes.update(range(256, max_size + 1, 16))
    if performance_mode == "interactivity":
        sizes.update(range(1, min(max_size, 32) + 1))
    return sorted(sizes)


def compute_capture_sizes(
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    num_speculative_tokens: int = 0,
    capture_sizes: Optional[Sequence[int]] = None,
    max_capture_size: Optional[int] = None,
    performance_mode: str = "balanced",
) -> CaptureSizes:
    """vLLM 0.32's capture-size rule (docs/semantics.md §2, steps 1-3), for when graphs are on."""
    mns = _check_positive_int("max_num_seqs", max_num_seqs)
    mnbt = _check_positive_int("max_num_batched_tokens", max_num_batched_tokens)
    k = _check_positive_int("num_speculative_tokens", num_speculative_tokens, allow_zero=True)
    if performance_mode not in PERFORMANCE_MODES:
        raise ConfigError(
            f"performance_mode must be one of {', '.join(PERFORMANCE_MODES)}, got {performance_mode!r}",
            key="performance_mode",
        )
    q = 1 + k
    warnings: list[str] = []

    # Step 1: the initial max and the default decode sizes.
    decode_sizes: list[int] = []
    if max_capture_size is not None:
        user_max = _check_positive_int("max_cudagraph_capture_size", max_capture_size)
        max_size = user_max
    else:
        max_size = min(mns * q * 2, ASCEND_MAX_CAPTURE_SIZE_CAP)
        if q > 1:
            decode_sizes = [n * q for n in request_counts(mns) if n * q <= max_size]
        elif mns <= max_size:
            decode_sizes = [mns]
    max_size = min(max_size, mnbt)
    if max_size < 1:  # pragma: no cover - guarded by the positivity checks above
        raise ConfigError(f"max_cudagraph_capture_size must be >= 1, got {max_size}")

    # Step 2: the sizes themselves.
    if capture_sizes is not None:
        user_sizes = list(capture_sizes)
        if not user_sizes:
            raise ConfigError(
                "cudagraph_capture_sizes must not be empty; give at least one size or leave it unset "
                "to use the defaults",
                key="cudagraph_capture_sizes",
            )
        for s in user_sizes:
            _check_positive_int("cudagraph_capture_sizes entry", s)
        sizes = sorted(s for s in set(user_sizes) if s <= mnbt)
    else:
        generated = set(_generated_sizes(max_size, performance_mode))
        if mnbt <= max_size:
            generated.add(mnbt)
        generated.update(s for s in decode_sizes if s <= mnbt)
        sizes = sorted(generated)

    # Step 3: the final max and the two warnings.
    final_max = sizes[-1] if sizes else 0
    if max_capture_size is not None and max_capture_size != final_max:
        if capture_sizes is not None:
            raise ConfigError(
                INCONSISTENT_MAX_ERROR.format(user_max=max_capture_size, size_max=final_max),
                key="max_cudagraph_capture_size",
            )
        warnings.append(TRUNCATE_MAX_WARNING.format(size=final_max))
    if capture_sizes is not None and len(sizes) < len(list(capture_sizes)):
        warnings.append(OVERRIDDEN_SIZES_WARNING.format(user=list(capture_sizes), final=sizes))
    return CaptureSizes(sizes=sizes, max_size=final_max, warnings=warnings)


def ascend_default_max_capture_size(max_num_seqs: int, num_speculative_tokens: int = 0) -> int:
    """Ascend's default max when the user set neither max nor sizes: no `* 2` (docs/semantics.md §2).

    vLLM Ascend: `NPUPlatform.apply_config_platform_defaults` / `_get_default_max_cudagraph_capture_size`
    in `vllm_ascend/platform.py` (PR #7572); resolution injects it as if the user had given it.
    """
    mns = _check_positive_int("max_num_seqs", max_num_seqs)
    k = _check_positive_int("num_speculative_tokens", num_speculative_tokens, allow_zero=True)
    return min(mns * (1 + k), ASCEND_MAX_CAPTURE_SIZE_CAP)


def align_sizes_to_tp(sizes: Sequence[int], tensor_parallel_size: int) -> list[int]:
    """Keep the sizes divisible by tp (Ascend, under sequence parallel / shared-expert DP / DSA CP).

    vLLM Ascend: the `enable_sp` branch of `NPUPlatform.check_and_update_config` (docs/semantics.md
    §2; the DSA CP trigger is ascendgraph's reading, see "Known differences" there).
    """
    tp = _check_positive_int("tensor_parallel_size", tensor_parallel_size)
    kept = [s for s in sizes if s % tp == 0]
    if sizes and not kept:
        raise ConfigError(
            f"cudagraph_capture_sizes {list(sizes)} does not contain values that are multiples of "
            f"tp_size {tp}",
            key="cudagraph_capture_sizes",
        )
    return kept


def round_sizes_for_spec_decode(
    sizes: Sequence[int], max_size: int, *, query_len: int
) -> tuple[list[int], int]:
    """Round sizes up to multiples of the decode query length q = 1 + k (docs/semantics.md §2.5)."""
    if not sizes or query_len <= 1:
        return list(sizes), max_size
    rounded = sorted({round_up(s, query_len) for s in sizes if round_up(s, query_len) <= max_size})
    if not rounded and query_len <= max_size:
        rounded = [query_len]
    if not rounded:
        raise ConfigError(
            f"No valid cudagraph sizes after rounding to multiple of {query_len} (num_speculative_tokens + 1) "
            f"please adjust num_speculative_tokens ({query_len - 1}) or "
            f"max_cudagraph_capture_size ({max_size}) or cudagraph_capture_sizes ({list(sizes)})",
            key="cudagraph_capture_sizes",
        )
    return rounded, rounded[-1]


def padding_table(sizes: Sequence[int]) -> list[int]:
    """Index t in 0..max gives the capture size a batch of t tokens pads to (0 -> 0)."""
    ordered = sorted(set(sizes))
    if not ordered:
        return [0]
    table = [0] * (ordered[-1] + 1)
    current = 0
    for size in ordered:
        for t in range(current + 1, size + 1):
            table[t] = size
        current = size
    return table


def pad_num_tokens(num_tokens: int, sizes: Sequence[int]) -> Optional[int]:
    """The capture size num_tokens pads to, or None when it exceeds the largest size."""
    if num_tokens <= 0:
        return 0
    import bisect

    return pad_sorted(num_tokens, sorted(sizes))


def pad_sorted(num_tokens: int, ordered: Sequence[int]) -> Optional[int]:
    """`pad_num_tokens` over sizes already sorted ascending: O(log n), for loops over a workload."""
    import bisect

    if num_tokens <= 0:
        return 0
    index = bisect.bisect_left(ordered, num_tokens)
    return ordered[index] if index < len(ordered) else None


def sample_sizes(sizes: Sequence[int], n: int) -> list[int]:
    """Even sampling of n sizes, first and last kept (vLLM Ascend's old pruning; A5).

    The sampling of `update_aclgraph_sizes` (`vllm_ascend/config/aclgraph.py`) and of
    `_prune_capture_sizes_for_950` (`vllm_ascend/platform.py`), docs/semantics.md §9.
    n <= 1 keeps only the largest size (every graphed batch still fits): ascendgraph's
    choice, where upstream would divide by n - 1.
    """
    ordered = sorted(sizes)
    if n >= len(ordered):
        return list(ordered)
    if not ordered:
        return []
    if n <= 1:
        return [ordered[-1]]
    step = (len(ordered) - 1) / (n - 1)
    indices = [round(i * step) for i in range(n)]
    indices[0], indices[-1] = 0, len(ordered) - 1
    return [ordered[i] for i in indices]


# --------------------------------------------------------------------------- stream plan


@dataclass(frozen=True)
class StreamPlan:
    """How many capture sizes fit the stream budget, and what each graph costs.

    ``sizes`` is the configured list when it fits, else the largest fitting selection
    (even sampling). ``reserved_streams`` and ``full_graph_reserve`` are what the formula
    keeps out of the budget before dividing by ``streams_per_size``. These are predictions:
    the simulator does not read them (it counts what captured graphs hold), except
    ``max_streams``, the limit the stack was configured with (docs/semantics.md §9).
    """

    max_num_sizes: int
    sizes: list[int]
    streams_per_size: int
    warnings: list[str]
    requested_sizes: list[int]
    graphs_per_size: int
    streams_per_piecewise_graph: int
    streams_per_full_graph: int
    reserved_streams: int
    full_graph_reserve: int
    max_streams: int
    expansion_mode: str

    @property
    def fits(self) -> bool:
        return len(self.requested_sizes) <= self.max_num_sizes

    def streams_needed(self, num_sizes: int) -> int:
        """Streams consumed once num_sizes sizes are captured (reserve included)."""
        return self.reserved_streams + self.full_graph_reserve + num_sizes * self.streams_per_size

    def first_failing_index(self) -> Optional[int]:
        """0-based index (in capture order, largest first) of the first size that will not fit."""
        return None if self.fits else self.max_num_sizes

    def as_dict(self) -> dict[str, object]:
        return {
            "max_num_sizes": self.max_num_sizes,
            "streams_per_size": self.streams_per_size,
            "fits": self.fits,
            "sizes": list(self.sizes),
            "requested_sizes": list(self.requested_sizes),
            "graphs_per_size": self.graphs_per_size,
            "reserved_streams": self.reserved_streams + self.full_graph_reserve,
            "max_streams": self.max_streams,
            "expansion_mode": self.expansion_mode,
        }


FFTS_HINT = (
    "HCCL expands collectives with FFTS+/AICPU, which costs streams per communication group and "
    "limits the number of capture sizes; set HCCL_OP_EXPANSION_MODE=AIV to fit more."
)


def plan_stream_budget(
    *,
    num_hidden_layers: int,
    capture_sizes: Sequence[int],
    mode: GraphMode,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    enable_expert_parallel: bool = False,
    multistream_overlap_shared_expert: bool = False,
    is_moe: bool = False,
    draft_num_hidden_layers: Optional[int] = None,
    prefill_context_parallel_size: int = 1,
    decode_context_parallel_size: int = 1,
    hccl_op_expansion_mode: Optional[str] = None,
    max_streams: int = DEFAULT_MAX_STREAMS,
) -> StreamPlan:
    """docs/semantics.md §9: the number of capture sizes the stack's streams allow.

    vLLM Ascend's `update_aclgraph_sizes` (`vllm_ascend/config/aclgraph.py`, commit 41896bc9):
    its worked examples (a budget of 1920, 48 layers, tp 4) give 12 sizes under FFTS+ and 19
    under AIV for a MoE model; tests/unit/test_constants_sources.py checks both. The
    FULL_AND_PIECEWISE reserve and the one stream per size of FULL modes are ascendgraph's.
    """
    layers = _check_positive_int("num_hidden_layers", num_hidden_layers)
    budget = _check_positive_int("stream_limit", max_streams)
    mode = GraphMode.parse(mode)
    requested = sorted(set(capture_sizes))
    warnings: list[str] = []

    piecewise = mode.has_piecewise_graphs()
    graphs_per_size = layers + 1 if piecewise else 1
    if piecewise and draft_num_hidden_layers:
        graphs_per_size += _check_positive_int("draft_num_hidden_layers", draft_num_hidden_layers) + 1
    comm_groups = int(data_parallel_size > 1) + int(tensor_parallel_size > 1)
    expansion = (hccl_op_expansion_mode or "").strip().upper()
    full_graph_reserve = len(requested) if mode is GraphMode.FULL_AND_PIECEWISE else 0

    reserved = 0
    if expansion == "AIV":
        factor = 1 + comm_groups + int(enable_expert_parallel) + int(multistream_overlap_shared_expert)
        if is_moe:
            factor += int(data_parallel_size > 1)
        else:
            # Dense models: the all-reduce of the dense layers occupies extra streams.
            reserved = factor * graphs_per_size
        expansion_name = "AIV"
    else:
        factor = 1 + 2 * comm_groups
        reserved = FFTS_STREAMS_PER_COMM_GROUP * comm_groups
        reserved += CONTEXT_PARALLEL_RESERVED_STREAMS * int(prefill_context_parallel_size > 1)
        reserved += CONTEXT_PARALLEL_RESERVED_STREAMS * int(decode_context_parallel_size > 1)
        expansion_name = expansion or "FFTS+"
        if piecewise and comm_groups:
            warnings.append(FFTS_HINT)

    streams_per_piecewise_graph = factor if piecewise else 0
    streams_per_full_graph = 1
    streams_per_size = graphs_per_size * factor if piecewise else 1
    available = budget - reserved - full_graph_reserve
    max_num_sizes = max(0, math.floor(available / streams_per_size))

    if len(requested) > max_num_sizes == 0:
        chosen = []  # nothing fits: suggesting the largest size alone would fail as well
        warnings.append(
            f"not even one capture size fits: one size needs {streams_per_size} streams but only "
            f"{max(0, available)} of the budget {budget} are left after {reserved + full_graph_reserve} reserved; "
            "set HCCL_OP_EXPANSION_MODE=AIV, use fewer layers or a FULL mode, or run without graphs (--enforce-eager)"
        )
    elif len(requested) > max_num_sizes:
        chosen = sample_sizes(requested, max_num_sizes)
        warnings.append(
            f"{len(requested)} capture sizes need {reserved + full_graph_reserve + len(requested) * streams_per_size} "
            f"streams but the budget is {budget}: at most {max_num_sizes} sizes fit "
            f"({streams_per_size} streams per size); largest fitting selection: {chosen}"
        )
    else:
        chosen = list(requested)
    return StreamPlan(
        max_num_sizes=max_num_sizes,
        sizes=chosen,
        streams_per_size=streams_per_size,
        warnings=warnings,
        requested_sizes=requested,
        graphs_per_size=graphs_per_size,
        streams_per_piecewise_graph=streams_per_piecewise_graph,
        streams_per_full_graph=streams_per_full_graph,
        reserved_streams=reserved,
        full_graph_reserve=full_graph_reserve,
        max_streams=budget,
        expansion_mode=expansion_name,
    )


# HCCL_OP_EXPANSION_MODE values HCCL itself knows (doctor checks the environment against the
# same list), and the planner's names for the non-AIV expansion (docs/semantics.md §9: "FFTS+/AICPU").
HCCL_EXPANSION_MODES = ("AI_CPU", "AIV", "HOST", "HOST_TS")
HCCL_PLANNER_MODES = ("FFTS+", "AICPU")


def check_hccl_expansion_mode(value: object) -> Optional[str]:
    """An explicit expansion mode (a flag or argument), upper-cased; None/"" is unset.

    Anything but AIV plans as FFTS+ (docs/semantics.md §9), so a typo such as "aiv2" would silently
    cost streams: it is a ConfigError naming the valid values instead.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    valid = HCCL_EXPANSION_MODES + HCCL_PLANNER_MODES
    text = value.strip().upper() if isinstance(value, str) else None
    if text not in valid:
        raise ConfigError(
            f"hccl_op_expansion_mode (--hccl-op-expansion-mode) must be one of {', '.join(valid)}, got {value!r}; "
            "AIV fits the most capture sizes, and leaving it unset reads HCCL_OP_EXPANSION_MODE from the environment",
            key="hccl_op_expansion_mode",
        )
    return text


def hccl_expansion_mode_from_env(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    source = os.environ if env is None else env
    value = source.get("HCCL_OP_EXPANSION_MODE")
    return value.strip() if value else None


# --------------------------------------------------------------------------- workload-aware


def padding_waste(sizes: Sequence[int], workload: Iterable[int]) -> float:
    """Padded tokens / real tokens - 1 over the graphed batches of a workload (eager ones cost 0)."""
    ordered = sorted(sizes)
    real = padded = 0
    for t in workload:
        if t <= 0:
            continue
        target = pad_sorted(t, ordered)
        if target is None:
            continue
        real += t
        padded += target
    return padded / real - 1 if real else 0.0


def select_sizes(candidates: Sequence[int], n: int, workload: Iterable[int]) -> list[int]:
    """At most n capture sizes from candidates minimising padded tokens on the workload.

    The largest candidate is always kept, so every batch that fits a graph today still
    does. Exact dynamic programming over the sorted candidates: O(n * C^2).
    """
    ordered = sorted(set(candidates))
    if not ordered:
        return []
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigError(f"the size budget must be an integer >= 1, got {n!r}", key="budget")
    if n >= len(ordered):
        return ordered
    largest = ordered[-1]
    counts: dict[int, int] = {}
    for t in workload:
        if 0 < t <= largest:
            counts[t] = counts.get(t, 0) + 1
    from ascendgraph.size_selection import EXACT_SELECTION_WORK, select_sizes_fast

    if n * len(ordered) ** 2 > EXACT_SELECTION_WORK:
        return select_sizes_fast(ordered, n, counts)
    # cost(i, j): padded tokens of batches in (ordered[i], ordered[j]] padded to ordered[j];
    # i = -1 means "from 0".
    tokens = sorted(counts)
    import bisect

    prefix_count = [0]
    for t in tokens:
        prefix_count.append(prefix_count[-1] + counts[t])

    def batches_in(lo: int, hi: int) -> int:
        a = bisect.bisect_right(tokens, lo)
        b = bisect.bisect_right(tokens, hi)
        return prefix_count[b] - prefix_count[a]

    def cost(lo: int, hi: int) -> int:
        return batches_in(lo, hi) * hi

    count = len(ordered)
    inf = float("inf")
    # best[k][j]: minimal cost covering (0, ordered[j]] with k sizes, the last being ordered[j].
    best = [[inf] * count for _ in range(n + 1)]
    parent = [[-1] * count for _ in range(n + 1)]
    for j in range(count):
        best[1][j] = cost(0, ordered[j])
    for k in range(2, n + 1):
        for j in range(count):
            for i in range(j):
                value = best[k - 1][i] + cost(ordered[i], ordered[j])
                if value < best[k][j]:
                    best[k][j] = value
                    parent[k][j] = i
    last = count - 1
    k_best = min(range(1, n + 1), key=lambda k: (best[k][last], k))
    chosen = []
    j, k = last, k_best
    while j != -1 and k >= 1:
        chosen.append(ordered[j])
        j = parent[k][j]
        k -= 1
    return sorted(chosen)

