"""Reading and checking scenario files: `load_scenario` validates a file completely when it
is loaded, with the checks the CLI applies to the same flags, and raises `ScenarioError`
naming the file, the key and the value."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence, Union

from ascendgraph.errors import ConfigError, GraphModeError
from ascendgraph.readers import load_toml, read_text_file
from ascendgraph.device import check_device_options
from ascendgraph.tools.scenario.actions import DEVICE_ACTIONS
from ascendgraph.tools.scenario.model import (
    BOOL, INT, INT_LIST, INVARIANT_NAMES, NON_NEGATIVE, OUTCOMES, POSITIVE, RANGE, REQUESTS_FAILED, SCENARIO_KINDS,
    STR, STR_LIST, STR_OR_STR_LIST, STR_TABLE, Check, DeviceSpec, Expectation, Invariants, RunSpec, Scenario,
    ScenarioError, _is_number, _mode_name, _one_of, config_namespace,
)


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
    "require_task_updates": BOOL,
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
    if not isinstance(name, str) or name not in DEVICE_ACTIONS:
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
    if not os.path.lexists(path):
        raise ScenarioError(path, "(file)", "no such file")
    try:
        text = read_text_file(path, "", kind="TOML scenario file")
    except ConfigError as exc:
        raise ScenarioError(path, "(file)", str(exc)) from None
    try:
        data = load_toml(text, "")
    except ConfigError as exc:
        raise ScenarioError(path, "(file)", " ".join(str(exc).replace("invalid TOML", "not valid TOML").split())) from None
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
    if "profile" in device:
        _check_profile(path, device["profile"])

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
        model = _check_config_values(path, config)
        run = _check_table(path, "run", data.get("run", {}), RUN_KEYS)
        _check_run_budget(path, run, model)
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
            require_task_updates=device.get("require_task_updates"),
        ),
        run=RunSpec(**{k: tuple(v) if isinstance(v, list) else v for k, v in run.items()}),  # type: ignore[arg-type]  # checked field by field above
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


def _check_profile(path: Path, profile: Union[str, Mapping[str, Any]]) -> None:
    """A profile name, a profile JSON file (next to the scenario or absolute) or a table, as
    ``--sim-profile`` checks it."""
    if isinstance(profile, str) and profile.strip().lower().endswith(".json") and not os.path.isabs(profile):
        profile = str(path.parent / profile)
    try:
        check_device_options("sim", profile=dict(profile) if isinstance(profile, Mapping) else profile)
    except ConfigError as exc:
        raise ScenarioError(path, "[device] profile", " ".join(str(exc).split())) from None


def _config_where(key: Optional[str], config: Mapping[str, Any]) -> str:
    """The [config] key a ConfigError from building the configuration is about."""
    name = (key or "").lstrip("-").replace("-", "_")
    for candidate in (name, name.split(".")[0]):
        if candidate in config:
            return f"[config] {candidate}"
    for json_flag in _JSON_FLAGS:
        if json_flag in config and (name.startswith(json_flag) or isinstance(config[json_flag], (str, dict))
                                    and name and name.split(".")[-1] in str(config[json_flag])):
            return f"[config] {json_flag}"
    return "[config]"


def _check_config_values(path: Path, config: Mapping[str, Any]) -> Any:
    """Build the configuration as `ascendgraph run` would from the same flags, so a value the
    CLI refuses (optimization_level = 7, cudagraph_mode = 5, enable_static_kernel = "yes")
    is a bad file now, not a "run failure" later. Rules about combinations of values (a
    static kernel without npugraph_ex, ...) stay for the run: scenarios exist to test them.
    Returns the model spec (for the workload bounds)."""
    from ascendgraph.cli.args import config_from_args

    try:
        graph_config = config_from_args(config_namespace(config), warn=False)
    except (ConfigError, GraphModeError) as exc:
        if _is_combination_rule(exc):
            from ascendgraph.models.presets import model_spec_from

            return model_spec_from(config.get("model"))
        raise ScenarioError(path, _config_where(getattr(exc, "key", None), config), " ".join(str(exc).split())) from None
    return graph_config.model


def _is_combination_rule(exc: BaseException) -> bool:
    """Errors a scenario may expect from a run: rules on combinations of values
    (docs/semantics.md §10's kernel chain), not on one value."""
    from ascendgraph.config import STATIC_NEEDS_NPUGRAPH_EX, SUPER_NEEDS_STATIC

    return str(exc) in (SUPER_NEEDS_STATIC, STATIC_NEEDS_NPUGRAPH_EX)


def _check_run_budget(path: Path, run: Mapping[str, Any], model: Any) -> None:
    """[run] values within the bounds the CLI and the engine apply (checked now, not mid-run)."""
    from ascendgraph.api import MAX_RUN_ATOL as MAX_ATOL
    from ascendgraph.cli.args import LIMITS, MAX_SIMULATED_REQUESTS
    from ascendgraph.runtime.workload import MAX_SEQUENCE_TOKENS

    # requests: the most a run serves (the engine refuses more), not only the CLI's type bound
    bounds = {"requests": (1, MAX_SIMULATED_REQUESTS), "seed": LIMITS["seed"],
              "burst_size": (0, LIMITS["requests"][1]), "burst_gap": (1, LIMITS["requests"][1])}
    if "num_threads" in run:  # (imports torch: only when the file sets it)
        from ascendgraph.runtime.threads import MAX_THREADS

        bounds["num_threads"] = (1, MAX_THREADS)
    for key, (low, high) in bounds.items():
        if key in run and not low <= run[key] <= high:
            hint = ("; a larger workload is for `ascendgraph plan --workload FILE`"
                    if key == "requests" and run[key] > high else "")
            raise ScenarioError(path, f"[run] {key}", f"expected an integer from {low} to {high}, got {run[key]!r}{hint}")
    if "atol" in run and run["atol"] > MAX_ATOL:
        raise ScenarioError(path, "[run] atol", f"expected at most {MAX_ATOL:g} (as --atol), got {run['atol']!r}")
    limit = min(model.max_position_embeddings, MAX_SEQUENCE_TOKENS)
    prompt = run.get("prompt_words", RunSpec.prompt_words)
    output = run.get("output_tokens", RunSpec.output_tokens)
    for key, (low, high) in (("prompt_words", prompt), ("output_tokens", output)):
        if high > limit:
            raise ScenarioError(path, f"[run] {key}", f"expected a range within the model's {limit} positions, "
                                                       f"got [{low}, {high}]")
    if prompt[1] + output[1] > limit:
        raise ScenarioError(path, "[run] output_tokens", f"the longest prompt ({prompt[1]} words) plus the longest "
                                                          f"output ({output[1]} tokens) exceed the model's {limit} positions")


MAX_SCENARIO_FILES = 10_000  # a folder with more scenario files than this is not a scenario folder


def discover_scenarios(paths: Sequence[Union[str, Path]]) -> list[Path]:
    """Scenario files from files and folders (folders: every *.toml below, sorted)."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Everything named *.toml that is not a folder: a FIFO or a device among them is refused
            # by name when it is read (`load_scenario`), never skipped in silence or read blocking.
            files = []
            for candidate in path.rglob("*.toml"):
                if not candidate.is_dir():
                    files.append(candidate)
                if len(files) > MAX_SCENARIO_FILES:
                    raise ScenarioError(path, "(folder)", f"holds more than {MAX_SCENARIO_FILES} *.toml files; "
                                                          "pass a smaller folder")
            if not files:
                raise ScenarioError(path, "(folder)", "holds no *.toml scenario files")
            found.extend(sorted(files))
        elif os.path.lexists(path):
            found.append(path)  # a file, or something that is not one: `load_scenario` says which
        else:
            raise ScenarioError(path, "(path)", "no such file or folder")
    return found
