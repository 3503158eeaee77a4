"""Every capability field of a simulator profile changes behaviour (issue 15 item 8, docs/decisions.md "Profiles: every capability field acts").

Each test changes one field of an inline profile (``{"base": "A2", field: value}``) and
shows the run resolve or capture differently; --sim-profile 310P resolves as --soc 310P,
and the stream limit's precedence is --stream-limit > the profile's stream_limit > 1800
(docs/semantics.md "Streams").
"""

from __future__ import annotations

from typing import Any

import pytest

import sim
from ascendgraph.cli.app import main
from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError, StreamResourceExhausted
from ascendgraph.resolve import resolve
from ascendgraph.runtime.engine import Engine, EngineOptions

FULL = {"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1, 2, 4]}
PIECEWISE = {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4, 8, 16, 24, 32]}


def _engine(profile: Any, compilation: dict, **options: Any) -> Engine:
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=4, max_num_batched_tokens=32,
                                        compilation_config=compilation,
                                        additional_config={"ascend_compilation_config": {"enable_static_kernel": True}})
    return Engine(config, EngineOptions(device="sim", sim_profile=profile, requests=1, progress=False, **options))


def _resolution(profile: Any, compilation: dict = FULL, **options: Any):
    engine = _engine(profile, compilation, **options)
    try:
        return engine.resolution, engine
    finally:
        engine.close()


@pytest.mark.parametrize("field, flag", [("supports_npugraph_ex", "npugraph_ex"),
                                         ("supports_static_kernel", "static_kernel"),
                                         ("supports_super_kernel", "super_kernel")])
def test_a_kernel_capability_off_in_the_profile_turns_the_feature_off(field, flag):
    on, _ = _resolution({"base": "A3"})  # A3: every kernel feature (A2 has no super kernel)
    off, _ = _resolution({"base": "A3", "name": "no-feature", field: False})
    assert getattr(on, flag) is True
    assert getattr(off, flag) is False
    assert any(d.rule == "soc_310p" and flag in d.after for d in off.decisions)


def test_a_profile_without_task_update_runs_no_full_graphs():
    with_update, _ = _resolution({"base": "A2"}, {"cudagraph_mode": "FULL_AND_PIECEWISE"})
    without, _ = _resolution({"base": "A2", "name": "no-update", "supports_task_update": False},
                             {"cudagraph_mode": "FULL_AND_PIECEWISE"})
    assert with_update.mode.name == "FULL_AND_PIECEWISE"
    assert without.mode.name == "PIECEWISE"
    decode_only, _ = _resolution({"base": "A2", "name": "no-update", "supports_task_update": False})
    assert decode_only.mode.name == "NONE"


def test_max_piecewise_sizes_prunes_the_piecewise_sizes():
    unlimited, _ = _resolution({"base": "A2"}, PIECEWISE)
    limited, _ = _resolution({"base": "A2", "name": "three", "max_piecewise_sizes": 3}, PIECEWISE)
    assert len(unlimited.capture_sizes) == 7
    assert limited.capture_sizes == [1, 8, 32]


def test_stream_limit_of_the_profile_is_the_limit_and_the_flag_wins():
    from_profile, engine = _resolution({"base": "A2", "stream_limit": 5}, PIECEWISE)
    assert from_profile.stream_plan.max_streams == 5 and engine.stream_limit == 5
    flag, _ = _resolution({"base": "A2", "stream_limit": 5}, PIECEWISE, stream_limit=9)
    assert flag.stream_plan.max_streams == 9
    default, _ = _resolution({"base": "A2"}, PIECEWISE)
    assert default.stream_plan.max_streams == 1800


def test_a_profile_with_stream_limit_1_captures_nothing():
    engine = _engine({"base": "A2", "stream_limit": 1}, PIECEWISE)
    try:
        with pytest.raises(StreamResourceExhausted):
            engine.capture()
        assert engine.capture_state.graphs_captured == 1
        assert engine.device.stats().stream_limit == 1
    finally:
        engine.close()


@pytest.mark.filterwarnings("ignore:Starting static kernel compilation")  # the notice is tested in test_static_kernel.py
def test_memory_bytes_bounds_the_graph_pools():
    engine = _engine({"base": "A2", "memory_bytes": 4096}, FULL, check_eager=False)
    try:
        with pytest.raises(Exception, match="NPU out of memory"):
            engine.capture()
    finally:
        engine.close()


def test_reserved_streams_of_the_profile_fail_captures_the_planner_expected_to_fit():
    # the planner knows the limit (8) but not the runtime's 3 reserved streams: 2 sizes of 2 graphs fit 8,
    # yet only 5 streams are left
    compilation = {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2]}
    fits = _engine({"base": "A2", "stream_limit": 4}, compilation)
    reserved = _engine({"base": "A2", "stream_limit": 4, "reserved_streams": 1}, compilation)
    try:
        assert fits.resolution.stream_plan.fits and reserved.resolution.stream_plan.fits
        fits.capture()
        with pytest.raises(StreamResourceExhausted):
            reserved.capture()
    finally:
        fits.close()
        reserved.close()


def test_sim_profile_310p_resolves_as_soc_310p():
    by_profile, _ = _resolution("310P")
    by_soc = resolve(GraphConfig.from_vllm_args(
        num_layers=1, max_num_seqs=4, max_num_batched_tokens=32, compilation_config=FULL, soc="310P",
        additional_config={"ascend_compilation_config": {"enable_static_kernel": True}}))
    assert (by_profile.npugraph_ex, by_profile.static_kernel, by_profile.super_kernel) == (False, False, False)
    assert by_profile.warnings == by_soc.warnings
    assert [(d.rule, d.after) for d in by_profile.decisions] == [(d.rule, d.after) for d in by_soc.decisions]


def test_a_different_soc_beside_sim_profile_is_a_config_error(capsys):
    code = main(["run", "--device", "sim", "--soc", "A2", "--sim-profile", "310P", "--num-layers", "1",
                 "--requests", "1"])
    assert code == 2
    assert "--soc A2 contradicts --sim-profile 310P" in capsys.readouterr().err


def test_every_capability_field_is_covered_here():
    from ascendgraph.device import DeviceProfile
    import dataclasses

    labels = {"name", "soc", "hdk_version", "cann_version", "description"}  # docs/decisions.md: names and descriptions
    covered = {"supports_npugraph_ex", "supports_static_kernel", "supports_super_kernel", "supports_task_update",
               "max_piecewise_sizes", "stream_limit", "memory_bytes", "reserved_streams",
               "old_hdk"}  # old_hdk: tests/sim (Alloc sq cq fail instead of 207008)
    assert {f.name for f in dataclasses.fields(DeviceProfile)} == labels | covered
    assert sim  # the simulator registers its device
