"""`ascendgraph run`: exit codes, the --json document, text on stderr."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ascendgraph.cli.app import main

SMALL = ["run", "--device", "sim", "--num-layers", "1", "--max-num-seqs", "4", "--max-num-batched-tokens", "8",
         "--requests", "3", "-cc", '{"cudagraph_capture_sizes": [1, 2, 4]}']
JSON_KEYS = {
    "schema_version", "requested_mode", "effective_mode", "decisions", "capture_sizes", "graphs_captured",
    "streams_used", "stream_limit", "pool_bytes", "capture_seconds", "requests_completed", "requests_failed",
    "batches_by_mode", "padding_waste", "max_abs_diff_vs_eager", "simulated_time_us", "error",
}


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_successful_run_exits_0_and_prints_the_json_document_alone_on_stdout(capsys):
    code, out, err = _run(capsys, *SMALL, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert JSON_KEYS <= set(document)
    assert document["schema_version"] == 1
    assert document["error"] is None
    assert document["requests_completed"] == 3 and document["requests_failed"] == 0
    assert set(document["batches_by_mode"]) == {"NONE", "PIECEWISE", "FULL"}
    assert set(document["simulated_time_us"]) == {"graph", "eager"}
    assert document["capture_sizes"] == [1, 2, 4]
    assert document["graphs_captured"] == 3 * 2 + 3
    assert isinstance(document["decisions"], list) and {"rule", "before", "after", "reason"} <= set(document["decisions"][0])
    assert "result     OK" not in err  # --json: the text report is not printed at all


def test_a_failed_capture_exits_1_with_the_guidance_in_the_report(capsys):
    guidance = "ACL graph capture failed with a known stream-resource exhaustion signature"
    code, out, err = _run(capsys, *SMALL, "--stream-limit", "3", "--json")
    assert code == 1
    error = json.loads(out)["error"]
    assert error["type"] == "StreamResourceExhausted" and guidance in error["message"]
    assert "Traceback" not in err
    code, out, err = _run(capsys, *SMALL, "--stream-limit", "3")
    assert code == 1 and guidance in out and "Traceback" not in err


def test_debug_shows_the_traceback_of_a_failed_run(capsys):
    code, _, err = _run(capsys, *SMALL, "--stream-limit", "3", "--debug")
    assert code == 1
    assert "Traceback (most recent call last)" in err and "StreamResourceExhausted" in err


def test_eager_fallback_completes_with_exit_0(capsys):
    code, out, err = _run(capsys, *SMALL, "--stream-limit", "3", "--on-capture-error", "eager", "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["effective_mode"] == "NONE" and document["capture_fallback"]["type"] == "StreamResourceExhausted"


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--requests", "0"],
        ["run", "--device", "tpu"],
        ["run", "--on-capture-error", "ignore"],
        ["run", "--device", "sim", "-cc", '{"cudagraph_mode": "SOMETIMES"}'],
        ["run", "--device", "sim", "--attention-backend", "never", "-cc", '{"cudagraph_mode": "FULL"}'],
        ["run", "--device", "sim", "--faults", "capture_begin=explode"],
    ],
)
def test_bad_input_exits_2_without_a_traceback(capsys, argv):
    code, out, err = _run(capsys, *argv)
    assert code == 2, err
    assert out == "" and "Traceback" not in err


def test_an_unusable_npu_is_bad_input(capsys):
    from ascendgraph.device import backend_availability

    if backend_availability("npu")[0]:  # pragma: no cover - only on Ascend hosts
        pytest.skip("an NPU is usable here")
    code, _, err = _run(capsys, "run", "--device", "npu")
    assert code == 2 and "npu" in err


def test_the_console_script_runs_in_a_subprocess_with_json_on_stdout():
    script = Path(sys.executable).with_name("ascendgraph")
    if not script.exists():  # pragma: no cover - an install without console scripts
        pytest.skip(f"console script not found next to {sys.executable}")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run(
        [str(script), "-q", *SMALL, "--json"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests_completed"] == 3
    assert "Capturing ACL graphs" not in done.stderr  # no progress bar off a terminal / with -q


def test_the_cli_defaults_match_the_engine_and_the_parser_does_not_import_torch():
    import subprocess as sp

    from ascendgraph.runtime import engine

    from ascendgraph.cli import run as engine_cli

    assert engine_cli.DEFAULT_REQUESTS == engine.DEFAULT_REQUESTS
    assert engine_cli.MAX_SIMULATED_REQUESTS == engine.MAX_SIMULATED_REQUESTS
    assert engine_cli.ON_CAPTURE_ERROR == engine.ON_CAPTURE_ERROR
    probe = "import sys, ascendgraph.cli.app as c; c.build_parser(); print('torch' in sys.modules)"
    assert sp.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip() == "False"


def test_a_first_run_fuses_without_importing_inductors_pattern_matcher(tmp_path):
    # The fusion passes match with ascendgraph.compile.passes.matcher (torch.fx only): importing
    # torch._inductor.pattern_matcher (and torch._inductor.lowering with it) cost a first run 0.5 s.
    probe = (
        "import atexit, runpy, sys\n"
        "watched = ('torch._inductor.pattern_matcher', 'torch._inductor.lowering')\n"
        "atexit.register(lambda: print('imported:', [m for m in watched if m in sys.modules], file=sys.stderr))\n"
        "sys.argv = ['ascendgraph', *sys.argv[1:]]\n"
        "runpy.run_module('ascendgraph', run_name='__main__')\n"
    )
    env = dict(os.environ, ASCENDGRAPH_CACHE_DIR=str(tmp_path / "empty-cache"), OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", probe, *SMALL, "--json"], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["fused_ops"]["add_rms_norm"] > 0, "the passes ran and replaced matches"
    assert "imported: []" in done.stderr


def test_a_named_sim_profile_is_used(capsys):
    code, out, err = _run(capsys, *SMALL, "--sim-profile", "A2-old-hdk", "--stream-limit", "3", "--json")
    assert code == 1 and json.loads(out)["error"]["type"] == "OldHdkStack"


def test_sim_only_flags_with_an_npu_device_are_bad_input(capsys):
    code, _, err = _run(capsys, "run", "--device", "npu", "--faults", "replay=hang")
    assert code == 2 and "--device sim" in err
