"""Fault scenarios: a TOML file names a failure, `run_scenario` reproduces it on the simulator.

Theory of operation. A scenario file (``tests/scenarios/*.toml``) says what to run and what
must come of it:

    kind = "engine"                     # engine: a whole run (`ascendgraph run`); device: one misuse
    description = "..."
    [config]   the flags of `ascendgraph run` (same names, underscores or dashes; JSON flags as tables)
    [device]   profile (a name or a table over a base profile), faults (a plan), env (a table)
    [run]      the workload and run options: requests, seed, on_capture_error, dtype, debug, ...
    [action]   (device scenarios) name = one of DEVICE_ACTIONS, plus that action's parameters
    [expect]   outcome = "ok" | "error" | "fallback", error_type, message, effective_mode, ...
    [invariants] requests / resources / global_state = true (all on by default)

`load_scenario` checks the file against the tables below and raises `ScenarioError` (a
ConfigError: exit 2 in the CLI) naming the file, the key and what was expected.
`run_scenario` runs it and returns a `ScenarioResult`: the outcome observed (``error`` when
anything raised or any request failed; ``fallback`` when every request completed but not
as configured — a capture fallback, a narrowed mode, a feature turned off; else ``ok``),
every way it missed its expectation, and the invariants:

* requests — every request completed or failed, and none completed through a step that
  differed from eager (never silently wrong);
* resources — after a failed capture (and after the engine is closed) streams, graphs,
  pool bytes and suspended replays are back to their figures before capture;
* global_state — nothing process-wide changed: os.environ, torch's default dtype, thread
  count, grad mode and global RNG, Python's RNG, gc.collect, dispatch / function mode
  stacks, the forward context, the wrapper-op registry, the device's empty_cache.

Env-var scenarios inject their ``env`` table into the resolution and the simulator; the
process environment is never read or written (a scenario is hermetic: variables not in its
table are unset for it).
"""

from __future__ import annotations

import difflib
import gc
import math
import os
import random
import time
import tomllib
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Optional, Sequence, Union

from ascendgraph.errors import ConfigError, GraphModeError
from ascendgraph.device import check_device_options

if TYPE_CHECKING:  # pragma: no cover
    from ascendgraph.device import Device, DeviceStats
    from ascendgraph.runtime.report import Report

__all__ = [
    "SCENARIO_KINDS",
    "OUTCOMES",
    "FALLBACK_RULES",
    "DEVICE_ACTIONS",
    "ScenarioError",
    "Scenario",
    "Expectation",
    "Invariants",
    "DeviceSpec",
    "RunSpec",
    "ScenarioResult",
    "ProcessState",
    "load_scenario",
    "discover_scenarios",
    "run_scenario",
    "catalogue_table",
]

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


class ScenarioError(ConfigError):
    """A bad scenario file: the message names the file, the key and what was expected."""

    def __init__(self, path: Union[str, Path], key: str, problem: str) -> None:
        super().__init__(f"{path}: {key}: {problem}", key=key)
        self.path = str(path)


# --------------------------------------------------------------------------- the model


@dataclass(frozen=True)
class DeviceSpec:
    """[device]: the simulator profile, the fault plan, the injected environment."""

    profile: Union[None, str, Mapping[str, Any]] = None  # None: the config's soc
    faults: Optional[str] = None
    env: Mapping[str, str] = field(default_factory=dict)
    stream_error: Optional[str] = None  # "207008" | "el0009" (which CANN line exhaustion carries)
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


TOP_KEYS: Mapping[str, str] = {
    "kind": "engine (a whole run) or device (one device action)",
    "description": "one line: what happens and what the answer must be",
    "marks": "pytest markers for the collected test item, e.g. [\"slow\"]",
    "config": "table: the flags of `ascendgraph run`",
    "device": "table: profile, faults, env",
    "run": "table: workload and run options",
    "action": "table: name of a device action and its parameters",
    "expect": "table: outcome and what else must be observed",
    "invariants": "table: requests / resources / global_state switches",
}

DEVICE_KEYS: Mapping[str, Check] = {
    "profile": (
        lambda v: isinstance(v, (str, dict)),
        "a simulator profile name (A2, A3, 310P, A5, A2-old-hdk) or a table such as "
        "{ base = \"A2\", memory_bytes = 131072 }",
    ),
    "faults": (lambda v: isinstance(v, str), "a fault plan string, e.g. \"capture_begin=3*off->raise(207008)\""),
    "env": STR_TABLE,
    "stream_error": _one_of("207008", "el0009"),
    "stream_limit": POSITIVE,
}

RUN_KEYS: Mapping[str, Check] = {
    "requests": POSITIVE,
    "seed": INT,
    "prompt_words": RANGE,
    "output_tokens": RANGE,
    "burst_size": NON_NEGATIVE,
    "burst_gap": POSITIVE,
    "on_capture_error": _one_of("raise", "eager"),
    "dtype": _one_of("float32", "bfloat16"),
    "atol": (lambda v: _is_number(v) and v >= 0, "a finite number >= 0"),
    "debug": BOOL,
    "num_threads": POSITIVE,
    "skip_param_update": BOOL,
    "record_update_events": BOOL,
}

EXPECT_KEYS: Mapping[str, Check] = {
    "outcome": _one_of(*OUTCOMES),
    "error_type": STR,
    "message": STR_OR_STR_LIST,
    "effective_mode": STR,  # checked against GraphMode names below
    "requested_mode": STR,
    "decisions": STR_LIST,
    "capture_sizes": INT_LIST,
    "warning": STR,
    "requests_failed": _one_of(*REQUESTS_FAILED),
    "graphs_captured": NON_NEGATIVE,
    "graphs_captured_before_failure": NON_NEGATIVE,
    "stream_plan_fits": BOOL,
    "stream_plan_max_sizes": NON_NEGATIVE,
    "fails_at_planned_size": BOOL,
}
# [expect] keys that only an engine run can observe.
ENGINE_ONLY_EXPECT = (
    "effective_mode", "requested_mode", "decisions", "capture_sizes", "warning", "requests_failed",
    "graphs_captured", "graphs_captured_before_failure", "stream_plan_fits", "stream_plan_max_sizes",
    "fails_at_planned_size",
)

# The `ascendgraph run` flags that are not configuration (they live in [run] / [device]).
_RUN_FLAG_HOMES = {
    "faults": "[device] faults",
    "sim_profile": "[device] profile",
    "requests": "[run] requests",
    "seed": "[run] seed",
    "on_capture_error": "[run] on_capture_error",
    "dtype": "[run] dtype",
    "atol": "[run] atol",
    "debug": "[run] debug",
    "device": "nothing: scenarios always run on the simulator",
}
_JSON_FLAGS = ("compilation_config", "additional_config", "speculative_config")


def _closest(key: str, valid: Iterable[str]) -> str:
    close = difflib.get_close_matches(key, sorted(valid), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check_table(path: Path, section: str, table: Any, checks: Mapping[str, Check]) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ScenarioError(path, f"[{section}]", f"expected a table, got {table!r}")
    for key, value in table.items():
        if key not in checks:
            raise ScenarioError(
                path, f"[{section}] {key}",
                f"unknown key{_closest(key, checks)}; expected one of {', '.join(checks)}",
            )
        predicate, expected = checks[key]
        if not predicate(value):
            raise ScenarioError(path, f"[{section}] {key}", f"expected {expected}, got {value!r}")
    return dict(table)


def _config_flags() -> dict[str, Any]:
    """dest -> argparse action of the configuration flags `ascendgraph run` accepts."""
    import argparse

    from ascendgraph.cli.args import add_config_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_config_arguments(parser)
    return {action.dest: action for action in parser._actions}


def _check_config(path: Path, table: Any) -> dict[str, Any]:
    """[config]: the same keys and value checks as the CLI flags (argparse's own converters)."""
    import argparse

    if not isinstance(table, dict):
        raise ScenarioError(path, "[config]", f"expected a table, got {table!r}")
    flags = _config_flags()
    checked: dict[str, Any] = {}
    for raw_key, value in table.items():
        key = raw_key.replace("-", "_")
        where = f"[config] {raw_key}"
        if key in _RUN_FLAG_HOMES:
            raise ScenarioError(path, where, f"not a configuration flag; put it in {_RUN_FLAG_HOMES[key]}")
        action = flags.get(key)
        if action is None:
            raise ScenarioError(
                path, where,
                f"unknown flag{_closest(key, flags)}; expected a flag of `ascendgraph run`: {', '.join(sorted(flags))}",
            )
        flag = next((o for o in action.option_strings if o.startswith("--")), key)
        if key in _JSON_FLAGS:
            if not isinstance(value, (str, dict)):
                raise ScenarioError(path, where, f"expected a table or a JSON string (the {flag} flag), got {value!r}")
            _check_json_flag(path, where, flag, value)
        elif key == "model":
            if not isinstance(value, (str, dict)):
                raise ScenarioError(path, where, f"expected a preset name, a config.json path or a table, got {value!r}")
            if isinstance(value, str) and not os.path.isabs(value) and (path.parent / value).exists():
                value = str(path.parent / value)
            _check_model(path, where, value)
        elif action.nargs == 0:  # store_true flags
            if not isinstance(value, bool):
                raise ScenarioError(path, where, f"expected true or false (the {flag} switch), got {value!r}")
            value = value or None
        elif action.type is not None:
            if not isinstance(value, (str, int)) or isinstance(value, bool):
                raise ScenarioError(path, where, f"expected a value for {flag}, got {value!r}")
            try:
                value = action.type(str(value))
            except (argparse.ArgumentTypeError, ValueError, TypeError) as exc:
                raise ScenarioError(path, where, f"{exc} (as {flag} would say)") from None
        elif not isinstance(value, (str, int)) or isinstance(value, bool):
            raise ScenarioError(path, where, f"expected a string or an integer for {flag}, got {value!r}")
        if action.choices is not None and value not in action.choices:
            raise ScenarioError(
                path, where, f"expected one of {', '.join(map(str, action.choices))} (as {flag}), got {value!r}"
            )
        checked[key] = value
    return checked


def _check_json_flag(path: Path, where: str, flag: str, value: Union[str, dict[str, Any]]) -> None:
    """A JSON flag's string must parse to an object, as the CLI parses it (its message, one line)."""
    from ascendgraph.config import parse_json_argument

    try:
        parse_json_argument(flag, value)
    except ConfigError as exc:
        raise ScenarioError(path, where, " ".join(str(exc).split())) from None


def _check_model(path: Path, where: str, value: Union[str, dict[str, Any]]) -> None:
    """The model must resolve as `--model` resolves it: a preset, a readable config.json, a table."""
    from ascendgraph.models.presets import model_spec_from

    try:
        model_spec_from(value)
    except ConfigError as exc:
        raise ScenarioError(path, where, " ".join(str(exc).split())) from None


def _action_args(path: Path, table: Any) -> tuple[str, dict[str, Any]]:
    if not isinstance(table, dict):
        raise ScenarioError(path, "[action]", f"expected a table, got {table!r}")
    name = table.get("name")
    if name not in DEVICE_ACTIONS:
        raise ScenarioError(
            path, "[action] name",
            f"expected one of {', '.join(DEVICE_ACTIONS)}{_closest(str(name), DEVICE_ACTIONS)}, got {name!r}",
        )
    action = DEVICE_ACTIONS[name]
    args = {key: default for key, (_, default, _) in action.params.items()}
    for key, value in table.items():
        if key == "name":
            continue
        if key not in action.params:
            valid = ", ".join(action.params) or "none"
            raise ScenarioError(path, f"[action] {key}", f"unknown parameter of {name!r}{_closest(key, action.params)}; its parameters: {valid}")
        (predicate, expected), _, _ = action.params[key]
        if not predicate(value):
            raise ScenarioError(path, f"[action] {key}", f"expected {expected}, got {value!r}")
        args[key] = value
    return name, args


def load_scenario(path: Union[str, Path]) -> Scenario:
    """Read and check one scenario file; a bad file raises ScenarioError (file, key, expected)."""
    path = Path(path)
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ScenarioError(path, "(file)", "no such file") from None
    except OSError as exc:
        raise ScenarioError(path, "(file)", f"cannot read it: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(path, "(file)", f"not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise ScenarioError(path, "(file)", "not a text file (expected a UTF-8 TOML scenario file)") from None
    for key in data:
        if key not in TOP_KEYS:
            raise ScenarioError(path, key, f"unknown top-level key{_closest(key, TOP_KEYS)}; expected one of {', '.join(TOP_KEYS)}")
    kind = data.get("kind", "engine")
    if kind not in SCENARIO_KINDS:
        raise ScenarioError(path, "kind", f"expected one of {', '.join(SCENARIO_KINDS)}, got {kind!r}")
    description = data.get("description", "")
    if not isinstance(description, str) or not description.strip():
        raise ScenarioError(path, "description", "expected a non-empty string saying what happens")
    marks = data.get("marks", [])
    if not STR_LIST[0](marks):
        raise ScenarioError(path, "marks", f"expected a list of marker names, got {marks!r}")
    if "expect" not in data:
        raise ScenarioError(path, "[expect]", "missing; every scenario says what must happen (outcome = ...)")
    expect = _check_table(path, "expect", data["expect"], EXPECT_KEYS)
    if "outcome" not in expect:
        raise ScenarioError(path, "[expect] outcome", f"missing; expected one of {', '.join(OUTCOMES)}")
    for key in ("effective_mode", "requested_mode"):
        if key in expect and not _mode_name()[0](expect[key]):
            raise ScenarioError(path, f"[expect] {key}", f"expected {_mode_name()[1]}, got {expect[key]!r}")
    if expect["outcome"] == "ok" and ("error_type" in expect or "message" in expect):
        raise ScenarioError(path, "[expect] error_type", "only with outcome \"error\" or \"fallback\" (ok has no error)")
    if expect["outcome"] == "error" and "error_type" not in expect:
        raise ScenarioError(path, "[expect] error_type", "missing; an error scenario names the error class it expects")
    invariants = _check_table(path, "invariants", data.get("invariants", {}), {n: BOOL for n in INVARIANT_NAMES})
    device = _check_table(path, "device", data.get("device", {}), DEVICE_KEYS)
    if "faults" in device:
        _check_fault_plan(path, device["faults"])
    if isinstance(device.get("profile"), dict):
        _check_profile_table(path, device["profile"])

    config: dict[str, Any] = {}
    run: dict[str, Any] = {}
    action: Optional[str] = None
    action_args: dict[str, Any] = {}
    if kind == "engine":
        for key in ("action",):
            if key in data:
                raise ScenarioError(path, f"[{key}]", "only device scenarios (kind = \"device\") take an action")
        if "stream_limit" in device:
            raise ScenarioError(path, "[device] stream_limit", "an engine scenario sets it as [config] stream_limit (the --stream-limit flag)")
        config = _check_config(path, data.get("config", {}))
        run = _check_table(path, "run", data.get("run", {}), RUN_KEYS)
    else:
        for key in ("config", "run"):
            if key in data:
                raise ScenarioError(path, f"[{key}]", "only engine scenarios (kind = \"engine\") take it")
        if "action" not in data:
            raise ScenarioError(path, "[action]", f"missing; a device scenario names one of {', '.join(DEVICE_ACTIONS)}")
        action, action_args = _action_args(path, data["action"])
        if expect["outcome"] == "fallback":
            raise ScenarioError(path, "[expect] outcome", "a device action has no fallback; expected \"ok\" or \"error\"")
        for key in ENGINE_ONLY_EXPECT:
            if key in expect:
                raise ScenarioError(path, f"[expect] {key}", "only an engine scenario can observe it")
    message = expect.get("message", ())
    return Scenario(
        name=path.stem,
        path=path,
        kind=kind,
        description=" ".join(description.split()),
        expect=Expectation(
            outcome=expect["outcome"],
            error_type=expect.get("error_type"),
            message=(message,) if isinstance(message, str) else tuple(message),
            effective_mode=expect.get("effective_mode"),
            requested_mode=expect.get("requested_mode"),
            decisions=tuple(expect.get("decisions", ())),
            capture_sizes=tuple(expect["capture_sizes"]) if "capture_sizes" in expect else None,
            warning=expect.get("warning"),
            requests_failed=expect.get("requests_failed"),
            graphs_captured=expect.get("graphs_captured"),
            graphs_captured_before_failure=expect.get("graphs_captured_before_failure"),
            stream_plan_fits=expect.get("stream_plan_fits"),
            stream_plan_max_sizes=expect.get("stream_plan_max_sizes"),
            fails_at_planned_size=expect.get("fails_at_planned_size"),
        ),
        config=config,
        device=DeviceSpec(
            profile=device.get("profile"),
            faults=device.get("faults"),
            env=dict(device.get("env", {})),
            stream_error=device.get("stream_error"),
            stream_limit=device.get("stream_limit"),
        ),
        run=RunSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in run.items()}),
        action=action,
        action_args=action_args,
        invariants=Invariants(**invariants),
        marks=tuple(marks),
    )


def _check_fault_plan(path: Path, spec: str) -> None:
    try:
        check_device_options("sim", faults=spec)
    except ConfigError as exc:
        raise ScenarioError(path, "[device] faults", str(exc)) from None


def _check_profile_table(path: Path, table: Mapping[str, Any]) -> None:
    try:
        check_device_options("sim", profile=dict(table))
    except ConfigError as exc:
        raise ScenarioError(path, "[device] profile", str(exc)) from None


def discover_scenarios(paths: Sequence[Union[str, Path]]) -> list[Path]:
    """Scenario files from files and folders (folders: every *.toml below, sorted)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*.toml") if p.is_file())
            if not files:
                raise ScenarioError(path, "(folder)", "holds no *.toml scenario files")
            found.extend(files)
        elif path.is_file():
            found.append(path)
        else:
            raise ScenarioError(path, "(path)", "no such file or folder")
    return found


# --------------------------------------------------------------------------- process state


def _torch_rng_bytes() -> bytes:
    import torch

    return bytes(torch.get_rng_state().numpy().tobytes())


def _mode_stack_depths() -> tuple[int, int]:
    from torch.overrides import _get_current_function_mode_stack
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return len(_get_current_dispatch_mode_stack()), len(_get_current_function_mode_stack())


def _wrapper_ops() -> frozenset[str]:
    from ascendgraph import ops

    # The registry is module-level by design (one per process); a run must not change it.
    return frozenset(str(op) for op in getattr(ops, "_WRAPPER_OPS", {}))


def _forward_context_set() -> bool:
    from ascendgraph.runtime.forward_context import current_forward_context

    return current_forward_context() is not None


def _torch_value(getter: str) -> Callable[[], Any]:
    def read() -> Any:
        import torch

        return getattr(torch, getter)()

    return read


# name -> reader; compared with == (gc.collect by identity).
PROCESS_STATE: Mapping[str, Callable[[], Any]] = {
    "os.environ": lambda: dict(os.environ),
    "torch default dtype": _torch_value("get_default_dtype"),
    "torch intra-op threads": _torch_value("get_num_threads"),
    "torch grad mode": _torch_value("is_grad_enabled"),
    "torch inference mode": _torch_value("is_inference_mode_enabled"),
    "torch deterministic algorithms": _torch_value("are_deterministic_algorithms_enabled"),
    "torch global RNG state": _torch_rng_bytes,
    "python random state": random.getstate,
    "gc.collect": lambda: id(gc.collect),
    "gc enabled": gc.isenabled,
    "forward context set": _forward_context_set,
    "dispatch / function mode stacks": _mode_stack_depths,
    "wrapper-op registry": _wrapper_ops,
}


@dataclass(frozen=True)
class ProcessState:
    """A snapshot of the process-wide state a run must leave as it found it."""

    values: Mapping[str, Any]

    @classmethod
    def capture(cls) -> "ProcessState":
        return cls({name: read() for name, read in PROCESS_STATE.items()})

    def differences(self, later: "ProcessState") -> list[str]:
        changed = []
        for name, before in self.values.items():
            after = later.values.get(name)
            if before == after:
                continue
            if name == "os.environ":
                keys = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                changed.append(f"os.environ changed: {', '.join(f'{k}={before.get(k)!r}->{after.get(k)!r}' for k in keys)}")
            elif name in ("torch global RNG state", "python random state"):
                changed.append(f"{name} changed (something drew from the global generator)")
            else:
                changed.append(f"{name} changed: {before!r} -> {after!r}")
        return changed


def _warm_imports() -> None:
    """Import what a first run would import lazily: some modules set state once on import
    (torch._dynamo sets TORCHINDUCTOR_CACHE_DIR — even a device action can pull it in),
    and that is not a run's doing."""
    import torch._dynamo  # noqa: F401
    import torch._functorch.aot_autograd  # noqa: F401

    import ascendgraph.runtime.engine  # noqa: F401
    from ascendgraph.device import backend_availability

    backend_availability("sim")  # loads the simulator backend through its entry point


# --------------------------------------------------------------------------- results


@dataclass
class ScenarioResult:
    """What running a scenario showed: the outcome, every miss, the invariants."""

    scenario: Scenario
    outcome: str
    seconds: float
    mismatches: list[str] = field(default_factory=list)
    error: Optional[BaseException] = None  # the error, or the capture failure behind a fallback
    invariants: dict[str, str] = field(default_factory=dict)  # name -> "held" | "skipped: ..." | "violated: ..."
    report: Optional["Report"] = None
    traceback: Optional[str] = None  # of an error whose type was not the expected one

    @property
    def passed(self) -> bool:
        return not self.mismatches

    @property
    def name(self) -> str:
        return self.scenario.name

    def error_summary(self) -> Optional[dict[str, str]]:
        if self.error is None:
            return None
        return {"type": type(self.error).__name__, "message": str(self.error)}

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.scenario.name,
            "path": str(self.scenario.path),
            "kind": self.scenario.kind,
            "description": self.scenario.description,
            "expected": self.scenario.expect.outcome,
            "expected_error_type": self.scenario.expect.error_type,
            "outcome": self.outcome,
            "passed": self.passed,
            "seconds": round(self.seconds, 3),
            "error": self.error_summary(),
            "mismatches": list(self.mismatches),
            "invariants": dict(self.invariants),
        }

    def explain(self) -> str:
        """Why the scenario missed its expectation (empty when it passed)."""
        if self.passed:
            return ""
        lines = [f"scenario {self.name} ({self.scenario.path}): expected {self.scenario.expected_text}, observed {self.outcome}"]
        lines += [f"  - {m}" for m in self.mismatches]
        if self.error is not None:
            first = str(self.error).strip().splitlines()[0] if str(self.error).strip() else ""
            lines.append(f"  error: {type(self.error).__name__}: {first}")
        if self.traceback:
            lines.append("  traceback of the unexpected error:")
            lines += ["    " + line for line in self.traceback.rstrip().splitlines()]
        return "\n".join(lines)


# --------------------------------------------------------------------------- running


def _figures(stats: "DeviceStats") -> dict[str, int]:
    """The resource figures a failure must give back."""
    return {
        "streams_in_use": stats.streams_in_use,
        "graphs_alive": stats.graphs_alive,
        "pool_bytes": stats.pool_bytes,
        "suspended_replays": int(stats.extra.get("suspended_replays", 0)),
    }


def _compare_figures(label: str, before: Mapping[str, int], after: Mapping[str, int]) -> list[str]:
    return [
        f"{label}: {name} {after[name]} != {before[name]} before"
        for name in before
        if after.get(name) != before[name]
    ]


def _device_lost(device: Any) -> bool:
    try:
        return bool(device.stats().extra.get("device_lost"))
    except Exception:  # pragma: no cover - stats never raise on the simulator
        return True


def _exception_matches(exc: Optional[BaseException], name: str) -> bool:
    return exc is not None and any(cls.__name__ == name for cls in type(exc).__mro__)


@dataclass
class _Observation:
    """Everything a run showed, before it is judged."""

    error: Optional[BaseException] = None  # raised out of the run, or the run's error
    traceback: Optional[str] = None
    report: Optional["Report"] = None
    engine: Any = None
    device: Any = None
    capture_failure: Optional[BaseException] = None  # the capture error (raised or fallen back from)
    invariant_notes: dict[str, list[str]] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


class _RequestAudit:
    """Which requests each served step carried and how far it was from eager."""

    def __init__(self, engine: Any) -> None:
        self.batches: list[Any] = []
        self.records: list[Any] = []
        for route, runner in list(engine.runners.items()):
            engine.runners[route] = self._wrap(runner)
        engine.observers.append(self)

    def _wrap(self, runner: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def audited(batch: Any) -> Any:
            self.batches.append(batch)
            return runner(batch)

        return audited

    def on_step(self, engine: Any, record: Any) -> None:
        self.records.append(record)

    def violations(self, engine: Any, report: "Report") -> list[str]:
        from ascendgraph.runtime.workload import RequestStatus

        problems = []
        states = engine.scheduler.states
        open_ids = [rid for rid, s in states.items() if s.status not in (RequestStatus.FINISHED, RequestStatus.FAILED)]
        if open_ids:
            problems.append(f"requests neither completed nor failed: {', '.join(open_ids)}")
        total = report.requests_total
        if report.requests_completed + report.requests_failed != total or total != len(states):
            problems.append(
                f"report counts {report.requests_completed} completed + {report.requests_failed} failed "
                f"of {total} (scheduler holds {len(states)})"
            )
        finished = {rid for rid, s in states.items() if s.status is RequestStatus.FINISHED}
        for index, batch in enumerate(self.batches):
            ids = [r.request_id for r in batch.requests]
            record = self.records[index] if index < len(self.records) else None
            wrong = record is None or not record.max_abs_diff <= engine.atol
            silent = sorted(finished.intersection(ids)) if wrong else []
            if silent:
                why = "was never checked" if record is None else f"differed from eager by {record.max_abs_diff:.3g}"
                problems.append(f"step {batch.step} {why} but requests {', '.join(silent)} completed (silently wrong)")
        return problems


def _namespace(scenario: Scenario) -> Any:
    import argparse

    from ascendgraph.cli.args import add_config_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_config_arguments(parser)
    namespace = parser.parse_args([])
    for key, value in scenario.config.items():
        setattr(namespace, key, value)
    return namespace


def _sim_device(scenario: Scenario, *, soc: str, stream_limit: Optional[int]) -> "Device":
    from ascendgraph.device import get_device

    spec = scenario.device
    profile: Any = spec.profile if spec.profile is not None else soc  # a name, a JSON path or a table
    options: dict[str, Any] = {"profile": profile, "seed": scenario.run.seed, "env": dict(spec.env)}
    if stream_limit is not None:
        options["stream_limit"] = stream_limit
    if spec.faults is not None:
        options["faults"] = spec.faults
    if spec.stream_error is not None:
        options["stream_error"] = spec.stream_error
    return get_device("sim", **options)


def _run_engine(scenario: Scenario) -> _Observation:
    """The same sequence as `ascendgraph.runtime.engine.run`, with the hooks the invariants need."""
    from ascendgraph.cli.args import config_from_args
    from ascendgraph.runtime.engine import Engine, EngineOptions
    from ascendgraph.runtime.workload import WorkloadSpec

    obs = _Observation()
    run, spec = scenario.run, scenario.device
    try:
        config = config_from_args(_namespace(scenario))
        stream_limit = scenario.config.get("stream_limit")
        options: dict[str, Any] = dict(
            requests=run.requests,
            seed=run.seed,
            workload_spec=WorkloadSpec(
                num_requests=run.requests, seed=run.seed, prompt_words=run.prompt_words,
                output_tokens=run.output_tokens, burst_size=run.burst_size, burst_gap=run.burst_gap,
            ),
            on_capture_error=run.on_capture_error,
            stream_limit=stream_limit,
            hccl_op_expansion_mode=scenario.config.get("hccl_op_expansion_mode"),
            dtype=run.dtype,
            atol=run.atol,
            debug=run.debug,
            progress=False,
            env=dict(spec.env),
            num_threads=run.num_threads,
            skip_param_update=run.skip_param_update,
            record_update_events=run.record_update_events,
        )
        if isinstance(spec.profile, dict) or spec.stream_error is not None:
            options["device"] = _sim_device(scenario, soc=config.soc, stream_limit=stream_limit)
        else:  # the path `ascendgraph run --device sim --sim-profile P --faults F` takes
            options.update(device="sim", sim_profile=spec.profile, faults=spec.faults)
        engine = Engine(config, EngineOptions(**options))
    except Exception as exc:
        obs.error, obs.traceback = exc, traceback.format_exc()
        obs.skipped["requests"] = obs.skipped["resources"] = "no engine was built (the configuration was rejected)"
        return obs

    obs.engine, obs.device = engine, engine.device
    audit = _RequestAudit(engine)
    device = engine.device
    before_capture = _figures(device.stats())
    resources: list[str] = []
    try:
        try:
            try:
                engine.capture()
            except RuntimeError as exc:
                obs.capture_failure = exc
                engine.error = exc
                engine.scheduler.fail_all(f"capture failed: {type(exc).__name__}")
            else:
                if engine.capture_fallback is not None:
                    obs.capture_failure = engine.capture_fallback
                    if not _device_lost(device):
                        resources += _compare_figures(
                            "after the eager fallback", before_capture, _figures(device.stats())
                        )
                try:
                    engine.serve()
                except Exception as exc:
                    engine.error = exc
                    engine.scheduler.fail_all(f"{type(exc).__name__}: {exc}")
            obs.report = engine.report()
        finally:
            engine.close()
    except Exception as exc:  # escaped the engine's own handling: an error outcome with its traceback
        obs.error, obs.traceback = exc, traceback.format_exc()
    if _device_lost(device):
        obs.skipped["resources"] = "the device was lost (every later call on it fails; a new device is needed)"
    else:
        resources += _compare_figures("after close", before_capture, _figures(device.stats()))
    obs.invariant_notes["resources"] = resources
    if obs.report is not None:
        obs.invariant_notes["requests"] = audit.violations(engine, obs.report)
        if obs.error is None:
            obs.error = obs.report.exception
    else:
        obs.skipped.setdefault("requests", "the run raised before it could report")
    return obs


def _classify(obs: _Observation) -> str:
    report = obs.report
    if report is None or not report.ok:
        return "error"
    if obs.capture_failure is not None or report.capture_fallback:
        return "fallback"
    rules = {d.get("rule") for d in report.decisions}
    if rules & set(FALLBACK_RULES):
        return "fallback"
    # A mode change by a rule not in the table is a fallback too — unless the user asked
    # for eager (--enforce-eager gets what it asked for).
    if report.effective_mode != report.requested_mode and "enforce_eager" not in rules:
        return "fallback"
    return "ok"


def _check_engine_expectations(scenario: Scenario, obs: _Observation, outcome: str) -> list[str]:
    expect = scenario.expect
    report = obs.report
    engine = obs.engine
    misses: list[str] = []
    failure = obs.error if outcome == "error" else obs.capture_failure

    if expect.error_type:
        if failure is None:
            misses.append(f"error_type: expected {expect.error_type}, but there was no error")
        elif not _exception_matches(failure, expect.error_type):
            misses.append(f"error_type: expected {expect.error_type}, got {type(failure).__name__}")
    for fragment in expect.message:
        if failure is None or fragment not in str(failure):
            misses.append(f"message: {fragment!r} not in the error text")

    need_report = [k for k in ("effective_mode", "requested_mode", "warning", "requests_failed", "graphs_captured")
                   if getattr(expect, k) is not None] + (["decisions"] if expect.decisions else [])
    if report is None and need_report:
        misses.append(f"{', '.join(need_report)}: no report (the run stopped before reporting)")
    if report is not None:
        if expect.effective_mode and report.effective_mode != expect.effective_mode:
            misses.append(f"effective_mode: expected {expect.effective_mode}, got {report.effective_mode}")
        if expect.requested_mode and report.requested_mode != expect.requested_mode:
            misses.append(f"requested_mode: expected {expect.requested_mode}, got {report.requested_mode}")
        rules = [d.get("rule") for d in report.decisions]
        for rule in expect.decisions:
            if rule not in rules:
                misses.append(f"decisions: no {rule!r} decision (got {', '.join(map(str, rules))})")
        if expect.warning and not any(expect.warning in w for w in report.warnings):
            misses.append(f"warning: {expect.warning!r} not among the warnings {report.warnings}")
        if expect.requests_failed:
            failed, total = report.requests_failed, report.requests_total
            actual = "none" if failed == 0 else "all" if failed == total else "some"
            if actual != expect.requests_failed:
                misses.append(f"requests_failed: expected {expect.requests_failed}, got {failed} of {total} ({actual})")
        if expect.graphs_captured is not None and report.graphs_captured != expect.graphs_captured:
            misses.append(f"graphs_captured: expected {expect.graphs_captured}, got {report.graphs_captured}")

    resolution = engine.resolution if engine is not None else None
    if expect.capture_sizes is not None:
        sizes = tuple(resolution.capture_sizes) if resolution is not None else None
        if sizes != expect.capture_sizes:
            misses.append(f"capture_sizes: expected {list(expect.capture_sizes)}, got {list(sizes) if sizes is not None else 'no resolution'}")
    plan = resolution.stream_plan if resolution is not None else None
    if expect.stream_plan_fits is not None or expect.stream_plan_max_sizes is not None or expect.fails_at_planned_size:
        if plan is None:
            misses.append("stream plan: the resolution has none (no capture sizes, or mode NONE)")
        else:
            if expect.stream_plan_fits is not None and plan.fits != expect.stream_plan_fits:
                misses.append(f"stream_plan_fits: expected {expect.stream_plan_fits}, got {plan.fits}")
            if expect.stream_plan_max_sizes is not None and plan.max_num_sizes != expect.stream_plan_max_sizes:
                misses.append(f"stream_plan_max_sizes: expected {expect.stream_plan_max_sizes}, got {plan.max_num_sizes}")
    captured_before = getattr(obs.capture_failure, "graphs_captured", None)
    if expect.graphs_captured_before_failure is not None and captured_before != expect.graphs_captured_before_failure:
        misses.append(
            f"graphs_captured_before_failure: expected {expect.graphs_captured_before_failure}, got {captured_before}"
        )
    if expect.fails_at_planned_size and plan is not None:
        planned = plan.first_failing_index()
        failed_at = None if captured_before is None else captured_before // plan.graphs_per_size
        if planned is None or failed_at != planned:
            misses.append(
                f"fails_at_planned_size: capture failed at size index {failed_at} ({captured_before} graphs, "
                f"{plan.graphs_per_size} per size); the planner's first failing index is {planned}"
            )
    return misses


def run_scenario(scenario: Scenario) -> ScenarioResult:
    """Run a scenario on the simulator and judge it. Never raises for a failed run: what
    went wrong is in the result (``passed``, ``mismatches``, ``explain()``)."""
    _warm_imports()
    state_before = ProcessState.capture()
    start = time.perf_counter()
    if scenario.kind == "engine":
        obs = _run_engine(scenario)
        outcome = "error" if obs.report is None else _classify(obs)
        if obs.report is not None and obs.report.ok and obs.error is not None:
            outcome = "error"
    else:
        obs = _run_device_action(scenario)
        outcome = "error" if obs.error is not None else "ok"
    seconds = time.perf_counter() - start
    state_after = ProcessState.capture()

    result = ScenarioResult(scenario, outcome, seconds, report=obs.report)
    result.error = obs.error if outcome == "error" else obs.capture_failure
    expect = scenario.expect
    if outcome != expect.outcome:
        detail = ""
        if result.error is not None:
            text = str(result.error).strip()
            detail = f" ({type(result.error).__name__}: {text.splitlines()[0] if text else ''})"
        result.mismatches.append(f"outcome: expected {expect.outcome}, got {outcome}{detail}")
    if scenario.kind == "engine":
        result.mismatches += _check_engine_expectations(scenario, obs, outcome)
    else:
        result.mismatches += _check_device_expectations(scenario, obs)
    # A traceback helps with an unexpected crash, not with a refused configuration (its one
    # line says what was wrong, as the CLI would).
    refused = isinstance(result.error, (ConfigError, GraphModeError))
    if result.error is not None and not refused and expect.error_type and not _exception_matches(result.error, expect.error_type):
        result.traceback = obs.traceback
    elif result.error is not None and not refused and expect.outcome == "ok":
        result.traceback = obs.traceback

    notes = dict(obs.invariant_notes)
    notes["global_state"] = state_before.differences(state_after)
    if obs.device is not None and "empty_cache" in vars(obs.device):
        notes["global_state"].append("the device's empty_cache is still replaced by a stub")
    for name in INVARIANT_NAMES:
        if not getattr(scenario.invariants, name):
            result.invariants[name] = "skipped: off in the scenario file"
        elif name in obs.skipped:
            result.invariants[name] = f"skipped: {obs.skipped[name]}"
        elif name not in notes:
            result.invariants[name] = "skipped: not applicable to a device action" if name == "requests" else "skipped"
        elif notes[name]:
            result.invariants[name] = "violated: " + "; ".join(notes[name])
            result.mismatches.append(f"invariant {name}: " + "; ".join(notes[name]))
        else:
            result.invariants[name] = "held"
    return result


# --------------------------------------------------------------------------- device actions
# Theory: one named misuse (or one plain use) of the device API, small enough to read in a
# breath. An action creates its graphs through the context (so they are released after),
# calls ``ctx.checkpoint()`` right before the step that may fail (the resources invariant
# compares the device after a failure with that checkpoint), and raises the device's
# error, or NumericalMismatch when a replay produced a wrong value.


class _ActionContext:
    def __init__(self, device: Any) -> None:
        self.device = device
        self.graphs: list[Any] = []
        self.wrappers: list[Any] = []
        self.mark: Optional[dict[str, int]] = None

    def new_graph(self) -> Any:
        graph = self.device.new_graph()
        self.graphs.append(graph)
        return graph

    def checkpoint(self) -> None:
        self.mark = _figures(self.device.stats())

    def release(self) -> None:
        for wrapper in self.wrappers:
            wrapper.release()
        for graph in self.graphs:
            try:
                graph.reset()
            except Exception:  # a lost device refuses everything
                pass
        self.graphs.clear()
        self.wrappers.clear()


def _expect_values(actual: Any, expected: Any, what: str) -> None:
    import torch

    from ascendgraph.errors import NumericalMismatch

    if not torch.equal(actual, expected):
        raise NumericalMismatch(f"{what}: replay gave {actual.tolist()}, expected {expected.tolist()}")


def _action_capture_graphs(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Capture ``count`` small graphs on one pool, replay them with new input, check each."""
    import torch

    device = ctx.device
    pool = device.graph_pool_handle() if args["shared_pool"] else None
    x = torch.arange(4, dtype=torch.float32)
    outputs = []
    for index in range(args["count"]):
        graph = ctx.new_graph()
        ctx.checkpoint()
        with device.graph(graph, pool=pool, graph_kind=args["graph_kind"]):
            outputs.append(x * (index + 2) + 1)
    x.copy_(torch.full((4,), 3.0))
    for graph in ctx.graphs:
        ctx.checkpoint()
        graph.replay()
    device.synchronize()
    for index, out in enumerate(outputs):
        _expect_values(out, torch.full((4,), 3.0 * (index + 2) + 1), f"graph {index}")


_HOST_SYNCS: Mapping[str, Callable[[Any], Any]] = {
    "item": lambda t: t.sum().item(),
    "tolist": lambda t: t.tolist(),
    "cpu": lambda t: t.cpu(),
    "bool": lambda t: bool(t.sum() > 0),
    "nonzero": lambda t: t.nonzero(),
}


def _action_host_sync(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Read a device value on the host (``call``) inside a captured region."""
    import torch

    device = ctx.device
    x = torch.ones(4)
    graph = ctx.new_graph()
    ctx.checkpoint()
    with device.graph(graph):
        y = x * 2
        if args["call"] == "synchronize":
            device.synchronize()
        else:
            _HOST_SYNCS[args["call"]](y)


def _action_capture_on_default_stream(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Capture on the default stream instead of a side stream."""
    import torch

    device = ctx.device
    x = torch.ones(4)
    graph = ctx.new_graph()
    ctx.checkpoint()
    with device.graph(graph, stream=device.default_stream()):
        x + 1


def _action_replay_before_capture(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Replay a graph that was never captured."""
    graph = ctx.new_graph()
    ctx.checkpoint()
    graph.replay()


def _action_capture_twice(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Capture a second time into a graph that already holds a capture."""
    import torch

    device = ctx.device
    x = torch.ones(4)
    graph = ctx.new_graph()
    with device.graph(graph):
        x + 1
    ctx.checkpoint()
    with device.graph(graph):
        x + 2


def _action_rng_in_capture(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """Draw random numbers inside a captured region."""
    import torch

    device = ctx.device
    graph = ctx.new_graph()
    ctx.checkpoint()
    with device.graph(graph):
        torch.rand(4, generator=torch.Generator().manual_seed(0))


def _action_wrapper_replay(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """A FULL GraphWrapper in debug mode: capture with one input tensor, replay with another
    (``new_address``) or the same one refilled."""
    import torch

    from ascendgraph.runtime.capture import GraphOptions, GraphWrapper
    from ascendgraph.dispatch import BatchDescriptor
    from ascendgraph.runtime.forward_context import ForwardContext, set_forward_context
    from ascendgraph.modes import GraphMode

    device = ctx.device
    wrapper = GraphWrapper(lambda t: t * 2 + 1, GraphMode.FULL, device, options=GraphOptions(debug=True, label="scenario"))
    ctx.wrappers.append(wrapper)
    context = ForwardContext(GraphMode.FULL, BatchDescriptor(4), None, {})
    captured_input = torch.zeros(4)
    with set_forward_context(context):
        ctx.checkpoint()
        wrapper(captured_input)
        replay_input = torch.zeros(4) if args["new_address"] else captured_input
        replay_input.copy_(torch.full((4,), 3.0))
        ctx.checkpoint()
        out = wrapper(replay_input)
    device.synchronize()
    _expect_values(out, torch.full((4,), 7.0), "wrapper replay")


def _action_external_event(ctx: _ActionContext, args: Mapping[str, Any]) -> None:
    """A graph that waits on an ExternalEvent; replay it and synchronize, recording the
    event in between only when ``record`` is true."""
    import torch

    device = ctx.device
    event = device.new_external_event()
    x = torch.ones(4)
    graph = ctx.new_graph()
    with device.graph(graph):
        event.wait()
        event.reset()
        out = x + 1
    x.copy_(torch.full((4,), 5.0))
    graph.replay()
    if args["record"]:
        event.record(device.new_stream())
    ctx.checkpoint()
    device.synchronize()
    _expect_values(out, torch.full((4,), 6.0), "graph after the event")


@dataclass(frozen=True)
class DeviceAction:
    """A named device action: what it does, its parameters (check, default, description)."""

    name: str
    run: Callable[[_ActionContext, Mapping[str, Any]], None]
    description: str
    params: Mapping[str, tuple[Check, Any, str]] = field(default_factory=dict)


DEVICE_ACTIONS: Mapping[str, DeviceAction] = {
    action.name: action
    for action in (
        DeviceAction(
            "capture_graphs", _action_capture_graphs,
            "capture `count` small graphs, replay them with new input and check every value",
            {
                "count": (POSITIVE, 3, "how many graphs"),
                "graph_kind": (_one_of("full", "piecewise"), "full", "the stream charge"),
                "shared_pool": (BOOL, True, "capture into one graph_pool_handle()"),
            },
        ),
        DeviceAction(
            "host_sync_in_capture", _action_host_sync,
            "read a value on the host inside a captured region",
            {"call": (_one_of(*_HOST_SYNCS, "synchronize"), "item", "the host synchronization")},
        ),
        DeviceAction("capture_on_default_stream", _action_capture_on_default_stream,
                     "capture on the default stream"),
        DeviceAction("replay_before_capture", _action_replay_before_capture,
                     "replay a graph that was never captured"),
        DeviceAction("capture_twice", _action_capture_twice,
                     "capture again into a graph that already owns a capture"),
        DeviceAction("rng_in_capture", _action_rng_in_capture,
                     "draw random numbers inside a captured region"),
        DeviceAction(
            "wrapper_replay", _action_wrapper_replay,
            "a debug-mode FULL GraphWrapper replayed with the captured input or a new tensor",
            {"new_address": (BOOL, True, "replay with a different input tensor")},
        ),
        DeviceAction(
            "external_event_replay", _action_external_event,
            "replay a graph waiting on an ExternalEvent, then synchronize",
            {"record": (BOOL, False, "record the event before synchronizing")},
        ),
    )
}


def _run_device_action(scenario: Scenario) -> _Observation:
    obs = _Observation()
    try:
        device = _sim_device(scenario, soc="A2", stream_limit=scenario.device.stream_limit)
    except Exception as exc:
        obs.error, obs.traceback = exc, traceback.format_exc()
        obs.skipped["resources"] = "no device was built"
        return obs
    obs.device = device
    ctx = _ActionContext(device)
    initial = _figures(device.stats())
    resources: list[str] = []
    try:
        DEVICE_ACTIONS[scenario.action or ""].run(ctx, scenario.action_args)
    except Exception as exc:
        obs.error, obs.traceback = exc, traceback.format_exc()
        exc.__traceback__ = None  # drop the frames: they hold the action's tensors and graphs
        if ctx.mark is not None and not _device_lost(device):
            resources += _compare_figures("after the failure", ctx.mark, _figures(device.stats()))
    finally:
        ctx.release()
    if _device_lost(device):
        obs.skipped["resources"] = "the device was lost (every later call on it fails; a new device is needed)"
    else:
        resources += _compare_figures("after releasing the action's graphs", initial, _figures(device.stats()))
        obs.invariant_notes["resources"] = resources
    return obs


def _check_device_expectations(scenario: Scenario, obs: _Observation) -> list[str]:
    expect = scenario.expect
    misses = []
    if expect.error_type:
        if obs.error is None:
            misses.append(f"error_type: expected {expect.error_type}, but there was no error")
        elif not _exception_matches(obs.error, expect.error_type):
            misses.append(f"error_type: expected {expect.error_type}, got {type(obs.error).__name__}")
    for fragment in expect.message:
        if obs.error is None or fragment not in str(obs.error):
            misses.append(f"message: {fragment!r} not in the error text")
    return misses


# --------------------------------------------------------------------------- catalogue


def catalogue_table(scenarios: Sequence[Scenario]) -> str:
    """The Markdown catalogue table (docs/faults.md keeps it in sync; a test checks)."""
    lines = [
        "| scenario | kind | what happens | expected |",
        "|---|---|---|---|",
    ]
    for scenario in sorted(scenarios, key=lambda s: s.name):
        expected = scenario.expect.outcome
        if scenario.expect.error_type:
            expected += f" `{scenario.expect.error_type}`"
        if scenario.expect.effective_mode and scenario.expect.outcome == "fallback":
            expected += f" → {scenario.expect.effective_mode}"
        description = scenario.description.replace("|", "\\|")
        lines.append(f"| `{scenario.name}` | {scenario.kind} | {description} | {expected} |")
    return "\n".join(lines)
