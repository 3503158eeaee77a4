"""The read-only contract of shared engine runs is checked, not trusted (tests/engine/helpers.py)."""

from __future__ import annotations

from dataclasses import replace

from tests.engine.helpers import SharedRuns, run_fingerprint, small_config

# The mode grid's FULL_DECODE_ONLY run (tests/engine/test_engine_modes.py): usually built already.
CONFIG = small_config("FULL_DECODE_ONLY", model="tiny", backend="ascend")


def test_a_shared_run_is_built_once_per_worker_and_handed_out_as_the_same_object(_shared_runs: SharedRuns):
    built = _shared_runs.built
    key, first = _shared_runs.get(CONFIG)
    again_key, again = _shared_runs.get(CONFIG)
    assert again is first and again_key == key
    assert _shared_runs.built - built <= 1
    assert SharedRuns.key(CONFIG, {}) != SharedRuns.key(CONFIG, {"dtype": "float32"})


def test_changing_any_part_a_test_can_read_breaks_the_fingerprint(_shared_runs: SharedRuns):
    key, run = _shared_runs.get(CONFIG)
    assert _shared_runs.changed([key]) == []
    first_step = run.steps[0]
    changes = [
        (lambda: run.report.notes.append("written by a test"), lambda: run.report.notes.pop()),
        (lambda: run.steps.append(run.steps[0]), lambda: run.steps.pop()),
        (lambda: run.steps.__setitem__(0, replace(first_step, num_tokens=first_step.num_tokens + 1)),
         lambda: run.steps.__setitem__(0, first_step)),
        (lambda: setattr(run.report, "requests_completed", run.report.requests_completed - 1),
         lambda: setattr(run.report, "requests_completed", run.report.requests_completed + 1)),
        (lambda: setattr(run.engine, "error", RuntimeError("written by a test")),
         lambda: setattr(run.engine, "error", None)),
    ]
    for change, undo in changes:
        change()
        try:
            assert _shared_runs.changed([key]) == [key]
        finally:
            undo()
        assert _shared_runs.changed([key]) == []
    assert run_fingerprint(run) == _shared_runs.fingerprints[key]
