"""The machine around a run: the library leaves its caller's process as
it found it (environment, threads) and refuses torch defaults it cannot honour; a profile that
cannot be written keeps the run's report and fails the run (exit 1), not "bad input"."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from ascendgraph.api import run
from ascendgraph.errors import ConfigError

# Engine runs that never look at the compile cache: they share the worker's (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("worker_compile_cache")

# One layer and three capture sizes (the default run captures 35): what these tests check is the
# process around a run (environment, threads, a profile write), not the capture of many sizes.
SMALL_RUN = {"num_layers": 1, "max_num_seqs": 4, "compilation_config": {"cudagraph_capture_sizes": [1, 2, 4]}}


def test_run_leaves_the_environment_and_threads_as_it_found_them():
    environment = dict(os.environ)
    threads = set(threading.enumerate())
    report = run(SMALL_RUN, requests=2)
    assert report.exit_code == 0
    assert dict(os.environ) == environment  # TORCHINDUCTOR_CACHE_DIR and friends removed again
    assert {t for t in threading.enumerate() if t.is_alive()} - threads == set()  # no tqdm monitor left


def test_run_tunes_the_collector_only_while_it_runs(monkeypatch):
    # ascendgraph.caller_state.collector_tuned_for_a_run: the young generation at 10,000 and the
    # middle one at 100 during the run (imports included), the caller's thresholds back
    # afterwards, also after a failure.
    import gc

    from ascendgraph.caller_state import RUN_MIDDLE_GENERATION_THRESHOLD, RUN_YOUNG_GENERATION_THRESHOLD
    from ascendgraph.runtime import engine

    seen = []
    real = engine.run

    def spy(*args, **kwargs):
        seen.append(gc.get_threshold())
        return real(*args, **kwargs)

    monkeypatch.setattr(engine, "run", spy)
    caller = gc.get_threshold()
    try:
        gc.set_threshold(700, 11, 12)
        assert run(SMALL_RUN, requests=1).exit_code == 0
        assert seen == [(RUN_YOUNG_GENERATION_THRESHOLD, RUN_MIDDLE_GENERATION_THRESHOLD, 12)]
        assert gc.get_threshold() == (700, 11, 12)
        with pytest.raises(ConfigError):
            run(SMALL_RUN, requests=1, no_such_option=1)
        assert gc.get_threshold() == (700, 11, 12)
        from ascendgraph.caller_state import collector_tuned_for_a_run

        gc.set_threshold(50_000, 500, 12)  # a caller's larger young and middle generations are kept as they are
        with collector_tuned_for_a_run():
            assert gc.get_threshold() == (50_000, 500, 12)
        assert gc.get_threshold() == (50_000, 500, 12)
    finally:
        gc.set_threshold(*caller)


@pytest.mark.parametrize("device", ["meta"])
def test_a_default_device_other_than_the_cpu_is_a_config_error(device):
    import torch

    torch.set_default_device(device)
    try:
        with pytest.raises(ConfigError, match="default device is 'meta'"):
            run(None, requests=2)
    finally:
        torch.set_default_device(None)


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
def test_a_default_dtype_other_than_float32_is_a_config_error(dtype):
    import torch

    previous = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, dtype))
    try:
        with pytest.raises(ConfigError, match="default dtype"):
            run(None, requests=2)
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS, errno.EDQUOT])
def test_a_profile_that_cannot_be_written_keeps_the_report_and_fails_the_run(error, tmp_path, monkeypatch):
    from ascendgraph.runtime import profiler

    def full(*args, **kwargs):
        raise OSError(error, os.strerror(error))

    monkeypatch.setattr(profiler, "write_profile", full)
    # three capture sizes, not the default 35: the write failure is what is under test
    report = run(SMALL_RUN, requests=2, profile_dir=str(tmp_path / "prof"))
    assert report.exit_code == 1 and report.requests_completed == 2
    assert report.error["type"] == "ProfileNotWritten" and os.strerror(error) in report.error["message"]
    assert report.to_json()["profile"]["error"] == report.error["message"]


@pytest.mark.parametrize("before", [0, 3])
def test_a_report_without_configured_sizes_never_says_0_configured_sizes(before):
    from ascendgraph.runtime.report import Report

    report = Report("FULL", "NONE", [], [], graphs_captured_before_failure=before,
                    capture_fallback={"type": "StreamResourceExhausted", "message": "x"})
    text = report.format_text()
    assert "0 configured sizes" not in text and "[]" not in text and "sizes configured: none" in text


@pytest.mark.parametrize("value, breaks", [("1", True), ("0", False), ("true", False), (None, False)])
def test_doctor_reports_torch_compile_disable_as_breaking(value, breaks, monkeypatch, capsys):
    from ascendgraph.cli.app import main

    if value is None:
        monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    else:
        monkeypatch.setenv("TORCH_COMPILE_DISABLE", value)
    main(["doctor", "--json"])
    import json

    document = json.loads(capsys.readouterr().out)
    found = [f for f in document["findings"] if f.get("rule") == "compile_disabled"]
    assert bool(found) == breaks, document["findings"]


def test_sigterm_while_a_command_runs_unwinds_and_the_handler_is_restored():
    import signal

    from ascendgraph.cli.streams import Terminated, sigterm_unwinds

    if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        pytest.skip("the test runner handles SIGTERM itself")
    cleaned = []
    with pytest.raises(Terminated):
        with sigterm_unwinds():
            try:
                os.kill(os.getpid(), signal.SIGTERM)
            finally:
                cleaned.append(True)
    assert cleaned == [True] and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
