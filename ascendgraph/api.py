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
import math
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, Union

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
                                     or not 1 <= stream_limit <= MAX_STREAM_LIMIT):
        shown = repr(stream_limit) if len(repr(stream_limit)) <= 40 else repr(stream_limit)[:37] + "..."
        raise ConfigError(f"stream_limit must be an integer >= 1 (at most 2**63 - 1), got {shown}", key="stream_limit")
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


MAX_STREAM_LIMIT = 2**63 - 1  # as the engine's stream_limit
MAX_RUN_ATOL = 1.0  # a tolerance above 1 checks nothing (hidden states are O(1))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda value: value is None or check(value)


def _run_option_checks() -> dict[str, tuple[Callable[[Any], bool], str]]:
    """`run()` option -> (check, what is expected): checked before the engine sees them, so a
    wrong type is a ConfigError naming the option, never a TypeError from deep inside."""
    from ascendgraph.compile.pass_manager import PassManager
    from ascendgraph.runtime.workload import Request, WorkloadSpec

    return {
        "workload": (
            _optional(lambda v: isinstance(v, Sequence) and not isinstance(v, (str, bytes)) and len(v) > 0
                      and all(isinstance(r, Request) for r in v)),
            "a non-empty list of Request objects (or None: generated from requests and seed)",
        ),
        "workload_spec": (_optional(lambda v: isinstance(v, WorkloadSpec)), "a WorkloadSpec (or None)"),
        "pass_manager": (_optional(lambda v: isinstance(v, PassManager)), "a PassManager (or None)"),
        "atol": (_optional(lambda v: _finite_number(v) and v >= 0), "a finite number >= 0"),
        "check_eager": (lambda v: isinstance(v, bool), "true or false"),
        "debug": (lambda v: isinstance(v, bool), "true or false"),
        "progress": (_optional(lambda v: isinstance(v, bool)), "true, false or None"),
        "faults": (_optional(lambda v: isinstance(v, str)), "a fault plan string (or None)"),
        "hccl_op_expansion_mode": (_optional(lambda v: isinstance(v, str)), "a string such as 'AIV' (or None)"),
        "quantization": (_optional(lambda v: v in ("w8a8", "w8a8_dynamic")), "'w8a8', 'w8a8_dynamic' or None"),
        "skip_param_update": (lambda v: isinstance(v, bool), "true or false"),
        "record_update_events": (lambda v: isinstance(v, bool), "true or false"),
        "dp_peer_tokens": (_optional(callable), "a function of a batch returning the other ranks' token counts"),
        "dtype": (lambda v: isinstance(v, str) or type(v).__name__ == "dtype", "'float32' or 'bfloat16'"),
    }


def _check_run_options(options: Mapping[str, Any]) -> None:
    checks = _run_option_checks()
    for name, value in options.items():
        check = checks.get(name)
        if check is not None and not check[0](value):
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:37] + "..."
            raise ConfigError(f"{name} must be {check[1]}, got {shown}", key=name)
    atol = options.get("atol")
    if atol is not None and atol > MAX_RUN_ATOL:
        raise ConfigError(f"atol must be at most {MAX_RUN_ATOL:g} (a tolerance above 1 checks nothing), got {atol!r}",
                          key="atol")


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

    The caller's process is left as found: environment variables the run (or torch) set are
    removed again and tqdm's monitor thread is stopped; torch's default device must be the CPU
    and its default dtype float32 (else ConfigError). ``ascendgraph/caller_state.py`` lists
    exactly what is kept; ``TORCH_DEVICE_BACKEND_AUTOLOAD`` is set only while torch's first
    import runs (``ascendgraph/torch_autoload.py``)."""
    from ascendgraph.caller_state import collector_tuned_for_a_run

    with collector_tuned_for_a_run():  # the caller's collector thresholds put back afterwards
        return _run(config_or_args, device=device, requests=requests, seed=seed, **options)


def _run(config_or_args: ConfigOrArgs, *, device: Any, requests: Optional[int], seed: int,
         **options: Any) -> "Report":
    from dataclasses import fields

    from ascendgraph.runtime import engine

    valid = {f.name for f in fields(engine.EngineOptions)} - {"device", "requests", "seed"}
    for name in options:
        if name not in valid:
            raise ConfigError(f"unknown run option {name!r}; {_closest_hint(name, valid)}", key=name)
    _check_run_options(options)
    if requests is None:
        requests = engine.DEFAULT_REQUESTS
    from ascendgraph.caller_state import check_torch_defaults, kept_as_found

    check_torch_defaults()  # a caller's set_default_device("meta") / set_default_dtype: refused, named
    with kept_as_found():  # environment and threads as the caller had them (ascendgraph/caller_state.py)
        return engine.run(as_config(config_or_args), device=device, requests=requests, seed=seed, **options)
