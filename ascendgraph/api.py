"""The Python API: the same objects the CLI prints.

    import ascendgraph
    resolution = ascendgraph.explain({"compilation_config": {"cudagraph_mode": "FULL"}, "attention_backend": "mla"})
    report = ascendgraph.run({"model": "tiny", "num_layers": 2}, device="sim", requests=8, seed=1)

Both take a `GraphConfig`, a mapping of `GraphConfig.from_vllm_args` arguments (vLLM's
names: ``compilation_config``, ``additional_config``, ``model``, ``max_num_seqs``, ...), or
nothing (the defaults). `run` imports the engine (and torch) only when called.
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional, Sequence, Union

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import Resolution

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.runtime.report import Report

__all__ = ["as_config", "explain", "run"]

ConfigOrArgs = Union[GraphConfig, Mapping[str, Any], None]


def as_config(config_or_args: ConfigOrArgs = None) -> GraphConfig:
    """A GraphConfig from a GraphConfig, a mapping of vLLM-style arguments, or None."""
    if config_or_args is None:
        return GraphConfig()
    if isinstance(config_or_args, GraphConfig):
        return config_or_args
    if isinstance(config_or_args, Mapping):
        for key in config_or_args:
            if not isinstance(key, str):
                raise ConfigError(
                    f"argument names must be strings (vLLM's names, e.g. 'max_num_seqs'), got {key!r}", key=str(key)
                )
        return GraphConfig.from_vllm_args(**dict(config_or_args))
    raise ConfigError(
        f"expected a GraphConfig or a mapping of vLLM-style arguments, got {type(config_or_args).__name__}; "
        "e.g. {'compilation_config': {'cudagraph_mode': 'FULL'}}"
    )


def _closest_hint(name: str, valid: Iterable[str]) -> str:
    names = sorted(valid)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    guess = f"did you mean {close[0]!r}? " if close else ""
    return f"{guess}valid: {', '.join(names)}"


def _check_resolve_options(
    env: Any, stream_limit: Any, hccl_op_expansion_mode: Any, other_rank_modes: Any
) -> tuple[GraphMode, ...]:
    """The explain() keywords with the right types (ConfigError naming the bad one)."""
    if env is not None and not isinstance(env, Mapping):
        raise ConfigError(f"env must be a mapping of environment variables (e.g. dict(os.environ)), got {env!r}",
                          key="env")
    if env is not None:
        for name, value in env.items():
            if not isinstance(name, str) or not isinstance(value, str):
                raise ConfigError(f"env: environment variables are strings, got {name!r}={value!r} "
                                  f"(write {name}={str(value)!r})", key="env")
    if stream_limit is not None and (isinstance(stream_limit, bool) or not isinstance(stream_limit, int)
                                     or stream_limit < 1):
        raise ConfigError(f"stream_limit must be an integer >= 1, got {stream_limit!r}", key="stream_limit")
    if hccl_op_expansion_mode is not None and not isinstance(hccl_op_expansion_mode, str):
        raise ConfigError(
            f"hccl_op_expansion_mode must be a string such as 'AIV', got {hccl_op_expansion_mode!r}",
            key="hccl_op_expansion_mode",
        )
    if isinstance(other_rank_modes, (str, bytes)) or not isinstance(other_rank_modes, Iterable):
        raise ConfigError(
            f"other_rank_modes must be a list of graph modes (e.g. ['FULL']), got {other_rank_modes!r}",
            key="other_rank_modes",
        )
    return tuple(GraphMode.parse(mode) for mode in other_rank_modes)


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
    """Resolve a configuration (docs/semantics.md §3): effective mode, sizes, flags and the decisions.

    Give a GraphConfig, a mapping of vLLM-style arguments, or those arguments as keywords:
    ``explain(compilation_config={"cudagraph_mode": "FULL"}, attention_backend="mla")``.
    """
    from ascendgraph.resolve import resolve
    from ascendgraph.sizes import DEFAULT_MAX_STREAMS

    if vllm_args:
        if config_or_args is not None:
            raise ConfigError("pass either a config (or a mapping of arguments) or keyword arguments, not both")
        config_or_args = vllm_args
    modes = _check_resolve_options(env, stream_limit, hccl_op_expansion_mode, other_rank_modes)
    return resolve(
        as_config(config_or_args),
        env=env,
        stream_limit=DEFAULT_MAX_STREAMS if stream_limit is None else stream_limit,
        hccl_op_expansion_mode=hccl_op_expansion_mode,
        other_rank_modes=modes,
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
    ``options`` are `ascendgraph.runtime.engine.EngineOptions` fields (``on_capture_error``,
    ``stream_limit``, ``faults``, ``dtype``, ``atol``, ...).
    """
    from dataclasses import fields

    from ascendgraph.runtime import engine

    valid = {f.name for f in fields(engine.EngineOptions)} - {"device", "requests", "seed"}
    for name in options:
        if name not in valid:
            raise ConfigError(f"unknown run option {name!r}; {_closest_hint(name, valid)}", key=name)
    if requests is None:
        requests = engine.DEFAULT_REQUESTS
    return engine.run(as_config(config_or_args), device=device, requests=requests, seed=seed, **options)
