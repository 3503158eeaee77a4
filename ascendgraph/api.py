"""The Python API: the same objects the CLI prints.

    import ascendgraph
    resolution = ascendgraph.explain({"compilation_config": {"cudagraph_mode": "FULL"}, "attention_backend": "mla"})
    report = ascendgraph.run({"model": "tiny", "num_layers": 2}, device="sim", requests=8, seed=1)

Both take a `GraphConfig`, a mapping of `GraphConfig.from_vllm_args` arguments (vLLM's
names: ``compilation_config``, ``additional_config``, ``model``, ``max_num_seqs``, ...), or
nothing (the defaults). `run` imports the engine (and torch) only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Optional, Sequence, Union

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.resolve import Resolution

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.report import Report

__all__ = ["as_config", "explain", "run"]

ConfigOrArgs = Union[GraphConfig, Mapping[str, Any], None]


def as_config(config_or_args: ConfigOrArgs = None) -> GraphConfig:
    """A GraphConfig from a GraphConfig, a mapping of vLLM-style arguments, or None."""
    if config_or_args is None:
        return GraphConfig()
    if isinstance(config_or_args, GraphConfig):
        return config_or_args
    if isinstance(config_or_args, Mapping):
        return GraphConfig.from_vllm_args(**dict(config_or_args))
    raise ConfigError(
        f"expected a GraphConfig or a mapping of vLLM-style arguments, got {type(config_or_args).__name__}; "
        "e.g. {'compilation_config': {'cudagraph_mode': 'FULL'}}"
    )


def explain(
    config_or_args: ConfigOrArgs = None,
    *,
    env: Optional[Mapping[str, str]] = None,
    stream_limit: Optional[int] = None,
    hccl_op_expansion_mode: Optional[str] = None,
    other_rank_modes: Sequence[Any] = (),
    attention_support: Any = None,
    **vllm_args: Any,
) -> Resolution:
    """Resolve a configuration (SEMANTICS §3): effective mode, sizes, flags and the decisions.

    Give a GraphConfig, a mapping of vLLM-style arguments, or those arguments as keywords:
    ``explain(compilation_config={"cudagraph_mode": "FULL"}, attention_backend="mla")``.
    """
    from ascendgraph.resolve import resolve
    from ascendgraph.sizes import DEFAULT_MAX_STREAMS

    if vllm_args:
        if config_or_args is not None:
            raise ConfigError("pass either a config (or a mapping of arguments) or keyword arguments, not both")
        config_or_args = vllm_args
    return resolve(
        as_config(config_or_args),
        env=env,
        stream_limit=DEFAULT_MAX_STREAMS if stream_limit is None else stream_limit,
        hccl_op_expansion_mode=hccl_op_expansion_mode,
        other_rank_modes=other_rank_modes,
        attention_support=attention_support,
    )


def run(
    config_or_args: ConfigOrArgs = None,
    *,
    device: Any = "auto",
    requests: Optional[int] = None,
    seed: int = 0,
    **options: Any,
) -> "Report":
    """Run graph mode end to end (resolve, build, compile, capture, serve, check) -> `Report`.

    A failed run does not raise: ``report.error`` says what failed and the report's exit
    code is 1. Bad configurations raise ConfigError / GraphModeError / DeviceUnavailable.
    ``options`` are `ascendgraph.engine.EngineOptions` fields (``on_capture_error``,
    ``stream_limit``, ``faults``, ``dtype``, ``atol``, ...).
    """
    from ascendgraph import engine

    if requests is None:
        requests = engine.DEFAULT_REQUESTS
    return engine.run(as_config(config_or_args), device=device, requests=requests, seed=seed, **options)
