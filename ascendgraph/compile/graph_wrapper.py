"""ACL graph capture and replay per batch descriptor (docs/semantics.md §6), and capture errors (§8).

Theory of operation. A `GraphWrapper` wraps one runnable (a piecewise submodule, or the
whole model) for one runtime mode, PIECEWISE or FULL. On every call it reads the forward
context:

    runtime mode NONE, or not this wrapper's mode  -> call the runnable directly
    descriptor never seen                           -> CAPTURE (only while capture is allowed)
    descriptor captured                             -> REPLAY

so a FULL wrapper can enclose PIECEWISE wrappers (FULL_AND_PIECEWISE): whichever mode the
dispatcher chose does the capture, the other passes through. Per descriptor the state
goes ``absent -> captured`` on a successful capture and back to ``absent`` when the
engine releases everything (`CaptureState.release`); a failed capture leaves nothing
behind (the graph is reset, FULL-graph parameters recorded for it are discarded).

Capture: remember the tensor inputs' addresses, take a new device graph, optionally
make ``gc.collect`` and ``device.empty_cache`` no-ops (every piecewise graph but the first
piece of a size: the device's graph context calls them on entry, which is slow and
pointless between pieces), record inside ``device.graph(g, pool=<the engine's shared pool>)``,
keep a *weak* reference to the output and return the strong one. A RuntimeError raised
during capture is rewritten by `ascendgraph.errors.rewrite_capture_error` into a typed
error carrying the guidance and the numbers the planner knows (graphs captured so far,
streams in use, the budget) — and raised.

Replay: in debug mode check that the tensor inputs sit at the captured addresses (the
verbatim vLLM Ascend message); FULL wrappers synchronise the current stream first (the
previous replay's parameter update must not race the next one); replay; return the
stored output — whose storage the replay just refreshed.

Warm-up runs are the engine's job, not the wrapper's.
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ContextManager, Iterator, Optional

import torch

from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import ADDRESS_MISMATCH, CaptureContext, CaptureNotAllowed, rewrite_capture_error
from ascendgraph.forward_context import FullGraphParams, current_forward_context
from ascendgraph.modes import GraphMode

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.device import Device, Graph, PoolHandle

__all__ = [
    "GraphOptions",
    "GraphEntry",
    "CaptureState",
    "GraphWrapper",
    "CaptureNotAllowed",
    "weak_ref_tensors",
    "input_addresses",
]

log = logging.getLogger(__name__)

GRAPH_KIND = {GraphMode.PIECEWISE: "piecewise", GraphMode.FULL: "full"}


@dataclass(frozen=True)
class GraphOptions:
    """Per-wrapper capture options (vLLM's CUDAGraphOptions)."""

    gc_disable: bool = False  # gc.collect / empty_cache are no-ops during this wrapper's captures
    weak_ref_output: bool = False  # also hand back weak references from capture (the last piece)
    debug: bool = False  # check input addresses at every replay
    label: str = ""  # names the wrapper in logs and errors


@dataclass
class GraphEntry:
    """One captured graph: its key, the device graph, the (weak) output and the input addresses."""

    descriptor: BatchDescriptor
    graph: "Graph"
    output: Any
    input_addresses: list[int]
    replays: int = 0


@dataclass
class CaptureState:
    """What all the graph wrappers of one engine share.

    ``allowed`` gates capture (the engine opens it for its capture phase only); ``pool``
    is the engine's graph memory pool, created on first use; ``graph_params`` are the
    engine's FULL-graph parameters, whose records for a failed capture are discarded.
    """

    device: "Device"
    allowed: bool = False
    debug: bool = False
    stream_budget: Optional[int] = None
    graph_params: Optional[FullGraphParams] = None
    graphs_captured: int = 0
    pool: Optional["PoolHandle"] = None
    wrappers: list["GraphWrapper"] = field(default_factory=list)
    # Called after every successful capture with (wrapper, entry): the place for post-capture
    # graph optimisations (e.g. super kernel on FULL graphs).
    after_capture: list[Callable[["GraphWrapper", "GraphEntry"], None]] = field(default_factory=list)
    # Opened inside every capture block, around the runnable, with the wrapper: the place for
    # capture-scoped device regions (e.g. super_kernel_scope around FULL captures).
    capture_scopes: list[Callable[["GraphWrapper"], ContextManager[Any]]] = field(default_factory=list)
    _graph_kind_supported: Optional[bool] = None

    def graph_pool(self) -> "PoolHandle":
        if self.pool is None:
            self.pool = self.device.graph_pool_handle()
        return self.pool

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        """Allow capture for the duration of the engine's capture phase."""
        previous = self.allowed
        self.allowed = True
        try:
            yield
        finally:
            self.allowed = previous

    def entries(self) -> list[GraphEntry]:
        return [entry for wrapper in self.wrappers for entry in wrapper.entries.values()]

    def release(self) -> int:
        """Reset every captured graph of every wrapper and drop the pool. Returns how many graphs."""
        released = 0
        for wrapper in self.wrappers:
            released += wrapper.release()
        self.pool = None
        if self.graph_params is not None:
            self.graph_params.clear()
        return released

    def graph_context(self, graph: "Graph", runtime_mode: GraphMode) -> Any:
        """``device.graph(graph, pool=...)``, passing ``graph_kind`` to devices that charge by kind."""
        device = self.device
        if self._graph_kind_supported is None:
            try:
                parameters = inspect.signature(device.graph).parameters
                self._graph_kind_supported = "graph_kind" in parameters or any(
                    p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
                )
            except (TypeError, ValueError):  # pragma: no cover - builtins without signatures
                self._graph_kind_supported = False
        if self._graph_kind_supported:
            return device.graph(graph, pool=self.graph_pool(), graph_kind=GRAPH_KIND[runtime_mode])
        return device.graph(graph, pool=self.graph_pool())


def input_addresses(args: tuple[Any, ...]) -> list[int]:
    return [arg.data_ptr() for arg in args if isinstance(arg, torch.Tensor)]


def weak_ref_tensors(device: "Device", value: Any) -> Any:
    """Weak references (``device.weak_ref``) to the tensors in a tensor / tuple / list."""
    if isinstance(value, torch.Tensor):
        return device.weak_ref(value)
    if isinstance(value, tuple):
        return tuple(weak_ref_tensors(device, v) for v in value)
    if isinstance(value, list):
        return [weak_ref_tensors(device, v) for v in value]
    return value


@contextlib.contextmanager
def _gc_and_empty_cache_disabled(device: "Device") -> Iterator[None]:
    """Make ``gc.collect`` and ``device.empty_cache`` no-ops (restored on exit)."""
    saved_collect = gc.collect
    try:
        had_own = "empty_cache" in vars(device)
    except TypeError:  # a device with __slots__ has no instance dictionary
        had_own = False
    saved_empty = device.empty_cache
    gc.collect = lambda generation=2: 0
    patched = False
    try:
        device.empty_cache = lambda: None  # type: ignore[method-assign]  # a no-op while capturing (vLLM's gc_disable)
        patched = True
    except AttributeError:  # a device with __slots__: leave it alone
        pass
    try:
        yield
    finally:
        gc.collect = saved_collect
        if patched:
            if had_own:
                device.empty_cache = saved_empty  # type: ignore[method-assign]  # restores the device's own method
            else:
                try:
                    del device.empty_cache
                except AttributeError:  # pragma: no cover
                    pass


def _synchronize_current_stream(device: "Device") -> None:
    stream = device.current_stream()
    synchronize: Optional[Callable[[], None]] = getattr(stream, "synchronize", None)
    if synchronize is not None:
        synchronize()
    else:
        device.synchronize()


class GraphWrapper:
    """ACLGraph capture/replay of one runnable in one runtime mode (PIECEWISE or FULL).

    The third argument is the device, or the `CaptureState` the wrappers of one engine
    share (its device, pool, capture gate and FULL-graph parameters). A wrapper given a
    bare device gets a state of its own in which capture is always allowed.
    """

    def __init__(
        self,
        runnable: Callable[..., Any],
        runtime_mode: GraphMode,
        device: "Device | CaptureState",
        *,
        options: GraphOptions = GraphOptions(),
    ) -> None:
        runtime_mode = GraphMode.parse(runtime_mode)
        if runtime_mode not in (GraphMode.PIECEWISE, GraphMode.FULL):
            raise ValueError(f"a GraphWrapper captures PIECEWISE or FULL graphs, not {runtime_mode.name}")
        state = device if isinstance(device, CaptureState) else CaptureState(device, allowed=True)
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.state = state
        self.options = options
        self.entries: dict[BatchDescriptor, GraphEntry] = {}
        state.wrappers.append(self)

    @property
    def device(self) -> "Device":
        return self.state.device

    def __repr__(self) -> str:
        return f"GraphWrapper({self.options.label or self.runnable!r}, {self.runtime_mode.name}, {len(self.entries)} graphs)"

    def __call__(self, *args: Any) -> Any:
        context = current_forward_context()
        if context is None or context.runtime_mode is not self.runtime_mode:
            return self.runnable(*args)
        descriptor = context.batch_descriptor
        entry = self.entries.get(descriptor)
        if entry is None:
            return self._capture(descriptor, args)
        return self._replay(entry, args)

    # -- capture -----------------------------------------------------------------------
    def _capture(self, descriptor: BatchDescriptor, args: tuple[Any, ...]) -> Any:
        state = self.state
        if not state.allowed:
            raise CaptureNotAllowed(
                f"{self.runtime_mode.name} graph for batch ({descriptor}) was never captured and capture is not "
                f"allowed outside the engine's capture phase ({self.options.label or 'wrapper'}); the dispatcher "
                "returned a key the engine did not capture — this is an ascendgraph bug, please report it"
            )
        addresses = input_addresses(args)
        device = self.device
        graph = device.new_graph()
        disable_gc = self.options.gc_disable
        try:
            # The outer stream context makes the caller's stream current again on every path,
            # also when the device's graph context fails to (torch_npu's graph.__exit__ skips
            # its stream restore when capture_end raises).
            with device.stream(device.current_stream()), (
                _gc_and_empty_cache_disabled(device) if disable_gc else contextlib.nullcontext()
            ):
                with state.graph_context(graph, self.runtime_mode), contextlib.ExitStack() as scopes:
                    for scope in state.capture_scopes:
                        scopes.enter_context(scope(self))
                    output = self.runnable(*args)
                    if self.options.weak_ref_output:
                        output = weak_ref_tensors(device, output)
        except BaseException as exc:
            self._discard_failed(graph, descriptor)
            if isinstance(exc, RuntimeError):
                rewritten = rewrite_capture_error(exc, self._capture_context())
                if rewritten is not exc:
                    raise rewritten from exc
            raise
        entry = GraphEntry(descriptor, graph, weak_ref_tensors(device, output), addresses)
        try:
            for hook in state.after_capture:
                hook(self, entry)
        except BaseException:
            self._discard_failed(graph, descriptor)
            raise
        if self.runtime_mode is GraphMode.FULL and state.graph_params is not None:
            state.graph_params.captured(descriptor)  # its workspaces are the graph's now: weak refs
        self.entries[descriptor] = entry
        state.graphs_captured += 1
        log.debug("captured %s graph %s for %s", self.runtime_mode.name, self.options.label, descriptor)
        return output

    def _capture_context(self) -> CaptureContext:
        try:
            stats = self.device.stats()
            streams_in_use: Optional[int] = stats.streams_in_use
            budget: Optional[int] = self.state.stream_budget if self.state.stream_budget is not None else stats.stream_limit
        except Exception:  # the device may be the thing that failed
            streams_in_use, budget = None, self.state.stream_budget
        return CaptureContext(
            graphs_captured=self.state.graphs_captured, streams_in_use=streams_in_use, stream_budget=budget
        )

    def _discard_failed(self, graph: "Graph", descriptor: BatchDescriptor) -> None:
        with contextlib.suppress(Exception):
            graph.reset()
        if self.runtime_mode is GraphMode.FULL and self.state.graph_params is not None:
            self.state.graph_params.discard(descriptor)

    # -- replay ------------------------------------------------------------------------
    def _replay(self, entry: GraphEntry, args: tuple[Any, ...]) -> Any:
        if self.options.debug or self.state.debug or log.isEnabledFor(logging.DEBUG):
            new_addresses = input_addresses(args)
            if new_addresses != entry.input_addresses:
                raise AssertionError(ADDRESS_MISMATCH.format(expected=entry.input_addresses, got=new_addresses))
        if self.runtime_mode is GraphMode.FULL:
            _synchronize_current_stream(self.device)
        entry.graph.replay()
        entry.replays += 1
        return entry.output

    # -- release -----------------------------------------------------------------------
    def release(self) -> int:
        """Reset this wrapper's graphs and forget them. Returns how many were released."""
        count = 0
        for entry in self.entries.values():
            with contextlib.suppress(Exception):
                entry.graph.reset()
            count += 1
        self.entries.clear()
        return count
