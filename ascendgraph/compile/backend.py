"""The ascendgraph torch.compile backend and the compiled model.

Theory of operation. `CompiledModel` compiles ``model(input_ids, positions)`` once with
Dynamo (num_tokens is the dynamic dimension; host attention metadata stays out of the
graph inputs, so one compilation serves every batch size) and hands the FX graph to an
`AscendGraphBackend`, which:

1. lowers it to aten with aot_autograd (patterns match aten-level graphs);
2. undoes the functionalisation of the attention op's ``out=`` (`lowering`);
3. runs the `PassManager` (empty here; npugraph_ex / fusion passes plug in per mode);
4. for piecewise modes, splits at attention (`split`) and wraps each of the L + 1 pieces
   between attentions in a PIECEWISE `GraphWrapper` (attention runs eagerly between them);
5. for modes with full graphs, wraps the whole (possibly split) graph in a FULL wrapper.

The wrappers sit *inside* the callable Dynamo runs — a recording dispatch mode around a
compiled call would make Dynamo skip the frame and run plain eager Python.

Each `CompiledModel` compiles a function with its own code object, so two engines in one
process never share Dynamo cache entries (guards do not tell two models of one class
apart when parameters are graph inputs, and the second engine would silently reuse the
first engine's graphs).
"""

from __future__ import annotations

import itertools
import logging
import time
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence, cast

import torch
from torch import fx
from torch._ops import OpOverload

from ascendgraph.compile.graph_wrapper import CaptureState, GraphOptions, GraphWrapper
from ascendgraph.compile.lowering import restore_out_mutations
from ascendgraph.compile.cache import TracedGraph, parse_source
from ascendgraph.compile.pass_manager import PassManager, PassRun
from ascendgraph.compile.split import SplitGraph, split_at_attention
from ascendgraph.models.attention import attention_op
from ascendgraph.modes import GraphMode

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.compile.cache import CompileCache

__all__ = ["AscendGraphBackend", "CompiledArtifact", "CompiledModel", "ATTENTION_SPLITTING_OPS"]

log = logging.getLogger(__name__)

ATTENTION_SPLITTING_OPS: tuple[OpOverload, ...] = (attention_op._opoverload,)

_compile_ids = itertools.count()


@dataclass
class CompiledArtifact:
    """What one backend invocation produced (Dynamo may invoke the backend more than once)."""

    aten_graph: fx.GraphModule
    split: Optional[SplitGraph]
    runnable: Callable[..., Any]
    pass_run: PassRun
    piecewise_wrappers: list[GraphWrapper] = field(default_factory=list)
    full_wrapper: Optional[GraphWrapper] = None
    seconds: float = 0.0

    @property
    def num_pieces(self) -> int:
        """Captured pieces per size (num_hidden_layers + 1 when split, else 0)."""
        return len(self.piecewise_wrappers)


class AscendGraphBackend:
    """A torch.compile backend: aten lowering, passes, piecewise split, graph wrappers."""

    def __init__(
        self,
        *,
        mode: GraphMode,
        attention_split: bool,
        capture_state: CaptureState,
        pass_manager: Optional[PassManager] = None,
        splitting_ops: Sequence[OpOverload] = ATTENTION_SPLITTING_OPS,
        debug: bool = False,
    ) -> None:
        self.mode = GraphMode.parse(mode)
        self.attention_split = attention_split
        self.capture_state = capture_state
        self.pass_manager = pass_manager if pass_manager is not None else PassManager()
        self.splitting_ops = tuple(splitting_ops)
        self.debug = debug
        self.artifacts: list[CompiledArtifact] = []
        # Set by `CompiledModel` when traced graphs may be kept (`ascendgraph.compile.cache`):
        # called with the traced graph of the first compilation that needs no runtime wrapper.
        self.on_traced: Optional[Callable[[TracedGraph], None]] = None

    def __call__(self, graph_module: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._functorch.aot_autograd import aot_module_simplified

        sources = _dynamo_sources(graph_module) if self.on_traced is not None and not self.artifacts else None

        def fw_compiler(aten_graph: fx.GraphModule, aten_inputs: list[Any]) -> Callable[..., Any]:
            runnable = self._compile_aten(aten_graph, aten_inputs)
            if sources is not None and self.on_traced is not None and _needs_no_runtime_wrapper(aten_inputs, sources):
                self.on_traced(TracedGraph(aten_graph, tuple(sources), dict(self.artifacts[-1].pass_run.matches),
                                           self.pass_manager.reader_state()))
            return runnable

        return aot_module_simplified(graph_module, example_inputs, fw_compiler=fw_compiler)  # type: ignore[arg-type]  # torch's AOTDispatchCompiler protocol names its parameters differently; called positionally

    def wrap_traced(self, traced: TracedGraph, seconds: float) -> Callable[..., Any]:
        """Split and wrap a graph from the compile cache (lowered and passed already): what
        `_compile_aten` does after the passes, the graph readers handed what they read of it
        (the static-kernel build). Counts as the pass manager's cache hit. ValueError, before
        anything is changed, when the entry keeps nothing usable for a graph reader."""
        self.pass_manager.read_cached(traced.readers)
        run = PassRun(matches=dict(traced.matches), seconds=seconds)
        self.pass_manager.runs.append(run)
        self.pass_manager.cache_status = "hit"
        return self._wrap(traced.module, run, time.perf_counter() - seconds)

    def _compile_aten(self, graph_module: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        start = time.perf_counter()
        restore_out_mutations(graph_module, self.splitting_ops)
        pass_run = self.pass_manager(graph_module)
        return self._wrap(graph_module, pass_run, start)

    def _wrap(self, graph_module: fx.GraphModule, pass_run: PassRun, start: float) -> Callable[..., Any]:
        runnable: Callable[..., Any] = graph_module
        split: Optional[SplitGraph] = None
        piecewise: list[GraphWrapper] = []
        if self.attention_split:
            split = split_at_attention(graph_module, self.splitting_ops)
            names = split.piecewise_submodules
            for index, name in enumerate(names):
                wrapper = GraphWrapper(
                    getattr(split.module, name),
                    GraphMode.PIECEWISE,
                    self.capture_state,
                    options=GraphOptions(
                        gc_disable=index != 0,
                        weak_ref_output=index == len(names) - 1,
                        debug=self.debug,
                        label=f"piece {index + 1}/{len(names)} ({name})",
                    ),
                )
                # Shadow the registered submodule: the split graph calls self.<name>(...).
                split.module.__dict__[name] = wrapper
                piecewise.append(wrapper)
            runnable = split.module
        full: Optional[GraphWrapper] = None
        if self.mode.has_full_graphs():
            full = GraphWrapper(
                runnable, GraphMode.FULL, self.capture_state, options=GraphOptions(debug=self.debug, label="full model")
            )
            runnable = full
        artifact = CompiledArtifact(
            aten_graph=graph_module,
            split=split,
            runnable=runnable,
            pass_run=pass_run,
            piecewise_wrappers=piecewise,
            full_wrapper=full,
            seconds=time.perf_counter() - start,
        )
        self.artifacts.append(artifact)
        log.debug(
            "compiled graph %d: %d nodes, %s, %.3fs",
            len(self.artifacts),
            len(graph_module.graph.nodes),
            f"{len(piecewise)} piecewise pieces" if split else "not split",
            artifact.seconds,
        )
        return runnable


def _dynamo_sources(graph_module: fx.GraphModule) -> Optional[list[str]]:
    """The source of every input of a Dynamo graph, if all are the model's parameters and
    buffers, the inputs or their sizes, and the graph returns one tensor; else None."""
    sources: list[str] = []
    for node in graph_module.graph.nodes:
        if node.op != "placeholder":
            continue
        grapharg = node.meta.get("grapharg")
        source = getattr(getattr(grapharg, "source", None), "name", None)
        if not isinstance(source, str):
            return None
        try:
            parse_source(source)
        except ValueError:
            return None
        sources.append(source)
    outputs = graph_module.graph.output_node().args[0]
    if not (isinstance(outputs, (tuple, list)) and len(outputs) == 1 and isinstance(outputs[0], fx.Node)):
        return None
    return sources


def _needs_no_runtime_wrapper(aten_inputs: list[Any], sources: list[str]) -> bool:
    """aot_autograd's runtime wrapper does nothing the cached call would skip: one aten input
    per Dynamo input (no deduplication, no lifted parameters), no input mutated, no token, and
    every output fresh (no alias of an input or of another output)."""
    from torch._functorch._aot_autograd.schemas import OutputType
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    metadata = getattr(context, "fw_metadata", None)
    if metadata is None or len(aten_inputs) != len(sources):
        return False
    if any(info.mutates_data or info.mutates_metadata for info in metadata.input_info):
        return False
    if metadata.tokens or len(metadata.output_info) != 1:
        return False
    return all(info.output_type == OutputType.non_alias for info in metadata.output_info)


def _model_forward(model: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor) -> Any:
    return model(input_ids, positions)


def _fresh_function(function: types.FunctionType, tag: str) -> types.FunctionType:
    """A copy of ``function`` with its own code object (its own Dynamo cache)."""
    code = function.__code__.replace(co_name=f"{function.__code__.co_name}_{tag}")
    return types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)


class CompiledModel:
    """``model(input_ids, positions)`` compiled with an `AscendGraphBackend` (or eager when None).

    With a ``traced_key`` (`ascendgraph.compile.cache.traced_key`) and a cache, the first call
    looks for a traced entry: on a hit the cached graph is split and wrapped and called with the
    inputs its sources name — Dynamo and aot_autograd never run (``traced_cache`` "hit"); on a
    miss the model is compiled with Dynamo and the traced graph is stored ("miss")."""

    def __init__(self, model: torch.nn.Module, backend: Optional[AscendGraphBackend], *,
                 traced_key: Optional[str] = None, cache: Optional["CompileCache"] = None) -> None:
        self.model = model
        self.backend = backend
        self.compile_seconds = 0.0
        self.traced_key = traced_key if backend is not None else None
        self.cache = cache
        self.traced_cache = "off" if self.traced_key is None else "unread"  # unread | hit | miss | off
        self._compiled: Optional[Callable[..., Any]] = None
        self._cached_call: Optional[Callable[..., Any]] = None
        self._cached_sources: tuple[Any, ...] = ()
        if backend is not None and self.traced_key is None:
            self._compile_with_dynamo()

    def _compile_with_dynamo(self) -> None:
        assert self.backend is not None
        forward = _fresh_function(cast(types.FunctionType, _model_forward), f"engine{next(_compile_ids)}")
        self._compiled = torch.compile(forward, backend=self.backend, fullgraph=True, dynamic=False)

    @property
    def is_compiled(self) -> bool:
        return self.backend is not None

    def _first_call(self) -> None:
        """Read the traced entry (hit: wrap it; miss: compile with Dynamo and store what it traces)."""
        from ascendgraph.compile.cache import CompileCache, load_traced, parse_source, store_traced

        assert self.backend is not None and self.traced_key is not None
        start = time.perf_counter()
        cache = self.cache if self.cache is not None else CompileCache()
        traced = load_traced(cache, self.traced_key)
        if traced is not None:
            try:
                call = self.backend.wrap_traced(traced, time.perf_counter() - start)
            except ValueError as exc:  # what a graph reader needs is not in the entry: trace instead
                log.warning("compile cache: traced graph %s not used (%s); tracing instead", self.traced_key[:12], exc)
            else:
                self._cached_sources = tuple(parse_source(s) for s in traced.sources)
                self._cached_call = call
                self.traced_cache = "hit"
                self.compile_seconds += time.perf_counter() - start
                log.debug("compile cache: traced graph %s hit", self.traced_key[:12])
                return
        self.traced_cache = "miss"
        key = self.traced_key
        self.backend.on_traced = lambda graph: None if store_traced(cache, key, graph) else None
        self._compile_with_dynamo()

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Inference only: a grad-mode change would also invalidate Dynamo's guards.
        with torch.no_grad():
            if self.backend is None:
                return self.model(input_ids, positions)
            if self.traced_cache == "unread":
                self._first_call()
            if self._cached_call is not None:
                from ascendgraph.compile.cache import resolve_source

                roots = {"model": self.model, "input_ids": input_ids, "positions": positions}
                return self._cached_call(*[resolve_source(s, roots) for s in self._cached_sources])[0]
            assert self._compiled is not None
            # Unbacked: no size hint to specialise on, so num_tokens == 1 does not force a
            # second compilation (a backed dynamic size is re-specialised for 0 and 1).
            torch._dynamo.decorators.mark_unbacked(input_ids, 0)
            torch._dynamo.decorators.mark_unbacked(positions, 0)
            first = not self.backend.artifacts
            start = time.perf_counter()
            if not first:
                return self._compiled(self.model, input_ids, positions)
            # Dynamo ends each compilation with a collection of the young and middle generations
            # (torch/_dynamo/convert_frame.py `_compile`, config ``run_gc_after_compile``): it
            # walked every object that survived since the process froze torch's import (the
            # run's middle generation collects rarely: ascendgraph/caller_state.py), 0.1-0.15 s,
            # to free the compilation's garbage a few moments earlier.
            with torch._dynamo.config.patch(run_gc_after_compile=False):
                output = self._compiled(self.model, input_ids, positions)
            self.compile_seconds += time.perf_counter() - start
            return output
