"""The engine's stages, one module each: build, forward (shared plumbing), capture, serve,
check, report; records holds what they hand each other. `ascendgraph.runtime.engine.Engine`
combines them (each stage is a base class of `Engine`) and holds all state."""
