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
from typing import Any, Callable, Optional, Sequence

import torch
from torch import fx
from torch._ops import OpOverload

from ascendgraph.compile.graph_wrapper import CaptureState, GraphOptions, GraphWrapper
from ascendgraph.compile.lowering import restore_out_mutations
from ascendgraph.compile.pass_manager import PassManager, PassRun
from ascendgraph.compile.split import SplitGraph, split_at_attention
from ascendgraph.models.attention import attention_op
from ascendgraph.modes import GraphMode

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

    def __call__(self, graph_module: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        from torch._functorch.aot_autograd import aot_module_simplified

        return aot_module_simplified(graph_module, example_inputs, fw_compiler=self._compile_aten)

    def _compile_aten(self, graph_module: fx.GraphModule, example_inputs: list[Any]) -> Callable[..., Any]:
        start = time.perf_counter()
        restore_out_mutations(graph_module, self.splitting_ops)
        pass_run = self.pass_manager(graph_module)
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


def _model_forward(model: torch.nn.Module, input_ids: torch.Tensor, positions: torch.Tensor) -> Any:
    return model(input_ids, positions)


def _fresh_function(function: types.FunctionType, tag: str) -> types.FunctionType:
    """A copy of ``function`` with its own code object (its own Dynamo cache)."""
    code = function.__code__.replace(co_name=f"{function.__code__.co_name}_{tag}")
    return types.FunctionType(code, function.__globals__, code.co_name, function.__defaults__, function.__closure__)


class CompiledModel:
    """``model(input_ids, positions)`` compiled with an `AscendGraphBackend` (or eager when None)."""

    def __init__(self, model: torch.nn.Module, backend: Optional[AscendGraphBackend]) -> None:
        self.model = model
        self.backend = backend
        self.compile_seconds = 0.0
        self._compiled: Optional[Callable[..., Any]] = None
        if backend is not None:
            forward = _fresh_function(_model_forward, f"engine{next(_compile_ids)}")
            self._compiled = torch.compile(forward, backend=backend, fullgraph=True, dynamic=False)

    @property
    def is_compiled(self) -> bool:
        return self._compiled is not None

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # Inference only: a grad-mode change would also invalidate Dynamo's guards.
        with torch.no_grad():
            if self._compiled is None:
                return self.model(input_ids, positions)
            # Unbacked: no size hint to specialise on, so num_tokens == 1 does not force a
            # second compilation (a backed dynamic size is re-specialised for 0 and 1).
            torch._dynamo.decorators.mark_unbacked(input_ids, 0)
            torch._dynamo.decorators.mark_unbacked(positions, 0)
            first = self.backend is not None and not self.backend.artifacts
            start = time.perf_counter()
            output = self._compiled(self.model, input_ids, positions)
            if first:
                self.compile_seconds += time.perf_counter() - start
            return output
