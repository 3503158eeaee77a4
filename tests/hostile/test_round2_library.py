"""Round two, class 6 and the machine around a run: the library leaves its caller's process as
it found it (environment, threads) and refuses torch defaults it cannot honour; a profile that
cannot be written keeps the run's report and fails the run (exit 1), not "bad input"."""

from __future__ import annotations

import errno
import os
import threading

import pytest

from ascendgraph.api import run
from ascendgraph.errors import ConfigError


def test_run_leaves_the_environment_and_threads_as_it_found_them():
    environment = dict(os.environ)
    threads = set(threading.enumerate())
    report = run({"num_layers": 1}, requests=2)
    assert report.exit_code == 0
    assert dict(os.environ) == environment  # TORCHINDUCTOR_CACHE_DIR and friends removed again
    assert {t for t in threading.enumerate() if t.is_alive()} - threads == set()  # no tqdm monitor left


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
    report = run({"num_layers": 1}, requests=2, profile_dir=str(tmp_path / "prof"))
    assert report.exit_code == 1 and report.requests_completed == 2
    assert report.error["type"] == "ProfileNotWritten" and os.strerror(error) in report.error["message"]
    assert report.to_json()["profile"]["error"] == report.error["message"]
