"""Hostile API calls: every public entry point, given values of every wrong type and size,
either accepts them or raises one of the classes in `ascendgraph.errors`, never a foreign
TypeError / AttributeError / RuntimeError / RecursionError / OverflowError.

`run()` gets only values that must be refused before an engine starts (a test here never
runs a workload)."""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, Callable

import pytest

import ascendgraph
from ascendgraph import errors
from ascendgraph.config import AscendCompilationConfig, GraphConfig, XliteGraphConfig

from .corpus import BIG_INT, DEEP_LIST, HOSTILE_FAULTS, HOSTILE_JSON, NESTED_65

ERROR_CLASSES = tuple(
    value for value in vars(errors).values() if isinstance(value, type) and issubclass(value, errors.AscendGraphError)
)


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


HOSTILE_VALUES: dict[str, Any] = {
    "int-5": 5,
    "negative": -1,
    "zero": 0,
    "huge-int": 10**30,
    "thousands-digit-int": int("9" * 1000),
    "nan": math.nan,
    "inf": math.inf,
    "float": 1.5,
    "true": True,
    "string": "x",
    "empty-string": "",
    "list": [1, 2],
    "dict": {"a": 1},
    "deep-dict": _deep(200),
    "object": object(),
    "bytes": b"\x00",
    "none": None,
}


def _graph_config(name: str, value: Any) -> Callable[[], Any]:
    return lambda: ascendgraph.explain(GraphConfig(**{name: value}))


def _from_vllm_args(name: str, value: Any) -> Callable[[], Any]:
    return lambda: GraphConfig.from_vllm_args(**{name: value})


def _api_cases() -> list[tuple[str, Callable[[], Any]]]:
    cases: list[tuple[str, Callable[[], Any]]] = []
    for item in fields(GraphConfig):
        for name, value in HOSTILE_VALUES.items():
            cases.append((f"GraphConfig({item.name}={name})", _graph_config(item.name, value)))
    for kind in (AscendCompilationConfig, XliteGraphConfig):
        for item in fields(kind):
            for name in ("string", "int-5", "nan", "list"):
                value = HOSTILE_VALUES[name]
                cases.append((f"{kind.__name__}({item.name}={name})", lambda k=kind, f=item.name, v=value: k(**{f: v})))
    for key in ("compilation_config", "additional_config", "speculative_config", "model"):
        for name, text in HOSTILE_JSON.items():
            cases.append((f"from_vllm_args({key}=json {name})", _from_vllm_args(key, text)))
        for name, value in HOSTILE_VALUES.items():
            cases.append((f"from_vllm_args({key}={name})", _from_vllm_args(key, value)))
    for key in ("max_num_seqs", "tensor_parallel_size", "num_speculative_tokens", "optimization_level", "block_size",
                "cudagraph_capture_sizes", "soc", "attention_backend", "enforce_eager", "num_layers", "max_loras"):
        for name, value in HOSTILE_VALUES.items():
            cases.append((f"from_vllm_args({key}={name})", _from_vllm_args(key, value)))
    for name, value in HOSTILE_VALUES.items():
        cases.append((f"explain(env={name})", lambda v=value: ascendgraph.explain(env=v)))
        cases.append((f"explain(stream_limit={name})", lambda v=value: ascendgraph.explain(stream_limit=v)))
        cases.append((f"explain(other_rank_modes={name})", lambda v=value: ascendgraph.explain(other_rank_modes=v)))
        cases.append((f"explain(config={name})", lambda v=value: ascendgraph.explain(v)))
    cases.append(("explain(deep mapping)", lambda: ascendgraph.explain({"compilation_config": _deep(5000)})))
    cases.append(("explain(65 deep mapping)", lambda: ascendgraph.explain({"additional_config": _deep(65)})))
    cases.append(("explain(-O thousands digits)", lambda: ascendgraph.explain(optimization_level=BIG_INT)))
    cases.append(("explain(json deep)", lambda: ascendgraph.explain(compilation_config=DEEP_LIST)))
    cases.append(("explain(json nested 65)", lambda: ascendgraph.explain(compilation_config=NESTED_65)))
    return cases


# run(): values refused before an engine starts (the test must never run a workload).
RUN_REFUSED: dict[str, list[Any]] = {
    "num_threads": [0, -1, "x", 1.5, 10**30, math.nan],
    "workload": [5, [], "x", [1, 2], {"a": 1}],
    "pass_manager": [5, "x", object()],
    "workload_spec": [5, "x"],
    "atol": [1e9, math.nan, math.inf, -1, "x", 2],
    "requests": [0, -1, 10**30, "4", math.nan],
    "seed": [-1, 2**70, "x", 1.5],
    "device": ["gpu", 5, None],
    "dtype": ["float64", 5, None],
    "on_capture_error": ["ignore", 5],
    "stream_limit": [0, "x", -5],
    "check_eager": ["yes", 1],
    "debug": ["yes"],
    "quantization": ["int4", 5],
    "faults": [5, *HOSTILE_FAULTS.values()],
    "sim_profile": [5, "A9", "no/such/profile.json"],
    "profile_dir": ["", 5],
    "env": [5, "x"],
    "dp_peer_tokens": [5, "x"],
}


def _run_cases() -> list[tuple[str, Callable[[], Any]]]:
    cases = []
    for option, values in RUN_REFUSED.items():
        for index, value in enumerate(values):
            cases.append((f"run({option} #{index})", lambda o=option, v=value: ascendgraph.run(
                {"model": "tiny", "num_layers": 1}, **{"device": "sim", "requests": 1, o: v})))
    for name in ("num_thread", "atoll", "Requests", "fault", "work_load"):
        cases.append((f"run(unknown {name})", lambda n=name: ascendgraph.run(device="sim", requests=1, **{n: 1})))
    return cases


API_CASES = _api_cases()
RUN_CASES = _run_cases()


@pytest.mark.parametrize("call", [c for _, c in API_CASES], ids=[i for i, _ in API_CASES])
def test_the_api_raises_only_its_own_errors(call):
    try:
        call()
    except ERROR_CLASSES:
        pass
    except Exception as exc:  # noqa: BLE001 - the point of the test
        pytest.fail(f"foreign exception {type(exc).__module__}.{type(exc).__name__}: {exc}"[:500])


@pytest.mark.parametrize("call", [c for _, c in RUN_CASES], ids=[i for i, _ in RUN_CASES])
def test_run_refuses_before_any_engine_starts(call):
    with pytest.raises(errors.ConfigError):
        call()


def test_the_api_corpus_is_large():
    assert len(API_CASES) + len(RUN_CASES) >= 500
