"""Running an engine scenario and judging what it observed (`run_scenario`)."""

from __future__ import annotations

import time
import traceback
from typing import Any

from ascendgraph.errors import ConfigError, GraphModeError
from ascendgraph.tools.scenario.actions import _check_device_expectations, _run_device_action
from ascendgraph.tools.scenario.model import FALLBACK_RULES, INVARIANT_NAMES, Scenario
from ascendgraph.tools.scenario.observation import (
    ScenarioResult, _compare_figures, _device_lost, _exception_matches, _figures, _namespace, _Observation,
    _RequestAudit, _sim_device,
)
from ascendgraph.tools.scenario.state import ProcessState, _warm_imports


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
        if isinstance(spec.profile, dict) or spec.stream_error is not None or spec.require_task_updates is not None:
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
        obs.report.settle_after_release(device)  # as `run` reports it: what the device holds now
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
