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

Modules: `model` (what a file holds), `loading` (reading and checking a file completely
when it is loaded), `actions` (device scenarios), `observation` and `running` (running and
judging), `state` (the process-wide state a run must not change), `catalogue` (docs table).

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

from ascendgraph.tools.scenario.actions import DEVICE_ACTIONS
from ascendgraph.tools.scenario.catalogue import catalogue_table
from ascendgraph.tools.scenario.loading import discover_scenarios, load_scenario
from ascendgraph.tools.scenario.model import (
    FALLBACK_RULES,
    OUTCOMES,
    SCENARIO_KINDS,
    DeviceSpec,
    Expectation,
    Invariants,
    RunSpec,
    Scenario,
    ScenarioError,
)
from ascendgraph.tools.scenario.observation import ScenarioResult
from ascendgraph.tools.scenario.running import run_scenario
from ascendgraph.tools.scenario.state import ProcessState

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
