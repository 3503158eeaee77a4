"""A short `ascendgraph run --device npu` per graph mode: every request completes, the
effective mode is the resolved one, graphs are captured where the mode has graphs, and
every step agrees with the eager reference (bfloat16: torch_npu's attention kernel)."""

from __future__ import annotations

import json

import pytest

from ascendgraph.cli import app as cli

pytestmark = pytest.mark.npu

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
# Four capture sizes cover 6 requests' decode batches; capturing vLLM's 35 default sizes would
# make the run (and the CI facade run, python-speed capture) minutes long for nothing more.
SIZES = [1, 2, 4, 8]


def run_json(capsys: pytest.CaptureFixture[str], *flags: str) -> tuple[int, dict]:
    code = cli.main(["run", "--device", "npu", "--requests", "6", "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("mode", MODES)
def test_a_short_run_per_mode_completes_and_matches_eager(capsys: pytest.CaptureFixture[str], mode: str) -> None:
    code, report = run_json(capsys, "--dtype", "bfloat16", "--compilation-config", json.dumps({"cudagraph_mode": mode, "cudagraph_capture_sizes": SIZES}))
    assert code == 0, report["error"]
    assert report["device"] == "npu"
    assert report["requests_failed"] == 0 and report["requests_completed"] == report["requests_total"]
    assert report["effective_mode"] == mode
    assert (report["graphs_captured"] > 0) == (mode != "NONE")
    if mode in ("FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"):
        assert report["batches_by_mode"]["FULL"] > 0
    assert report["max_abs_diff_vs_eager"] is not None


def test_float32_is_refused_up_front_with_the_dtype_advice(capsys: pytest.CaptureFixture[str]) -> None:
    # docs/decisions.md "float32 on the simulator": the fused attention takes no float32, so npu refuses it before building anything.
    code, report = run_json(capsys, "--dtype", "float32", "--compilation-config",
                            json.dumps({"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": SIZES}))
    assert code == 2 and report["error"] is not None
    assert "--dtype bfloat16" in report["error"]["message"]
    assert "graphs_captured" not in report or not report["graphs_captured"]
