"""The fault-plan grammar (docs/faults.md) and the errors each code raises."""

from __future__ import annotations

import pytest
import torch

from ascendgraph.errors import (
    TEXT_207005,
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_STREAMS_INSUFFICIENT,
    ConfigError,
    DeviceLost,
    OldHdkStack,
    ResourceAllocFailed,
    StreamResourceExhausted,
    rewrite_capture_error,
)
from sim.faults import CODES, SITES, Action, FaultPlan, fault_error


def fired(plan: FaultPlan, site: str, hits: int) -> list[str]:
    out = []
    for _ in range(hits):
        term = plan.consult(site)
        out.append("-" if term is None else term.action_text)
    return out


def test_counted_terms_hand_over_to_the_next_and_the_last_applies_for_ever():
    plan = FaultPlan.parse("capture_begin=3*off->raise(207008)")
    assert fired(plan, "capture_begin", 5) == ["-", "-", "-", "raise(207008)", "raise(207008)"]


def test_a_counted_last_term_still_applies_for_ever():
    plan = FaultPlan.parse("replay=1*raise(207005)->2*off->delay(5)")
    assert fired(plan, "replay", 5) == ["raise(207005)", "-", "-", "delay(5)", "delay(5)"]


def test_sites_count_hits_independently():
    plan = FaultPlan.parse("replay=1*off->hang; synchronize=raise(device_lost)")
    assert plan.consult("synchronize") is not None
    assert plan.consult("replay") is None and plan.consult("replay").action is Action.HANG


def test_sites_without_rules_never_fire():
    plan = FaultPlan.parse("replay=hang")
    assert all(plan.consult(site) is None for site in SITES if site != "replay")


def test_percentages_draw_from_the_seed_reproducibly():
    draws = [fired(FaultPlan.parse("replay=30%raise(oom)", seed=7), "replay", 200) for _ in range(2)]
    assert draws[0] == draws[1]
    share = draws[0].count("raise(oom)") / 200
    assert 0.2 < share < 0.4
    other = fired(FaultPlan.parse("replay=30%raise(oom)", seed=8), "replay", 200)
    assert other != draws[0]


def test_zero_and_hundred_percent_are_never_and_always():
    assert fired(FaultPlan.parse("replay=0%hang"), "replay", 20) == ["-"] * 20
    assert fired(FaultPlan.parse("replay=100%hang"), "replay", 3) == ["hang"] * 3


def test_count_and_percent_combine():
    plan = FaultPlan.parse("malloc=2*100%raise(oom)->off")
    assert fired(plan, "malloc", 4) == ["raise(oom)", "raise(oom)", "-", "-"]


def test_fresh_copies_restart_the_counters():
    plan = FaultPlan.parse("replay=1*off->hang")
    plan.consult("replay")
    assert plan.fresh().consult("replay") is None and plan.hits("replay") == 1


def test_whitespace_and_empty_rules_are_tolerated():
    plan = FaultPlan.parse("  replay = 2 * off -> hang ;; synchronize=delay(1.5) ")
    assert str(plan) == "replay=2*off->hang; synchronize=delay(1.5)"
    assert FaultPlan.parse("").rules == {}


@pytest.mark.parametrize(
    "spec, token, listing",
    [
        ("capture=raise(207008)", "'capture'", "capture_begin"),
        ("replay=explode", "'explode'", "skip_update"),
        ("replay=raise(207009)", "'207009'", "alloc_sq_cq"),
        ("replay=raise()", "''", "device_lost"),
    ],
)
def test_unknown_sites_actions_and_codes_name_the_token_and_list_the_valid_ones(spec, token, listing):
    with pytest.raises(ConfigError) as exc:
        FaultPlan.parse(spec)
    assert token in str(exc.value) and listing in str(exc.value)


@pytest.mark.parametrize(
    "spec, fragment",
    [
        ("replay", "site=term"),
        ("replay=0*hang", "positive integer"),
        ("replay=150%hang", "between 0 and 100"),
        ("replay=delay(-1)", ">= 0 ms"),
        ("replay=delay", "needs an argument"),
        ("replay=hang(3)", "takes no argument"),
        ("replay=skip_update", "only applies to site 'task_update'"),
        ("replay=hang->off", "never apply"),
        ("replay=hang; replay=off", "appears twice"),
        ("replay=**hang", "cannot read term"),
    ],
)
def test_malformed_plans_are_config_errors(spec, fragment):
    with pytest.raises(ConfigError, match=fragment.replace("*", r"\*").replace("(", r"\(")):
        FaultPlan.parse(spec)


@pytest.mark.parametrize(
    "code, typed",
    [("207008", StreamResourceExhausted), ("alloc_sq_cq", OldHdkStack), ("207005", ResourceAllocFailed)],
)
def test_capture_codes_raise_runtime_errors_the_rewriter_recognises(code, typed):
    error = fault_error(code, site="capture_begin", stream_id=17)
    assert type(error) is RuntimeError
    assert isinstance(rewrite_capture_error(error), typed)


def test_the_207008_text_is_capture_begin_plus_streams_insufficient():
    assert str(fault_error("207008", site="capture_begin")) == TEXT_207008_CAPTURE_BEGIN + "\n" + TEXT_STREAMS_INSUFFICIENT
    assert str(fault_error("207005", site="capture_begin")) == TEXT_207005
    assert "stream_id=17, retCode=0x7020023" in str(fault_error("alloc_sq_cq", site="x", stream_id=17))


def test_oom_and_device_loss_have_their_own_types():
    oom = fault_error("oom", site="malloc", size_bytes=3 * 2**20)
    assert isinstance(oom, torch.OutOfMemoryError) and "NPU out of memory. Tried to allocate 3.00 MiB" in str(oom)
    lost = fault_error("device_lost", site="replay")
    assert isinstance(lost, DeviceLost) and "replay" in str(lost)


def test_every_code_has_an_error():
    for code in CODES:
        assert isinstance(fault_error(code, site="replay"), BaseException)
