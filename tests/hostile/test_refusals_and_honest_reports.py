"""Hostile input refused in one line, and reports that stay honest after a failure: pathological
sizes, digits and finiteness, unbounded work, values validated when a file loads, the API's
exceptions, conflicting flags, reports after a failure, and over-validation (torch thread state
has its own tests with the thread policy, tests/unit/test_threads.py)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import ascendgraph
from ascendgraph import ConfigError, GraphConfig
from ascendgraph.cli.app import main
from ascendgraph.runtime.report import Report

from .corpus import BIG_INT, DEEP_LIST, json_document


def refused(capsys, argv, *fragments: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err


def scenario(tmp_path: Path, body: str, name: str = "case.toml") -> Path:
    path = tmp_path / name
    path.write_text('description = "x"\n' + textwrap.dedent(body)
                    + '\n[expect]\noutcome = "error"\nerror_type = "ConfigError"\n', encoding="utf-8")
    return path


# --------------------------------------------------------------------------- pathological sizes


@pytest.mark.parametrize("flag", ["--compilation-config", "--additional-config", "--speculative-config"])
@pytest.mark.parametrize("text, fragment", [
    ('{"a": %s}' % BIG_INT, "an integer has more than 20 digits"),
    (DEEP_LIST, "nested more than 64 levels deep"),
])
def test_thousands_of_digits_or_levels_in_a_json_flag(capsys, flag, text, fragment):
    refused(capsys, ["explain", flag, text], flag, fragment)
    refused(capsys, ["explain", "--", "vllm", "serve", "tiny", flag, text], flag, fragment)


def test_a_dotted_option_in_a_pasted_line(capsys):
    refused(capsys, ["explain", "--", "vllm", "serve", "tiny", f"-cc.level={BIG_INT}"], "-cc.level",
            "more than 20 digits")


def test_model_config_and_sim_profile_files(capsys, tmp_path):
    config = tmp_path / "config.json"
    config.write_text('{"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": %s}' % BIG_INT)
    refused(capsys, ["explain", "--model", str(config)], "model config", "more than 20 digits")
    profile = tmp_path / "profile.json"
    profile.write_text(DEEP_LIST)
    refused(capsys, ["plan", "--measure", "off", "--sim-profile", str(profile)], "profile file", "64 levels")


def test_scenario_files_and_the_json_inside_them(capsys, tmp_path):
    refused(capsys, ["scenario", "run", str(scenario(tmp_path, f"[run]\nrequests = {BIG_INT}"))], "case.toml")
    inner = scenario(tmp_path, f"[config]\ncompilation_config = '{{\"level\": {BIG_INT}}}'", "inner.toml")
    refused(capsys, ["scenario", "run", str(inner)], "[config] compilation_config", "more than 20 digits")


def test_a_thousands_digit_optimisation_level(capsys):
    refused(capsys, ["explain", f"-O{BIG_INT}"], "optimization_level must be 0, 1, 2 or 3")


# --------------------------------------------------------------------------- digits and finiteness


@pytest.mark.parametrize("plan, fragment", [
    ("capture_begin=²*off->raise(207008)", "count '²'"),
    (f"capture_begin={BIG_INT}*off->raise(207008)", "must be a positive integer"),
    ("replay=delay(inf)", "finite number of milliseconds"),
    ("replay=delay(nan)", "finite number of milliseconds"),
    ("replay=delay(1e308)", "at most 3600000 ms (one hour)"),
])
def test_fault_plans_with_odd_digits_or_non_finite_delays(capsys, plan, fragment):
    for command in ("run", "profile"):
        refused(capsys, [command, "--faults", plan], "fault plan", fragment)


def test_json_output_never_holds_nan():
    from ascendgraph.readers import dump_json

    document = Report("FULL", "FULL", [], [], max_abs_diff_vs_eager=float("nan"),
                      simulated_time_us={"graph": float("inf"), "eager": 1.0}).to_json()
    text = dump_json(document)
    assert "NaN" not in text and "Infinity" not in text
    json_document(text)


# --------------------------------------------------------------------------- unbounded work


def test_a_billion_prompt_words_is_refused_when_the_scenario_loads(capsys, tmp_path):
    path = scenario(tmp_path, "[run]\nprompt_words = [1, 1000000000]")
    refused(capsys, ["scenario", "list", str(path)], "[run] prompt_words", "1000000000")


def test_diagnose_refuses_an_endless_stream_of_zeros(capsys, monkeypatch):
    from ascendgraph.tools.diagnose import reading

    monkeypatch.setattr(reading, "MAX_NUL_RUN", 1 << 20)  # the same rule, a smaller budget
    # Issue 27: /dev/zero is refused before any read (a device is no log), the NUL-run rule
    # stays for regular files (test_3_a_long_nul_run_after_a_text_start_is_refused).
    refused(capsys, ["diagnose", "/dev/zero"], "/dev/zero", "not a regular log file")


def test_diagnose_refuses_nul_filled_input(capsys, tmp_path):
    path = tmp_path / "nul.log"
    path.write_bytes(b"\x00" * 100_000)
    refused(capsys, ["diagnose", str(path)], "holds only NUL bytes")


def test_a_long_nul_run_after_a_text_start_is_refused(monkeypatch, tmp_path):
    from ascendgraph.tools.diagnose import UnreadableLog, diagnose_file, reading

    monkeypatch.setattr(reading, "MAX_NUL_RUN", 4096)
    path = tmp_path / "mixed.log"
    path.write_bytes(b"INFO starting\n" * 10_000 + b"\x00" * 10_000)
    with pytest.raises(UnreadableLog, match="run of more than"):
        diagnose_file(str(path))


# --------------------------------------------------------------------------- validated when loaded


@pytest.mark.parametrize("body, where, value", [
    ('[device]\nprofile = "A9"', "[device] profile", "'A9'"),
    ("[config]\noptimization_level = 7", "[config] optimization_level", "7"),
    ("[config]\ncompilation_config = { cudagraph_mode = 5 }", "[config] compilation_config", "cudagraph_mode 5"),
    ('[config]\nadditional_config = { ascend_compilation_config = { enable_static_kernel = "yes" } }',
     "[config] additional_config", "'yes'"),
    ("[run]\nseed = -1", "[run] seed", "-1"),
    ("[run]\nrequests = 10000000000", "[run] requests", "10000000000"),
])
def test_a_wrong_value_in_a_scenario_is_exit_2_naming_file_key_and_value(capsys, tmp_path, body, where, value):
    path = scenario(tmp_path, body)
    for command in ("run", "list"):
        refused(capsys, ["scenario", command, str(path)], f"{path}: {where}", value)


# --------------------------------------------------------------------------- the API's exceptions


@pytest.mark.parametrize("call, fragment", [
    (lambda: ascendgraph.run(num_threads=0), "num_threads"),
    (lambda: ascendgraph.run(workload=5), "workload"),
    (lambda: ascendgraph.run(pass_manager=5), "pass_manager"),
    (lambda: GraphConfig(ascend_compilation_config=5), "ascend_compilation_config"),
    (lambda: ascendgraph.explain(GraphConfig(xlite_graph_config=5)), "xlite_graph_config"),
])
def test_the_api_raises_config_error(call, fragment):
    with pytest.raises(ConfigError, match=fragment):
        call()


@pytest.mark.parametrize("call, suggestion", [
    (lambda: ascendgraph.run(num_thread=1), "did you mean 'num_threads'?"),
    (lambda: ascendgraph.explain(compilaton_config={}), "did you mean 'compilation_config'?"),
    (lambda: GraphConfig(cudagraph_mod="FULL"), "did you mean 'cudagraph_mode'?"),
])
def test_unknown_api_options_get_a_did_you_mean(call, suggestion):
    with pytest.raises(ConfigError, match=suggestion):
        call()


# --------------------------------------------------------------------------- conflicts


def test_a_flag_before_and_after_the_double_dash_names_both(capsys):
    refused(capsys, ["explain", "-O3", "--", "vllm", "serve", "tiny", "-O0"], "-O3", "-O 0")


def test_atol_above_one(capsys):
    refused(capsys, ["run", "--atol", "1e9"], "--atol", "at most 1")
    with pytest.raises(ConfigError, match="atol must be at most 1"):
        ascendgraph.run(atol=1e9)


def test_plan_checks_the_sim_profile_with_measure_off(capsys, tmp_path):
    broken = tmp_path / "broken.json"
    broken.write_text("{broken")
    refused(capsys, ["plan", "--measure", "off", "--sim-profile", str(broken)], "broken.json", "invalid JSON")


def test_an_empty_workload(capsys):
    with pytest.raises(ConfigError, match="workload must be a non-empty list"):
        ascendgraph.run(workload=[])


# --------------------------------------------------------------------------- reports after failure


def _report(**changes) -> Report:
    values = dict(requested_mode="FULL_AND_PIECEWISE", effective_mode="FULL_AND_PIECEWISE", decisions=[],
                  capture_sizes=[1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64], requests_total=4)
    values.update(changes)
    return Report(**values)


def test_a_run_that_checked_nothing_says_not_checked():
    report = _report(eager_checked_steps=0, steps=0, requests_failed=4, simulated_time_us={"graph": 0.0, "eager": 0.0})
    text = report.format_text()
    assert "check      not checked (nothing was served)" in text
    assert "= 0" not in text and "sim time" not in text
    assert report.to_json()["max_abs_diff_vs_eager"] is None


def test_a_failed_capture_does_not_read_as_if_every_size_was_captured():
    report = _report(graphs_captured=0, graphs_captured_before_failure=8, eager_checked_steps=0)
    text = report.format_text()
    assert "failed after 8 graphs were captured (sizes configured: 11 configured sizes" in text
    assert "held after the release: 0 graphs" in text
    complete = _report(graphs_captured=22, steps=3, eager_checked_steps=3,
                       batches_by_mode={"NONE": 0, "PIECEWISE": 1, "FULL": 2}).format_text()
    assert "22 graphs for all 11 configured sizes" in complete


def test_after_an_eager_fallback_nothing_is_labelled_graph_path():
    report = _report(effective_mode="NONE", capture_fallback={"type": "StreamResourceExhausted", "message": "x"},
                     steps=4, eager_checked_steps=4, batches_by_mode={"NONE": 4, "PIECEWISE": 0, "FULL": 0},
                     simulated_time_us={"graph": 2000.0, "eager": 2000.0},
                     extensions={"kernels_per_step": {"graph": 40.0, "eager": 40.0}})
    text = report.format_text()
    assert "graph path" not in text and "|graph - eager|" not in text
    assert "sim time   served eagerly 2.00 ms" in text


def test_enforce_eager_does_not_claim_a_requested_mode():
    report = _report(effective_mode="NONE", requested_mode_is_default=True, decisions=[
        {"rule": "enforce_eager", "before": "FULL_AND_PIECEWISE", "after": "NONE",
         "reason": "Compilation disabled, using eager mode by default"}])
    line = report.format_text().splitlines()[1]
    assert "requested" not in line and line.startswith("  mode       NONE (enforce_eager")


def test_xlite_without_a_replayed_graph_compares_no_graph_path():
    report = _report(effective_mode="NONE", steps=2, eager_checked_steps=2,
                     batches_by_mode={"NONE": 2, "PIECEWISE": 0, "FULL": 0},
                     extensions={"xlite": {"full_mode": False, "budget": 8}, "batches_by_route": {"native": 2, "xlite": 0}})
    text = report.format_text()
    assert "graph path" not in text and "|served (eager) - eager|" in text


def _tiny_run(**options) -> Report:
    config = {"model": "tiny", "num_layers": 1, "max_num_seqs": 4, "max_num_batched_tokens": 8,
              "compilation_config": {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4]}}
    return ascendgraph.run(config, device="sim", requests=2, seed=0, progress=False, **options)


def test_a_failed_capture_reports_what_the_device_holds_after_the_release():
    report = _tiny_run(faults="capture_begin=2*off->raise(207008)")
    assert report.error and report.error["type"] == "StreamResourceExhausted"
    assert report.graphs_captured_before_failure == 2
    assert (report.graphs_captured, report.streams_used, report.pool_bytes) == (0, 0, 0)
    assert report.to_json()["max_abs_diff_vs_eager"] is None
    assert any("2 graphs were captured before the failure" in note for note in report.notes)


def test_an_oom_during_capture_gets_the_count_and_diagnose_guidance():
    from ascendgraph.errors import OOM_DURING_CAPTURE_GUIDANCE

    report = _tiny_run(faults="malloc=3*off->raise(oom)")
    assert report.error and report.error["type"] == "OutOfMemoryError", report.error
    assert report.graphs_captured_before_failure is not None
    assert f"{report.graphs_captured_before_failure} graphs captured before the failure" in report.notes
    assert OOM_DURING_CAPTURE_GUIDANCE in report.notes


def test_a_numerical_mismatch_names_its_likely_causes():
    config = {"model": "tiny", "num_layers": 1, "max_num_seqs": 4, "max_num_batched_tokens": 8,
              "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}}
    # A planted divergence (0.1: above the bfloat16 tolerance 2e-2) on the graph path (a skipped update is now caught earlier, as
    # StaleGraphParams): the mismatch names the causes to look at first.
    report = ascendgraph.run(config, device="sim", requests=2, progress=False, faults="replay=perturb(0.1)")
    assert report.error and report.error["type"] == "NumericalMismatch", report.error
    assert "stale attention parameters" in report.error["message"]
    assert "update was skipped" in report.error["message"] and "StaleGraphParams" in report.error["message"]


# --------------------------------------------------------------------------- over-validation


def test_a_model_without_dimensions_resolves_and_is_refused_only_when_weights_are_built():
    config = GraphConfig.from_vllm_args(model={"architecture": "WhisperForConditionalGeneration",
                                               "num_hidden_layers": 4, "is_encoder_decoder": True})
    assert ascendgraph.explain(config).mode.name in ("PIECEWISE", "NONE")
    from ascendgraph.models.build import build_model

    with pytest.raises(ConfigError, match="missing 'hidden_size'.*needed to build the weights"):
        build_model(config.model)
