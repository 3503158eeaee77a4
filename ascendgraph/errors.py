"""Exceptions, the user-facing message texts, and the capture-error rewriter.

Every string users grep for lives here (docs/semantics.md cites their sources), so the
simulator, the engine and the diagnostics tools can never drift apart.

Hierarchy (docs/decisions.md "One error hierarchy, three exit codes"). Every class derives
from `AscendGraphError` and from the builtin named on the left; `Terminated` alone is a
BaseException (a signal, like KeyboardInterrupt: no ``except Exception`` may swallow it).

    ValueError    -> ConfigError -> XliteConfigError (also a RuntimeError), ScenarioError,
                                    UnreadableLog
                  -> GraphModeError
    RuntimeError  -> CaptureError -> StreamResourceExhausted, OldHdkStack,
                                     ResourceAllocFailed, CaptureConstraintError
                  -> GraphHang, StaleGraphParams, StreamOrderError, DeviceLost, NumericalMismatch,
                     DeviceUnavailable, KernelContractError
                  -> CollectiveError -> CollectiveMismatch, CollectiveDeadlock, CollectiveTimeout
                  -> NoForwardContext, CaptureNotAllowed, GraphParamsNotSet, OutOfKVBlocks
                     (broken invariants of the runtime: a bug, not bad input)
                  -> RedispatchFailed (a DP rank's re-dispatch), RayTaskFailed (a lost Ray task)
    AssertionError -> XliteBudgetExceeded (a batch the router should have kept native)
    OSError       -> StdoutWriteError (the command's results could not be written to stdout)
    Exception     -> CliUsageError (bad flags, exit 2), ScenarioFailed (a scenario missed)
    BaseException -> Terminated (SIGTERM while a command runs)

``rank`` (every class) is the rank of a many-rank run the failure happened on, None in one
process; ``peer_abort`` (CaptureError) marks a capture abandoned because another rank failed.
Both are given when the error is built; nothing sets fields on an exception afterwards (a
many-rank run names the rank whose failure is its error itself: `sim.fabric.FabricStats`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol, Union

__all__ = [
    "AscendGraphError",
    "ConfigError",
    "XliteConfigError",
    "GraphModeError",
    "CaptureError",
    "StreamResourceExhausted",
    "OldHdkStack",
    "ResourceAllocFailed",
    "CaptureConstraintError",
    "GraphHang",
    "StaleGraphParams",
    "StreamOrderError",
    "DeviceLost",
    "NumericalMismatch",
    "DeviceUnavailable",
    "KernelContractError",
    "CollectiveError",
    "CollectiveMismatch",
    "CollectiveDeadlock",
    "CollectiveTimeout",
    "NoForwardContext",
    "CaptureNotAllowed",
    "GraphParamsNotSet",
    "OutOfKVBlocks",
    "XliteBudgetExceeded",
    "RedispatchFailed",
    "RayTaskFailed",
    "ScenarioError",
    "UnreadableLog",
    "CliUsageError",
    "StdoutWriteError",
    "ScenarioFailed",
    "Terminated",
    "CaptureContext",
    "classify_capture_error",
    "rewrite_capture_error",
    "OOM_DURING_CAPTURE_GUIDANCE",
]


# What to do about an out-of-memory error while graphs are captured (`diagnose` and the run report).
OOM_DURING_CAPTURE_GUIDANCE = (
    "Device memory ran out while graphs were being captured: the graph pool is filled after the KV "
    "cache has taken its share. Leave more room (a lower gpu_memory_utilization), capture fewer sizes "
    "or lower max_cudagraph_capture_size, or capture decode batches only (FULL_DECODE_ONLY)."
)


class AscendGraphError(Exception):
    """Base: every exception ascendgraph defines derives from it (`Terminated` aside).

    ``rank``: the rank of a many-rank run (docs/ranks.md) the failure happened on; None in a
    one-process run.
    """

    def __init__(self, *args: object, rank: Optional[int] = None) -> None:
        super().__init__(*args)
        self.rank = rank


# --------------------------------------------------------------------------- config


class ConfigError(AscendGraphError, ValueError):
    """A bad configuration or flag value. The message names the key, the value and the fix."""

    def __init__(self, message: str, *, key: Optional[str] = None, rank: Optional[int] = None) -> None:
        super().__init__(message, rank=rank)
        self.key = key


class XliteConfigError(ConfigError, RuntimeError):
    """XliteGraph validation failure (docs/semantics.md §11 texts)."""


class GraphModeError(AscendGraphError, ValueError):
    """An impossible graph mode (attention narrowing with a NEVER backend, ...)."""


# --------------------------------------------------------------------------- capture


class CaptureError(AscendGraphError, RuntimeError):
    """Base of failures that happen while capturing an ACL graph.

    The planner's numbers are attached when known, so a user (or `ascendgraph diagnose`)
    can see how far capture got: ``graphs_captured``, ``streams_in_use``, ``stream_budget``.
    ``peer_abort``: this rank captured fine but gave up because another rank failed (the
    agreed capture outcome of docs/ranks.md); the run's error is the original failure.
    """

    def __init__(
        self,
        message: str,
        *,
        graphs_captured: Optional[int] = None,
        streams_in_use: Optional[int] = None,
        stream_budget: Optional[int] = None,
        peer_abort: bool = False,
        rank: Optional[int] = None,
    ) -> None:
        super().__init__(message, rank=rank)
        self.graphs_captured = graphs_captured
        self.streams_in_use = streams_in_use
        self.stream_budget = stream_budget
        self.peer_abort = peer_abort


class StreamResourceExhausted(CaptureError):
    """The stack ran out of streams while capturing (207008 stream signature)."""


class OldHdkStack(CaptureError):
    """An old HDK/CANN stack refused to allocate a stream (`Alloc sq cq fail`)."""


class ResourceAllocFailed(CaptureError):
    """The runtime could not allocate a resource during capture (207005)."""


class CaptureConstraintError(CaptureError):
    """A device graph constraint was broken (docs/semantics.md §12): wrong stream, host sync, ..."""


class GraphHang(AscendGraphError, RuntimeError):
    """A replay waits on an external event that nothing will record."""


class StaleGraphParams(AscendGraphError, RuntimeError):
    """A FULL replay executed an attention task group without a task update since that
    replay began (docs/decisions.md "Stale FULL-graph parameters"): its attention ran with an earlier batch's parameters.
    Raised by the device (the simulator with ``require_task_updates=True``, the default)."""


class StreamOrderError(AscendGraphError, RuntimeError):
    """Device work the host issued on two streams (or the host and a stream) is not ordered, and a
    card may run it the wrong way round: a task update before the earlier replay that still runs its
    group, a host access to a buffer a queued non-blocking copy has not filled or read yet. Raised by
    the simulator's stream queues (``sim.queues``) when the work is issued."""


class DeviceLost(AscendGraphError, RuntimeError):
    """The device stopped answering (injected on the simulator)."""


class NumericalMismatch(AscendGraphError, RuntimeError):
    """A served step differs from the eager reference beyond tolerance."""


class KernelContractError(AscendGraphError, RuntimeError):
    """A kernel call breaks a rule of `ascendgraph.kernel_contracts` (what an NPU would refuse).

    ``kernel`` is the torch_npu kernel (or ``ascendgraph::<op>``) and ``rules`` the ids of
    the broken rules; the message names the values and each rule's source.
    """

    def __init__(self, message: str, *, kernel: str = "", rules: tuple[str, ...] = (),
                 rank: Optional[int] = None) -> None:
        super().__init__(message, rank=rank)
        self.kernel = kernel
        self.rules = rules


class DeviceUnavailable(AscendGraphError, RuntimeError):
    """The requested device backend cannot be used here; the message says why."""


# --------------------------------------------------------------------------- many ranks (docs/ranks.md)


class CollectiveError(AscendGraphError, RuntimeError):
    """Base of what the in-process collective fabric (sim.fabric) detects between ranks.

    ``ranks`` are the ranks involved; ``flight_record`` is the per-rank report (pending
    fingerprint and last collectives, as torch's NCCL flight recorder dumps), also in the
    message; ``rules`` the ids of the broken compatibility rules (mismatches).
    """

    def __init__(self, message: str, *, ranks: tuple[int, ...] = (), flight_record: Optional[dict] = None,
                 rules: tuple[str, ...] = (), rank: Optional[int] = None) -> None:
        super().__init__(message, rank=rank)
        self.ranks = ranks
        self.flight_record = flight_record or {}
        self.rules = rules


class CollectiveMismatch(CollectiveError):
    """The ranks of one meeting point brought incompatible fingerprints (op, shape, dtype,
    graph vs eager, graph key, MC2 token counts), or disagreed after a DP sync."""


class CollectiveDeadlock(CollectiveError):
    """Every live rank is blocked in a collective and no group can complete."""


class CollectiveTimeout(CollectiveError):
    """Ranks waited in a collective past HCCL's execution timeout; ``straggler`` is the rank
    that arrived last (or never)."""

    def __init__(self, message: str, *, straggler: int = -1, **kwargs: object) -> None:
        super().__init__(message, **kwargs)  # type: ignore[arg-type]  # the keyword arguments are CollectiveError's (ranks, flight_record, rules, rank)
        self.straggler = straggler


# --------------------------------------------------------------------------- broken runtime invariants


class NoForwardContext(AscendGraphError, RuntimeError):
    """An attention op or graph wrapper ran outside `set_forward_context`."""


class CaptureNotAllowed(AscendGraphError, RuntimeError):
    """A wrapper met a batch descriptor it has no graph for outside the capture phase."""


class GraphParamsNotSet(AscendGraphError, RuntimeError):
    """A FULL capture or update ran before `GraphParams.set_sizes`."""


class OutOfKVBlocks(AscendGraphError, RuntimeError):
    """The KV cache has no free block left (the engine sizes it so this cannot happen)."""


class RedispatchFailed(AscendGraphError, RuntimeError):
    """The re-dispatch at the agreed size found no graph of the synced mode: vLLM's dispatcher
    asserts there (``assert CUDAGraphMode.NONE in allowed_modes``, vllm/v1/cudagraph_dispatcher.py
    in 0.27.1) and the rank stops (ascendgraph.parallel.coordination)."""


class RayTaskFailed(AscendGraphError, RuntimeError):
    """A scenario's Ray task did not come back (a worker or node lost): the run failed (exit 1)."""


class XliteBudgetExceeded(AscendGraphError, AssertionError):
    """A batch over the xlite budget reached the runtime: the router should have sent it native."""


# --------------------------------------------------------------------------- tools and the command line


class ScenarioError(ConfigError):
    """A bad scenario file: the message names the file, the key and what was expected."""

    def __init__(self, path: Union[str, Path], key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}", key=key)
        self.path = str(path)


class UnreadableLog(ConfigError):
    """The log file (or standard input) cannot be read."""


class CliUsageError(AscendGraphError):
    """Bad flags: reported on one line with exit code 2."""


class StdoutWriteError(AscendGraphError, OSError):
    """Writing the command's results to stdout failed (a full disk, a closed descriptor, a
    reader that left without reading): the console script reports it on one line, exit 1.
    Built from the OSError the write raised (its ``errno`` and ``strerror``), which is its
    ``__cause__``."""


class _Explained(Protocol):
    def explain(self) -> str: ...


class ScenarioFailed(AscendGraphError):
    """The scenario ran and missed its expectation (``result``, a ScenarioResult, explains how)."""

    def __init__(self, result: _Explained) -> None:
        super().__init__(result.explain())
        self.result = result


class Terminated(BaseException):
    """SIGTERM received while a command ran: raised so that every ``finally`` block (temporary
    outputs, staging folders) runs before the command exits 143."""


# --------------------------------------------------------------------------- texts
# Verbatim strings from vLLM / vLLM Ascend / torch_npu (docs/semantics.md §8). Do not reword.

OLD_HDK_GUIDANCE = (
    "ACL graph capture failed with an old Ascend HDK/CANN stack signature (`Alloc sq cq fail`). "
    "Please upgrade Ascend HDK to 25.5.1 or later and use the matching CANN stack."
)
STREAM_EXHAUSTION_GUIDANCE = (
    "ACL graph capture failed with a known stream-resource exhaustion signature. "
    "Consider reducing cudagraph_capture_sizes, lowering max_cudagraph_capture_size, "
    "preferring FULL or FULL_DECODE_ONLY for mostly uniform decode workloads, or temporarily "
    "disabling graph mode to confirm the failure is capture-related."
)
# Our own guidance: vLLM Ascend re-raises 207005 unexplained.
RESOURCE_ALLOC_GUIDANCE = (
    "ACL graph capture failed because the runtime could not allocate a resource "
    "(207005 / `resource alloc fail`). The graph pool or the runtime's task resources ran out "
    "while capturing. Consider reducing cudagraph_capture_sizes or max_cudagraph_capture_size, "
    "leaving more device memory free for the graph pool (a lower gpu_memory_utilization), or "
    "temporarily disabling graph mode to confirm the failure is capture-related."
)

LAUNCH_BLOCKING_MESSAGE = (
    "ACL graph is incompatible with ASCEND_LAUNCH_BLOCKING=1. "
    "Please unset ASCEND_LAUNCH_BLOCKING or set it to 0. If you "
    "need ASCEND_LAUNCH_BLOCKING for debugging, consider other methods — "
    "for example, check the plog files (default: $HOME/ascend/log/debug) "
    "for more information about runtime errors."
)

# torch_npu graph constraints (docs/semantics.md §12).
DEFAULT_STREAM_CAPTURE = (
    "NPU graphs must be captured on a non-default stream. "
    "(However, after capture, it's ok to replay them on the default stream.)"
)
GRAPH_ALREADY_CAPTURED = (
    "This NPUGraph instance already owns a captured graph. "
    "To capture a new graph, create a new instance."
)
CAPTURE_END_OTHER_STREAM = "Capture must end on the same stream it began on."
CAPTURE_END_BEFORE_BEGIN = "capture_end() called before capture_begin()."
REPLAY_BEFORE_CAPTURE = "Called NPUGraph::replay without a preceding successful capture."
POOL_BEFORE_CAPTURE = "Called NPUGraph::pool() without a preceding successful capture."
UNKNOWN_CAPTURE_ERROR_MODE = (
    "Unknown capture error mode. Expected `global`, `thread_local`, or `relaxed`, got {mode}"
)
TASK_QUEUE_2_DURING_CAPTURE = (
    "Do not support TASK_QUEUE_ENABLE = 2 during NPU graph capture, "
    "please export TASK_QUEUE_ENABLE=1/0."
)
ADDRESS_MISMATCH = "Input addresses for aclgraphs are different during replay. Expected {expected}, got {got}"
GRAPH_PARAMS_ALREADY_SET = "Graph parameters have already been set!"

# Real runtime texts the simulator reproduces (docs/semantics.md §8).
TEXT_207008_CAPTURE_BEGIN = (
    "NPU function error: c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), "
    "error code is 207008"
)
TEXT_STREAMS_INSUFFICIENT = "[Error]: Stream resources are insufficient."
TEXT_EL0009 = "Insufficient_Stream_Resources(EL0009): The stream resources are insufficient."
TEXT_ALLOC_SQ_CQ = "[SqCqManage]Alloc sq cq fail, stream_id={stream_id}, retCode=0x7020023"
TEXT_207005 = (
    "NPU function error: c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), "
    "error code is 207005\n[Error]: resource alloc fail."
)
# torch_npu's caching-allocator OOM opens with this (raised as torch.OutOfMemoryError).
TEXT_NPU_OOM = "NPU out of memory. Tried to allocate {size}"

# Texts of our own, for conditions torch_npu leaves to the ACL runtime (whose codes and
# wording are CANN-dependent: 107027 "stream is captured", ...). The simulator raises them;
# tools and tests match on them. Hardware runs assert the error type only.
CONCURRENT_CAPTURE = (
    "Another NPU graph capture ({other}) is already in progress on this device; only one capture "
    "at a time is supported. End it with capture_end() (or leave its graph() block) before "
    "beginning a new one."
)
HOST_SYNC_DURING_CAPTURE = (
    "{what} synchronizes with the host, which is not allowed while a stream is captured (NPU graph "
    "capture of {graph}). Compute the value before capture, keep it on the device, or move this "
    "call outside the captured region."
)
DYNAMIC_SHAPE_DURING_CAPTURE = (
    "{what} has a data-dependent output shape, which needs a host synchronization and cannot be "
    "captured in an NPU graph ({graph}). Use a fixed-shape formulation (masks, padding) inside "
    "the captured region."
)
RNG_DURING_CAPTURE = (
    "{what} draws random numbers during NPU graph capture of {graph}; npugraph_ex does not capture "
    "RNG ops, so the simulator rejects them. Draw the numbers outside the captured region, or "
    "create the device with allow_rng_in_capture=True to allow graph-safe RNG."
)
METADATA_CHANGE_DURING_CAPTURE = (
    "{what} changes the shape, strides or storage of an existing tensor during NPU graph capture "
    "of {graph}; the graph would replay against stale metadata. Use the out-of-place form "
    "(e.g. t() instead of t_()) inside the captured region."
)
GRAPH_HANG_REPLAY = (
    "replay of {graph} is waiting on {event}, which nothing has recorded: the graph would hang on "
    "the device. Record the event (after the task updates of a FULL graph) before synchronizing."
)
GRAPH_HANG_STREAM = (
    "{stream} is waiting on {event}, which nothing has recorded: the stream would hang on the "
    "device. Record the event before synchronizing."
)
RECORD_BEHIND_ITS_WAIT = (
    "{event} is recorded on {stream}, which is blocked by {blocked_by} waiting on that same event: "
    "the record queues behind the wait and the stream would hang on the device. Record the event on "
    "another stream (the one that issued the task updates)."
)
EVENT_RECORDED_BEFORE_CONSUMED = (
    "{event} is recorded on {stream} ({what}) while nothing orders it after {consumer} on {consumer_stream}, which "
    "consumes the event's previous record with its wait and reset: a card runs behind the host, so this record can "
    "land before that wait and reset, the earlier record is lost and the next replay waits on {event} for ever. "
    "Synchronize {consumer_stream} before launching the next replay (vLLM Ascend synchronizes the current stream "
    "before every FULL replay: compilation/acl_graph.py@182b75ea:253-266)."
)
UPDATE_BEFORE_REPLAY = (
    "task update of {group} on {stream} ({what}) is not ordered after {replay} on {replay_stream}, which may not have "
    "run that group yet: a card runs behind the host, so the update can land first and {replay} runs the group with "
    "the next step's parameters (and the event record that follows the update is lost: the next replay hangs). "
    "Synchronize {replay_stream} before launching the next replay (vLLM Ascend: compilation/acl_graph.py@182b75ea:253-266)."
)
HOST_ACCESS_BEFORE_COPY = (
    "{what} {access} host memory that {copy} on {stream} {role}, and nothing waited for that copy: a card runs behind "
    "the host, so the copy may not have run yet. Synchronize {stream}, or an event recorded after the copy, before "
    "touching the buffer."
)
EXTERNAL_EVENT_NOT_RESET = (
    "simulator strictness: {event} was recorded again without reset(); a card raises nothing, the "
    "event simply stays set, so the next replay's wait passes before its task update and the graph "
    "runs with stale parameters. An ExternalEvent must be reset before it is reused (call "
    "event.reset(stream) after the wait it released)."
)
TASK_UPDATE_MISMATCH = (
    "task update of {group} does not match its capture: {detail}. The update must re-issue the "
    "same ops, in the same order, as the task group captured."
)
TASK_GROUP_MISUSE = "{what}: {detail}"
TASK_GROUP_NOT_A_KERNEL = (
    "{what} inside {group} (capture of {graph}): only single-operator kernel tasks may sit between "
    "graph_task_group_begin and graph_task_group_end. {fix}"
)
STALE_GRAPH_PARAMS = (
    "stale graph parameters: replay {replay} of {graph} executed {group} ({op}) without a task "
    "update since that replay began, so its attention ran with the sequence lengths of an earlier "
    "batch. Update every attention task group after each FULL replay (graph_task_update_begin, "
    "re-issue the kernel, graph_task_update_end) before recording its ExternalEvent."
)
TEXT_DEVICE_LOST = (
    "device lost: the NPU stopped responding (at {site}). Every later call on this device fails; "
    "create a new device."
)


# --------------------------------------------------------------------------- rewriter


@dataclass(frozen=True)
class CaptureContext:
    """What the engine knows at the moment a capture failed (attached to the typed error)."""

    graphs_captured: Optional[int] = None
    streams_in_use: Optional[int] = None
    stream_budget: Optional[int] = None


# Signature table, in priority order: (error class, guidance, predicate over (original, lower)).
def _is_old_hdk(original: str, lower: str) -> bool:
    return "alloc sq cq fail" in lower


def _is_stream_exhaustion(original: str, lower: str) -> bool:
    if "insufficient_stream_resources" in lower or "stream resources are insufficient" in lower:
        return True
    return "207008" in original and "stream resource" in lower


def _is_resource_alloc(original: str, lower: str) -> bool:
    return "207005" in original or "resource alloc fail" in lower


CAPTURE_ERROR_SIGNATURES: tuple[tuple[str, type[CaptureError], str, object], ...] = (
    ("old_hdk", OldHdkStack, OLD_HDK_GUIDANCE, _is_old_hdk),
    ("stream_exhaustion", StreamResourceExhausted, STREAM_EXHAUSTION_GUIDANCE, _is_stream_exhaustion),
    ("resource_alloc", ResourceAllocFailed, RESOURCE_ALLOC_GUIDANCE, _is_resource_alloc),
)


def classify_capture_error(message: str) -> Optional[tuple[str, type[CaptureError], str]]:
    """Return (signature name, error class, guidance) for a capture failure text, or None."""
    lower = message.lower()
    for name, cls, guidance, predicate in CAPTURE_ERROR_SIGNATURES:
        if predicate(message, lower):  # type: ignore[operator]  # a signature table mixes text and callable predicates; only callables reach here
            return name, cls, guidance
    return None


_REWRITTEN = (OldHdkStack, StreamResourceExhausted, ResourceAllocFailed)


def rewrite_capture_error(
    exc: BaseException, context: Optional[CaptureContext] = None
) -> BaseException:
    """Turn a capture-time RuntimeError into a typed error carrying its guidance.

    Returns the new exception with ``__cause__`` set to the original (the caller raises
    it), or ``exc`` itself when it is not a RuntimeError, does not match a known signature,
    or was already rewritten.
    """
    if isinstance(exc, _REWRITTEN) or not isinstance(exc, RuntimeError):
        return exc
    original = str(exc)
    found = classify_capture_error(original)
    if found is None:
        return exc
    _, cls, guidance = found
    ctx = context or CaptureContext()
    new = cls(
        f"{guidance}\nOriginal error:\n{original}",
        graphs_captured=ctx.graphs_captured,
        streams_in_use=ctx.streams_in_use,
        stream_budget=ctx.stream_budget,
    )
    new.__cause__ = exc
    return new
