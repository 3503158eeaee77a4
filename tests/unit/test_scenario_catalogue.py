"""The catalogue in tests/scenarios: complete (every case the issue lists), small enough for
the default run, and in sync with docs/faults.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from ascendgraph.tools.scenario import DEVICE_ACTIONS, OUTCOMES, catalogue_table, discover_scenarios, load_scenario

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "scenarios"
DOC = ROOT / "docs" / "faults.md"
CATALOGUE = [load_scenario(path) for path in discover_scenarios([FOLDER])]
BY_NAME = {s.name: s for s in CATALOGUE}

# Every failure the issue names, and the scenario file(s) that reproduce it.
REQUIRED = {
    "stream exhaustion at the N-th capture, PIECEWISE, raise": ["stream_exhaustion_piecewise_nth_capture"],
    "stream exhaustion at the N-th capture, PIECEWISE, eager fallback": ["stream_exhaustion_piecewise_eager_fallback"],
    "stream exhaustion at the N-th capture, FULL_AND_PIECEWISE, raise": ["stream_exhaustion_full_and_piecewise_nth_capture"],
    "stream exhaustion at the N-th capture, FULL_AND_PIECEWISE, eager fallback": [
        "stream_exhaustion_full_and_piecewise_eager_fallback"
    ],
    "the planner's N fits and N + 1 fails": ["planner_n_sizes_fit", "planner_n_plus_one_sizes_fail"],
    "old-HDK Alloc sq cq fail": ["old_hdk_alloc_sq_cq_fail"],
    "207005 resource alloc fail": ["resource_alloc_fail_207005"],
    "out of pool memory during capture": ["pool_memory_exhausted_during_capture"],
    "host sync inside a captured region": ["host_sync_in_capture"],
    "capture on the default stream": ["capture_on_default_stream"],
    "replay before capture": ["replay_before_capture"],
    "changed input addresses in debug mode": ["changed_input_addresses_debug"],
    "FULL parameter update skipped (stale task group caught by the device)": [
        "full_param_update_skipped", "full_param_update_skipped_once_bfloat16"
    ],
    "FULL parameter update skipped, device check off (wrong result detected)": ["full_param_update_skipped_numeric_check"],
    "external event never recorded (hang reported)": ["external_event_never_recorded"],
    "device lost during replay (requests failed, not wrong)": ["device_lost_during_replay"],
    "ASCEND_LAUNCH_BLOCKING=1": ["ascend_launch_blocking"],
    "TASK_QUEUE_ENABLE=2": ["task_queue_enable_2"],
    "static kernel without npugraph_ex": ["static_kernel_without_npugraph_ex"],
    "super kernel without static kernel": ["super_kernel_without_static_kernel"],
    "310P with npugraph_ex requested": ["npugraph_ex_on_310p"],
    "xlite with k = 2": ["xlite_spec_decode_k2"],
    "xlite with pipeline parallel": ["xlite_pipeline_parallel"],
    "TP alignment leaving no size": ["tp_alignment_leaves_no_size"],
    "encoder-decoder fallback": ["encoder_decoder_fallback"],
    "FULL with an MLA backend narrowed": ["full_with_mla_narrowed"],
    "FULL with a NEVER backend rejected": ["full_with_never_backend_rejected"],
    "A5 pruning to 4 sizes": ["a5_prunes_to_four_sizes"],
}


def test_the_catalogue_holds_at_least_24_scenarios_of_every_outcome():
    assert len(CATALOGUE) >= 24
    assert {s.expect.outcome for s in CATALOGUE} == set(OUTCOMES)
    assert {s.kind for s in CATALOGUE} == {"engine", "device"}


@pytest.mark.parametrize("case", sorted(REQUIRED))
def test_every_case_the_issue_lists_has_a_scenario(case):
    missing = [name for name in REQUIRED[case] if name not in BY_NAME]
    assert not missing, f"{case}: no scenario file {missing} in {FOLDER}"


def test_every_device_action_is_exercised_by_a_scenario():
    used = {s.action for s in CATALOGUE if s.kind == "device"}
    assert used == set(DEVICE_ACTIONS), f"actions without a scenario: {set(DEVICE_ACTIONS) - used}"


@pytest.mark.parametrize("scenario", [s for s in CATALOGUE if s.kind == "engine"], ids=lambda s: s.name)
def test_engine_scenarios_stay_small_enough_for_the_default_run(scenario):
    config = scenario.config
    model = config.get("model", "tiny")
    layers = model.get("num_hidden_layers") if isinstance(model, dict) else config.get("num_layers")
    compilation = config.get("compilation_config", {})
    sizes = compilation.get("cudagraph_capture_sizes") if isinstance(compilation, dict) else None
    rejected = scenario.expect.outcome == "error" and scenario.expect.error_type in (
        "ConfigError", "GraphModeError", "XliteConfigError"
    )
    if not rejected:  # a configuration rejected at resolution builds no model
        assert layers is not None and layers <= 2, "engine scenarios use 2-layer models (num_layers = 2)"
        if not config.get("enforce_eager"):
            assert sizes is not None and len(sizes) <= 7, "engine scenarios list a few capture sizes"
    assert scenario.run.requests <= 8


def test_docs_faults_md_carries_the_generated_catalogue_table():
    table = catalogue_table(CATALOGUE)
    text = DOC.read_text()
    start, end = "<!-- catalogue:start -->", "<!-- catalogue:end -->"
    assert start in text and end in text, f"{DOC} lacks the catalogue markers"
    current = text.split(start, 1)[1].split(end, 1)[0].strip()
    assert current == table, (
        f"{DOC} is out of date: regenerate the table between the markers with\n"
        "  ascendgraph scenario list tests/scenarios --markdown"
    )
