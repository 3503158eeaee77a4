"""What a scenario file holds, checked: the kinds, outcomes and value checkers, and the
frozen records `load_scenario` returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Union

from ascendgraph.errors import ScenarioError  # noqa: F401  (re-exported: scenario files' error)


SCENARIO_KINDS = ("engine", "device")
OUTCOMES = ("ok", "error", "fallback")
REQUESTS_FAILED = ("none", "some", "all")
INVARIANT_NAMES = ("requests", "resources", "global_state")

# Resolution rules that mean "every request completed, but not as configured" besides a
# change of the effective mode (which always counts): name -> why it is a fallback.
FALLBACK_RULES: Mapping[str, str] = {
    "capture_fallback": "capture failed and the engine released its graphs and served eagerly",
    "soc_310p": "310P turned npugraph_ex / static kernel / super kernel off",
    "xlite": "XliteGraph replaced the ACL graph mode",
    "pooling_model": "pooling models run without full graphs",
    "encoder_decoder": "encoder-decoder models run PIECEWISE or NONE",
    "attention_narrowing": "the attention backend's graph support narrowed the mode",
    "piecewise_needs_vllm_compile": "piecewise graphs need VLLM_COMPILE",
    "unsupported_compilation_mode": "the NPU supports compilation modes NONE and VLLM_COMPILE only",
    "data_parallel_agreement": "data-parallel ranks agreed on a lower mode",
}


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class DeviceSpec:
    """[device]: the simulator profile, the fault plan, the injected environment."""

    profile: Union[None, str, Mapping[str, Any]] = None  # None: the config's soc
    faults: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    stream_error: Optional[str] = None  # "207008" | "el0009" (which CANN line exhaustion carries)
    require_task_updates: Optional[bool] = None  # None: the device's default (True, docs/decisions.md)
    stream_limit: Optional[int] = None  # device scenarios only (engine ones use [config] stream_limit)


@dataclass(frozen=True)
class RunSpec:
    """[run]: the workload and the run options (EngineOptions fields)."""

    requests: int = 4
    seed: int = 0
    prompt_words: tuple[int, int] = (3, 9)
    output_tokens: tuple[int, int] = (3, 6)
    burst_size: int = 2
    burst_gap: int = 3
    on_capture_error: str = "raise"
    dtype: str = "float32"
    atol: Optional[float] = None
    debug: bool = False
    num_threads: int = 1
    skip_param_update: bool = False
    record_update_events: bool = True


@dataclass(frozen=True)
class Expectation:
    """[expect]: the outcome and whatever else the scenario pins down."""

    outcome: str
    error_type: Optional[str] = None
    message: tuple[str, ...] = ()
    effective_mode: Optional[str] = None
    requested_mode: Optional[str] = None
    decisions: tuple[str, ...] = ()
    capture_sizes: Optional[tuple[int, ...]] = None
    warning: Optional[str] = None
    requests_failed: Optional[str] = None
    graphs_captured: Optional[int] = None
    graphs_captured_before_failure: Optional[int] = None
    stream_plan_fits: Optional[bool] = None
    stream_plan_max_sizes: Optional[int] = None
    fails_at_planned_size: Optional[bool] = None


@dataclass(frozen=True)
class Invariants:
    """[invariants]: which checks run (all by default)."""

    requests: bool = True
    resources: bool = True
    global_state: bool = True


@dataclass(frozen=True)
class Scenario:
    """One scenario file, checked."""

    name: str
    path: Path
    kind: str
    description: str
    expect: Expectation
    config: Mapping[str, Any] = field(default_factory=dict)
    device: DeviceSpec = field(default_factory=DeviceSpec)
    run: RunSpec = field(default_factory=RunSpec)
    action: Optional[str] = None
    action_args: Mapping[str, Any] = field(default_factory=dict)
    invariants: Invariants = field(default_factory=Invariants)
    marks: tuple[str, ...] = ()

    @property
    def expected_text(self) -> str:
        """``error (StreamResourceExhausted)``, ``fallback``, ``ok``."""
        if self.expect.error_type:
            return f"{self.expect.outcome} ({self.expect.error_type})"
        return self.expect.outcome


# --------------------------------------------------------------------------- loading
# Value checkers: (predicate, what was expected) — the text goes into ScenarioError.


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


Check = tuple[Callable[[Any], bool], str]
BOOL: Check = (lambda v: isinstance(v, bool), "true or false")
STR: Check = (lambda v: isinstance(v, str), "a string")
INT: Check = (_is_int, "an integer")
POSITIVE: Check = (lambda v: _is_int(v) and v >= 1, "an integer >= 1")
NON_NEGATIVE: Check = (lambda v: _is_int(v) and v >= 0, "an integer >= 0")
STR_LIST: Check = (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v), "a list of strings")
INT_LIST: Check = (lambda v: isinstance(v, list) and all(_is_int(x) for x in v), "a list of integers")
RANGE: Check = (
    lambda v: isinstance(v, list) and len(v) == 2 and all(_is_int(x) for x in v) and 1 <= v[0] <= v[1],
    "[low, high] with 1 <= low <= high",
)
STR_OR_STR_LIST: Check = (lambda v: isinstance(v, str) or STR_LIST[0](v), "a string or a list of strings")
STR_TABLE: Check = (
    lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    "a table of strings (VAR = \"value\")",
)


def _one_of(*choices: str) -> Check:
    return (lambda v: v in choices, "one of " + ", ".join(repr(c) for c in choices))


def _mode_name() -> Check:
    from ascendgraph.modes import GraphMode

    names = tuple(m.name for m in GraphMode)
    return (lambda v: v in names, "a graph mode name: " + ", ".join(names))


def config_namespace(config: Mapping[str, Any]) -> Any:
    """The `ascendgraph run` argument namespace a checked [config] table stands for."""
    import argparse

    from ascendgraph.cli.args import add_config_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_config_arguments(parser)
    namespace = parser.parse_args([])
    for key, value in config.items():
        setattr(namespace, key, value)
    return namespace
