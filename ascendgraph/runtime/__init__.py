"""The runtime: the engine's stages (build, compile, capture, serve, check, report) and what they use
(capture wrapper, FULL-graph parameter updates, forward context, workloads, reports, profiler)."""
