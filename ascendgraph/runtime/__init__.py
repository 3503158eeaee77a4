"""The runtime: the engine's stages (build, compile, capture, serve, check, report) and what they use
(FULL-graph parameter updates, workloads, reports, profiler). The graph wrapper and the forward
context sit below it (`ascendgraph.compile.graph_wrapper`, `ascendgraph.forward_context`); their
old names here stay importable as aliases (`ascendgraph.moved_modules`)."""

from ascendgraph import moved_modules as _moved_modules

_moved_modules.install()
