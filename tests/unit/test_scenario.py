"""Scenario files: loading (bad files name the file, the key and what was expected), judging
runs (outcome, error, invariants) and catching the leaks the invariants exist for."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
import torch

from ascendgraph.tools.scenario import (
    DEVICE_ACTIONS,
    ProcessState,
    ScenarioError,
    load_scenario,
    run_scenario,
)

ENGINE_CONFIG = """
[config]
num_layers = 2
max_num_seqs = 2
max_num_batched_tokens = 8
compilation_config = { cudagraph_mode = "PIECEWISE", cudagraph_capture_sizes = [4] }

[run]
requests = 2
"""


def write(tmp_path: Path, text: str, name: str = "case.toml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --------------------------------------------------------------------------- loading

BAD_FILES = [
    ("not toml", "description = \n", "(file)", "not valid TOML"),
    ("unknown top key", "descriptoin = 'x'\n[expect]\noutcome='ok'\n", "descriptoin", "did you mean 'description'"),
    ("bad kind", "kind='gpu'\ndescription='x'\n[expect]\noutcome='ok'\n", "kind", "expected one of engine, device"),
    ("no description", "[expect]\noutcome='ok'\n", "description", "non-empty string"),
    ("no expect", "description='x'\n", "[expect]", "missing"),
    ("no outcome", "description='x'\n[expect]\nerror_type='X'\n", "[expect] outcome", "missing"),
    ("bad outcome", "description='x'\n[expect]\noutcome='okay'\n", "[expect] outcome", "'ok', 'error', 'fallback'"),
    ("error without type", "description='x'\n[expect]\noutcome='error'\n", "[expect] error_type", "names the error class"),
    ("ok with a type", "description='x'\n[expect]\noutcome='ok'\nerror_type='X'\n", "[expect] error_type", "only with outcome"),
    ("bad mode name", "description='x'\n[expect]\noutcome='ok'\neffective_mode='FAST'\n", "[expect] effective_mode", "FULL_DECODE_ONLY"),
    ("bad requests_failed", "description='x'\n[expect]\noutcome='ok'\nrequests_failed=0\n", "[expect] requests_failed", "'none', 'some', 'all'"),
    ("unknown config flag", "description='x'\n[config]\nmax_num_seq=4\n[expect]\noutcome='ok'\n", "[config] max_num_seq", "did you mean 'max_num_seqs'"),
    ("config value the CLI refuses", "description='x'\n[config]\nmax_num_seqs=0\n[expect]\noutcome='ok'\n", "[config] max_num_seqs", "positive integer"),
    ("run flag in config", "description='x'\n[config]\nfaults='x'\n[expect]\noutcome='ok'\n", "[config] faults", "[device] faults"),
    ("switch not a bool", "description='x'\n[config]\nenforce-eager='yes'\n[expect]\noutcome='ok'\n", "[config] enforce-eager", "true or false"),
    ("bad choice", "description='x'\n[config]\nsoc='A9'\n[expect]\noutcome='ok'\n", "[config] soc", "A2, A3, 310P, A5"),
    ("json flag of the wrong type", "description='x'\n[config]\ncompilation_config=3\n[expect]\noutcome='ok'\n", "[config] compilation_config", "table or a JSON string"),
    ("bad run value", "description='x'\n[run]\nrequests=-1\n[expect]\noutcome='ok'\n", "[run] requests", "an integer >= 1"),
    # more than a run serves: refused at load, so an `outcome = "error"` cannot pass on the engine's refusal
    ("more requests than a run serves", "description='x'\n[run]\nrequests=5000\n[expect]\noutcome='error'\nerror_type='ConfigError'\n",
     "[run] requests", "from 1 to 1000, got 5000; a larger workload is for `ascendgraph plan --workload FILE`"),
    ("unknown run key", "description='x'\n[run]\nreqests=1\n[expect]\noutcome='ok'\n", "[run] reqests", "did you mean 'requests'"),
    ("bad range", "description='x'\n[run]\nprompt_words=[5, 2]\n[expect]\noutcome='ok'\n", "[run] prompt_words", "low <= high"),
    ("bad fault plan", "description='x'\n[device]\nfaults='capture=raise(207008)'\n[expect]\noutcome='ok'\n", "[device] faults", "unknown site 'capture'"),
    ("bad profile table", "description='x'\n[device]\nprofile={ base='A2', memory=1 }\n[expect]\noutcome='ok'\n", "[device] profile", "unknown keys memory"),
    ("env not strings", "description='x'\n[device]\nenv={ TASK_QUEUE_ENABLE=2 }\n[expect]\noutcome='ok'\n", "[device] env", "table of strings"),
    ("engine stream_limit in device", "description='x'\n[device]\nstream_limit=3\n[expect]\noutcome='ok'\n", "[device] stream_limit", "[config] stream_limit"),
    ("engine scenario with an action", "description='x'\n[action]\nname='replay_before_capture'\n[expect]\noutcome='ok'\n", "[action]", "only device scenarios"),
    ("device scenario with config", "kind='device'\ndescription='x'\n[config]\nsoc='A2'\n[expect]\noutcome='ok'\n", "[config]", "only engine scenarios"),
    ("device scenario without action", "kind='device'\ndescription='x'\n[expect]\noutcome='ok'\n", "[action]", "missing"),
    ("unknown action", "kind='device'\ndescription='x'\n[action]\nname='replay_befor_capture'\n[expect]\noutcome='ok'\n", "[action] name", "did you mean 'replay_before_capture'"),
    ("unknown action parameter", "kind='device'\ndescription='x'\n[action]\nname='capture_graphs'\ncont=2\n[expect]\noutcome='ok'\n", "[action] cont", "did you mean 'count'"),
    ("bad action parameter", "kind='device'\ndescription='x'\n[action]\nname='capture_graphs'\ncount=0\n[expect]\noutcome='ok'\n", "[action] count", "an integer >= 1"),
    ("device fallback", "kind='device'\ndescription='x'\n[action]\nname='capture_graphs'\n[expect]\noutcome='fallback'\n", "[expect] outcome", "no fallback"),
    ("engine-only expectation", "kind='device'\ndescription='x'\n[action]\nname='capture_graphs'\n[expect]\noutcome='ok'\ngraphs_captured=3\n", "[expect] graphs_captured", "only an engine scenario"),
    ("unknown invariant", "description='x'\n[invariants]\nleaks=true\n[expect]\noutcome='ok'\n", "[invariants] leaks", "requests, resources, global_state"),
]


@pytest.mark.parametrize("text, key, expected", [case[1:] for case in BAD_FILES], ids=[case[0] for case in BAD_FILES])
def test_a_bad_scenario_file_names_the_file_the_key_and_what_was_expected(tmp_path, text, key, expected):
    path = write(tmp_path, text)
    with pytest.raises(ScenarioError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: {key}: "), message
    assert expected in message, message
    assert "\n" not in message, "a bad file is reported on one line"


def test_a_missing_file_is_a_scenario_error(tmp_path):
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "absent.toml")


def test_a_config_table_is_read_with_the_cli_flag_converters(tmp_path):
    path = write(tmp_path, """
        description = "x"
        [config]
        max-num-seqs = "4"
        soc = "a5"
        enforce_eager = false
        compilation_config = '{"cudagraph_mode": "FULL"}'
        [expect]
        outcome = "ok"
    """)
    scenario = load_scenario(path)
    assert scenario.config == {
        "max_num_seqs": 4, "soc": "A5", "enforce_eager": None, "compilation_config": '{"cudagraph_mode": "FULL"}'
    }
    assert scenario.name == "case" and scenario.kind == "engine"


def test_a_relative_model_path_is_resolved_next_to_the_scenario_file(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2, "hidden_size": 512, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 128, '
        '"intermediate_size": 1024, "vocab_size": 2048}'
    )  # a valid config.json: the model is resolved at load, as --model would be
    scenario = load_scenario(write(tmp_path, "description='x'\n[config]\nmodel='model'\n[expect]\noutcome='ok'\n"))
    assert scenario.config["model"] == str(tmp_path / "model")


def test_every_device_action_parameter_has_a_default_that_passes_its_own_check():
    for action in DEVICE_ACTIONS.values():
        for name, ((check, expected), default, _) in action.params.items():
            assert check(default), f"{action.name}.{name}: default {default!r} is not {expected}"


# --------------------------------------------------------------------------- judging


def device_scenario(tmp_path: Path, action: str, expect: str, **params) -> Path:
    lines = [f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in params.items()]
    return write(tmp_path, f"kind = 'device'\ndescription = 'x'\n[action]\nname = '{action}'\n"
                 + "\n".join(lines) + f"\n[expect]\n{expect}\n")


def test_a_scenario_that_meets_its_expectation_passes_with_every_invariant_held(tmp_path):
    path = device_scenario(tmp_path, "replay_before_capture", "outcome = 'error'\nerror_type = 'CaptureConstraintError'\n"
                           "message = 'without a preceding successful capture'")
    result = run_scenario(load_scenario(path))
    assert result.passed, result.explain()
    assert result.outcome == "error" and type(result.error).__name__ == "CaptureConstraintError"
    assert result.invariants == {
        "requests": "skipped: not applicable to a device action", "resources": "held", "global_state": "held"
    }


@pytest.mark.parametrize(
    "expect, miss",
    [
        ("outcome = 'ok'", "outcome: expected ok, got error (CaptureConstraintError: Called NPUGraph::replay"),
        ("outcome = 'error'\nerror_type = 'GraphHang'", "error_type: expected GraphHang, got CaptureConstraintError"),
        ("outcome = 'error'\nerror_type = 'RuntimeError'\nmessage = ['replay', 'no such words']",
         "message: 'no such words' not in the error text"),
    ],
    ids=["wrong outcome", "wrong error type", "missing message fragment"],
)
def test_a_scenario_that_misses_its_expectation_fails_and_says_how(tmp_path, expect, miss):
    result = run_scenario(load_scenario(device_scenario(tmp_path, "replay_before_capture", expect)))
    assert not result.passed
    assert any(m.startswith(miss) for m in result.mismatches), result.mismatches
    assert miss in result.explain()


def test_an_error_type_matches_its_base_classes(tmp_path):
    path = device_scenario(tmp_path, "host_sync_in_capture", "outcome = 'error'\nerror_type = 'CaptureError'", call="tolist")
    assert run_scenario(load_scenario(path)).passed


def test_a_replay_that_returns_wrong_values_is_an_error_not_a_pass(tmp_path, monkeypatch):
    path = device_scenario(tmp_path, "wrapper_replay", "outcome = 'ok'", new_address=False)
    assert run_scenario(load_scenario(path)).passed
    # A wrapper bug that hands back the wrong tensor must surface as NumericalMismatch.
    monkeypatch.setattr("ascendgraph.compile.graph_wrapper.GraphWrapper._replay", lambda self, entry, args: torch.zeros(4))
    result = run_scenario(load_scenario(path))
    assert result.outcome == "error" and type(result.error).__name__ == "NumericalMismatch", result.explain()
    assert not result.passed


def test_process_state_names_what_changed(monkeypatch):
    before = ProcessState.capture()
    threads = torch.get_num_threads()
    with torch.random.fork_rng(devices=[]):
        try:
            torch.set_num_threads(threads + 1)
            os.environ["ASCENDGRAPH_SCENARIO_PROBE"] = "1"
            torch.rand(1)
            changes = before.differences(ProcessState.capture())
        finally:
            torch.set_num_threads(threads)
            os.environ.pop("ASCENDGRAPH_SCENARIO_PROBE", None)
    text = "\n".join(changes)
    assert f"torch intra-op threads changed: {threads} -> {threads + 1}" in text
    assert "ASCENDGRAPH_SCENARIO_PROBE=None->'1'" in text
    assert "torch global RNG state changed" in text
    assert before.differences(ProcessState.capture()) == []


def test_what_torch_writes_on_a_first_dynamo_import_is_not_the_runs_doing_and_anything_else_is():
    # A run whose traced graph is not cached imports Dynamo, whose import stores
    # TORCHINDUCTOR_CACHE_DIR in the environment (ascendgraph.tools.scenario.state.SET_BY_TORCH_ON_IMPORT).
    environ = {"PATH": "/bin"}
    fresh = ProcessState({"os.environ": environ}, frozenset())
    imported = ProcessState({"os.environ": {**environ, "TORCHINDUCTOR_CACHE_DIR": "/tmp/x"}}, frozenset({"torch._dynamo"}))
    assert fresh.differences(imported) == []
    # already imported before the run, or set by the run beside it: the run's doing
    was_imported = ProcessState({"os.environ": environ}, frozenset({"torch._dynamo"}))
    assert was_imported.differences(imported) == ["os.environ changed: TORCHINDUCTOR_CACHE_DIR=None->'/tmp/x'"]
    both = ProcessState({"os.environ": {**environ, "TORCHINDUCTOR_CACHE_DIR": "/tmp/x", "OTHER": "1"}},
                        frozenset({"torch._dynamo"}))
    assert fresh.differences(both) == ["os.environ changed: OTHER=None->'1'"]
    # a value the run changed (not set for the first time) is the run's doing
    preset = ProcessState({"os.environ": {**environ, "TORCHINDUCTOR_CACHE_DIR": "/mine"}}, frozenset())
    assert preset.differences(imported) == ["os.environ changed: TORCHINDUCTOR_CACHE_DIR='/mine'->'/tmp/x'"]


def test_a_scenario_process_imports_no_dynamo_when_the_traced_graph_is_cached(tmp_path, monkeypatch):
    import subprocess
    import sys

    path = write(tmp_path, "description = 'x'\n" + ENGINE_CONFIG + "[expect]\noutcome = 'ok'\ngraphs_captured = 3\n")
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path / "cache"))
    cold = run_scenario(load_scenario(path))  # traces and stores the entry
    assert cold.passed, cold.explain()
    probe = ("import sys\nfrom ascendgraph.tools.scenario import load_scenario, run_scenario\n"
             f"result = run_scenario(load_scenario({str(path)!r}))\n"
             "print(result.passed, result.mismatches, 'torch._dynamo' in sys.modules)\n")
    warm = subprocess.run([sys.executable, "-c", probe], env=dict(os.environ), capture_output=True, text=True,
                          timeout=300)
    assert warm.stdout.split() == ["True", "[]", "False"], warm.stderr[-2000:]


# --------------------------------------------------------------------------- engine runs (2 layers, 1 size)


def test_the_runner_agrees_with_engine_run(tmp_path):
    from ascendgraph.cli.args import config_from_args
    from ascendgraph.runtime.engine import run
    from ascendgraph.tools.scenario.observation import _namespace
    from ascendgraph.runtime.workload import WorkloadSpec

    scenario = load_scenario(write(tmp_path, "description = 'x'\n" + ENGINE_CONFIG + "[expect]\noutcome = 'ok'\ngraphs_captured = 3\n"))
    result = run_scenario(scenario)
    assert result.passed, result.explain()
    spec = scenario.run
    report = run(
        config_from_args(_namespace(scenario)), device="sim", requests=spec.requests, progress=False, env={},
        workload_spec=WorkloadSpec(num_requests=spec.requests, seed=spec.seed, prompt_words=spec.prompt_words,
                                   output_tokens=spec.output_tokens, burst_size=spec.burst_size, burst_gap=spec.burst_gap),
    )
    mine = result.report
    assert (mine.effective_mode, mine.graphs_captured, mine.steps, mine.requests_completed, mine.batches_by_mode) == (
        report.effective_mode, report.graphs_captured, report.steps, report.requests_completed, report.batches_by_mode
    )


def test_leaks_of_graphs_and_process_state_are_caught(tmp_path, monkeypatch):
    import ascendgraph.runtime.engine

    original_capture = ascendgraph.runtime.engine.Engine.capture

    def capture_and_leak(self):
        original_capture(self)
        os.environ["ASCENDGRAPH_SCENARIO_LEAK"] = "1"

    monkeypatch.setattr(ascendgraph.runtime.engine.Engine, "capture", capture_and_leak)
    monkeypatch.setattr(ascendgraph.runtime.engine.Engine, "close", lambda self: None)  # graphs never released
    threads = torch.get_num_threads()
    scenario = load_scenario(write(tmp_path, "description = 'x'\n" + ENGINE_CONFIG + "[expect]\noutcome = 'ok'\n"))
    try:
        result = run_scenario(scenario)
    finally:
        os.environ.pop("ASCENDGRAPH_SCENARIO_LEAK", None)
        torch.set_num_threads(threads)
    assert not result.passed
    assert result.invariants["resources"].startswith("violated: after close: streams_in_use 3 != 0 before"), result.invariants
    assert "graphs_alive 3 != 0" in result.invariants["resources"]
    state = result.invariants["global_state"]
    assert "ASCENDGRAPH_SCENARIO_LEAK=None->'1'" in state
    if threads != 1:
        assert f"torch intra-op threads changed: {threads} -> 1" in state


def test_a_request_completed_through_a_wrong_step_is_reported_as_silently_wrong(tmp_path, monkeypatch):
    # The engine fails the requests of a step that differs from eager; an engine that marked
    # them completed instead must be caught by the requests invariant.
    from ascendgraph.runtime.workload import RequestStatus, Scheduler

    def complete_instead_of_failing(self, request_ids, reason):
        for request_id in request_ids:
            if self.states[request_id].status is RequestStatus.RUNNING:
                self._retire(self.states[request_id], RequestStatus.FINISHED)

    monkeypatch.setattr(Scheduler, "fail", complete_instead_of_failing)
    scenario = load_scenario(write(tmp_path, """
        description = "x"
        [config]
        num_layers = 2
        max_num_seqs = 2
        max_num_batched_tokens = 8
        compilation_config = { cudagraph_mode = "FULL_DECODE_ONLY", cudagraph_capture_sizes = [1, 2] }
        [device]
        faults = "task_update=skip_update"
        require_task_updates = false
        [run]
        requests = 2
        [expect]
        outcome = "error"
        error_type = "NumericalMismatch"
    """))
    result = run_scenario(scenario)
    assert "silently wrong" in result.invariants["requests"], result.invariants
    assert not result.passed
