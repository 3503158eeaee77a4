"""The npugraph_ex passes: FX rewrites of the aten-level graph before it is captured.

* `stream_scope` — `same_stream_scope(labels)`: the rule that keeps cross-stream nodes apart;
* `matcher`, `rewrite` — the FX search/replace engine of the fusion passes (the semantics of
  torch's inductor pattern matcher, without importing it);
* `fusion` — `FusionPass`: pattern families registered lazily and applied with that engine;
* `patterns` — the fusions (add_rms_norm, rms_norm, norm+quant, split_qkv_rmsnorm_rope, muls_add);
* `noop` — no-op view/reshape elimination;
* `selection` — `build_passes(resolution)`: which passes run per mode and flag (a table),
  and `fused_ops(pass_manager)` for the run report.

Importing this package is cheap (the fusion modules are imported when the passes are
built, patterns are traced when a fusion pass first meets a graph that calls their anchor op). `ascendgraph.compile.PassManager.for_resolution` calls
`build_passes` automatically.
"""

from ascendgraph.compile.passes.noop import NoopEliminationPass
from ascendgraph.compile.passes.selection import PASS_RULES, PassRule, build_passes, fused_ops, select_pass_names
from ascendgraph.compile.passes.stream_scope import STREAM_LABEL_KEY, same_stream_scope, stream_label

__all__ = [
    "STREAM_LABEL_KEY",
    "same_stream_scope",
    "stream_label",
    "NoopEliminationPass",
    "PASS_RULES",
    "PassRule",
    "build_passes",
    "fused_ops",
    "select_pass_names",
]
