"""The compile backend: aten lowering, the pass manager, piecewise splitting, graph wrappers.

* `backend` — `AscendGraphBackend` (the torch.compile backend) and `CompiledModel`;
* `lowering` — undoing functionalisation of ``out=`` ops after aot_autograd;
* `pass_manager` — `PassManager` / `GraphPass` (passes come from ``compile.passes``);
* `split` — `split_at_attention`.
"""

from ascendgraph.compile.backend import ATTENTION_SPLITTING_OPS, AscendGraphBackend, CompiledArtifact, CompiledModel
from ascendgraph.compile.pass_manager import GraphPass, PassManager, PassRun, build_passes
from ascendgraph.compile.split import SplitGraph, split_at_attention

__all__ = [
    "ATTENTION_SPLITTING_OPS",
    "AscendGraphBackend",
    "CompiledArtifact",
    "CompiledModel",
    "GraphPass",
    "PassManager",
    "PassRun",
    "SplitGraph",
    "build_passes",
    "split_at_attention",
]
