"""The plan's measurement cache (`ascendgraph.tools.plan.measure_cache`): a second plan of the same
model reads the measurement instead of capturing again, reports the same predictions, and says so;
another sample, an edited entry or ASCENDGRAPH_PLAN_CACHE=0 measures again."""

from __future__ import annotations

import pytest

import json
import os
import logging
from pathlib import Path

from ascendgraph.cli.app import main
from ascendgraph.config import GraphConfig
from ascendgraph.tools.plan import make_plan
from ascendgraph.tools.plan.formatting import format_plan
from ascendgraph.tools.plan.measure_cache import PLAN_SUBDIR


def _config() -> GraphConfig:
    return GraphConfig.from_vllm_args(num_layers=1, compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8]},
                                      max_num_seqs=8, max_num_batched_tokens=64)


def _plan(measured: list[int], **options):
    return make_plan(_config(), budget=2, requests=3, measure="sample", sample=2,
                     before_measure=lambda: measured.append(1), **options)


def _predictions(result) -> list:
    return [s.prediction for s in (result.configured, result.even, result.aware)]


def _entries() -> list[Path]:
    """The plan cache's entries in this test's cache directory (the root conftest's ASCENDGRAPH_CACHE_DIR)."""
    return sorted((Path(os.environ["ASCENDGRAPH_CACHE_DIR"]) / PLAN_SUBDIR).glob("*.json"))


def test_a_second_plan_reads_the_measurement_and_predicts_the_same():
    measured: list[int] = []
    first = _plan(measured)
    second = _plan(measured)
    assert measured == [1]  # measured once
    assert not first.measurement.cached and second.measurement.cached
    assert _predictions(second) == _predictions(first)
    assert second.measurement.keys == first.measurement.keys
    assert "read from the plan cache" in format_plan(second) and "(measured here)" in format_plan(first)
    assert len(_entries()) == 1


def test_another_sample_is_measured_again():
    measured: list[int] = []
    _plan(measured)
    make_plan(_config(), budget=2, requests=3, measure="all", before_measure=lambda: measured.append(2))
    assert measured == [1, 2] and len(_entries()) == 2


def test_a_corrupt_entry_is_ignored_with_one_warning_and_replaced(caplog):
    measured: list[int] = []
    _plan(measured)
    (entry,) = _entries()
    entry.write_text("{not json")
    with caplog.at_level(logging.WARNING, logger="ascendgraph.tools.plan.measure_cache"):
        result = _plan(measured)
    assert measured == [1, 1] and not result.measurement.cached
    assert len([r for r in caplog.records if "ignoring the plan cache entry" in r.getMessage()]) == 1
    assert json.loads(entry.read_text())["measurement"]["keys"]  # measured again and stored


def test_an_entry_of_another_key_is_not_used():
    measured: list[int] = []
    _plan(measured)
    (entry,) = _entries()
    document = json.loads(entry.read_text())
    document["key"] = "0" * 64
    entry.write_text(json.dumps(document))
    assert not _plan(measured).measurement.cached and measured == [1, 1]


def test_the_cache_can_be_turned_off(monkeypatch):
    monkeypatch.setenv("ASCENDGRAPH_PLAN_CACHE", "0")
    measured: list[int] = []
    _plan(measured)
    _plan(measured)
    assert measured == [1, 1] and _entries() == []


def test_the_cli_says_the_measurement_was_cached(capsys):
    argv = ["plan", "--num-layers", "1", "--max-num-seqs", "8", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4, 8]}',
            "--requests", "3", "--budget", "2", "--sample-sizes", "2", "--json"]
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main(argv) == 0
    second = json.loads(capsys.readouterr().out)
    assert first["measurement"]["cached"] is False and second["measurement"]["cached"] is True
    for name in ("configured", "even", "workload_aware"):
        assert second["selections"][name]["predicted"] == first["selections"][name]["predicted"]


@pytest.mark.parametrize("value, enabled", [("0", False), ("off", False), ("1", True), ("", True)])
def test_the_cache_switch_reads_on_and_off_spellings(monkeypatch, value, enabled):
    from ascendgraph.tools.plan import measure_cache

    monkeypatch.setenv("ASCENDGRAPH_PLAN_CACHE", value)
    assert measure_cache._enabled() is enabled


def test_an_unknown_cache_switch_value_is_a_config_error_naming_it_and_the_fix(monkeypatch):
    from ascendgraph.errors import ConfigError
    from ascendgraph.tools.plan import measure_cache

    monkeypatch.setenv("ASCENDGRAPH_PLAN_CACHE", "sometimes")
    with pytest.raises(ConfigError, match=r"ASCENDGRAPH_PLAN_CACHE='sometimes' .* set it to 0"):
        measure_cache._enabled()
