"""`python -m bench`: the smoke run produces results.json with every section (no timing asserted)."""

from __future__ import annotations

import json

import pytest
import torch

from bench.__main__ import NESTED_ENV, RESULT_KEYS, section_suite, write_json_atomic
from bench.__main__ import main as bench_main


def test_quick_bench_writes_results_json_with_every_section(tmp_path, capsys):
    out = tmp_path / "results.json"
    threads = torch.get_num_threads()
    try:
        code = bench_main(["--quick", "--modes", "FULL_DECODE_ONLY", "--out", str(out)])
    finally:
        torch.set_num_threads(threads)
    stdout = capsys.readouterr().out
    assert code == 0
    results = json.loads(out.read_text())
    assert set(RESULT_KEYS) <= set(results)
    assert results["schema_version"] == 1 and results["quick"] is True
    mode = results["replay_vs_eager"]["modes"]["FULL_DECODE_ONLY"]
    assert {"cpu_ratio", "sim_ratio", "graph_cpu_ms", "eager_cpu_ms", "steps", "ok"} <= set(mode)
    assert mode["ok"] and mode["steps"] > 0
    assert [row["batch"] for row in results["sim_replay_vs_eager"]["batches"]] == [1, 8]
    capture = results["capture"]
    assert capture["graphs"] > 0 and capture["capture_sizes"] > 0 and capture["pool_bytes"] > 0
    # --quick hands bench_capture its own small configuration (not the default 35 sizes of tiny)
    assert capture["model"] == "tiny (1 layer, max_num_seqs 8; quick)" and capture["capture_sizes"] < 35
    padding = results["padding_waste"]
    assert set(padding["workloads"]) == {"decode-heavy", "mixed", "bursty"}
    for row in padding["workloads"].values():
        assert {"even", "workload_aware", "ratio", "held_out"} <= set(row)
        assert row["workload_aware"]["padding_waste"] <= row["even"]["padding_waste"]
    assert results["suite"]["skipped"] is True
    for heading in ("1. replay vs eager", "2. simulator replay", "3. capture", "4. padding waste", "5. test suite"):
        assert heading in stdout
    assert not list(tmp_path.glob(".results.*"))  # no temporary file left behind


def test_results_are_written_atomically(tmp_path):
    target = tmp_path / "deeper" / "results.json"
    write_json_atomic(str(target), {"a": 1})
    assert json.loads(target.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        write_json_atomic(str(target), {"not json": object()})
    assert json.loads(target.read_text()) == {"a": 1}  # the old file survives a failed write
    assert [p.name for p in target.parent.iterdir()] == ["results.json"]


def test_the_suite_is_never_benchmarked_from_inside_itself(monkeypatch):
    monkeypatch.setenv(NESTED_ENV, "1")
    result = section_suite(None)
    assert result["skipped"] is True and result["reason"] == "running inside the test suite"
