"""The caller's warning filters (ascendgraph/torch_warnings.py): ``PYTHONWARNINGS=error`` or
``-W error`` must not fail a command on a warning torch raises from its own code, while
ascendgraph's own warnings still follow the caller's filters."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import pytest

from ascendgraph import torch_warnings
from ascendgraph.torch_warnings import ForeignWarning, foreign_warnings_ignored

ROOT = Path(__file__).resolve().parents[2]
SMALL_RUN = ["--num-layers", "1", "-cc", '{"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [1]}']


def _ascendgraph(tmp_path: Path, *args: str, python_flags: tuple[str, ...] = (),
                 pythonwarnings: str = "") -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "ASCENDGRAPH_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONWARNINGS": pythonwarnings}
    return subprocess.run([sys.executable, *python_flags, "-m", "ascendgraph", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)


def test_run_under_pythonwarnings_error_succeeds(tmp_path: Path) -> None:
    # A cold cache: the fusion patterns are traced and matched.
    result = _ascendgraph(tmp_path, "run", *SMALL_RUN, "--requests", "1", pythonwarnings="error")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "result     OK" in result.stdout


def test_plan_under_w_error_succeeds(tmp_path: Path) -> None:
    result = _ascendgraph(tmp_path, "plan", *SMALL_RUN, "--json", python_flags=("-W", "error"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def test_our_own_warning_still_follows_the_callers_error_filter(tmp_path: Path) -> None:
    # The static-kernel build notice is ascendgraph's own UserWarning: -W error makes it an error,
    # as the caller asked. Without the filter it is one WARNING line and the run passes: the same
    # static-kernel run without a filter is tests/unit/test_cli_ux_output.py's
    # test_the_static_kernel_notice_prints_as_one_line (exit 0, exactly one such WARNING line).
    static = ["--additional-config", '{"ascend_compilation_config": {"enable_static_kernel": true}}']
    strict = _ascendgraph(tmp_path, "run", *SMALL_RUN, *static, "--requests", "1",
                          python_flags=("-W", "error::UserWarning"))
    assert strict.returncode == 1
    assert "UserWarning: Starting static kernel compilation" in strict.stdout


# The warning importing torch's inductor pattern matcher raises; no path of ascendgraph reaches it
# now (FOREIGN_WARNINGS is empty), so the tests of the mechanism list it themselves.
EXAMPLE = ForeignWarning(
    DeprecationWarning, r"`torch\.jit\.script_method` is deprecated",
    "torch/jit/_script.py script_method, applied at import time by torch/utils/mkldnn.py",
    "torch._inductor.pattern_matcher.fwd_only, when a caller's code imports it",
)


@pytest.fixture
def _example_listed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch_warnings, "FOREIGN_WARNINGS", (EXAMPLE,))


def _torch_warning() -> None:
    warnings.warn("`torch.jit.script_method` is deprecated. Please switch to `torch.compile`", EXAMPLE.category)


@pytest.mark.usefixtures("_example_listed")
def test_only_the_listed_torch_warnings_are_ignored_and_the_filters_come_back() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = list(warnings.filters)
        with foreign_warnings_ignored():
            _torch_warning()  # ignored
            with pytest.raises(UserWarning, match="ours"):
                warnings.warn("ours", UserWarning)
            with pytest.raises(DeprecationWarning, match="another"):
                warnings.warn("another deprecation", DeprecationWarning)
        assert warnings.filters == before
        with pytest.raises(DeprecationWarning):
            _torch_warning()


@pytest.mark.usefixtures("_example_listed")
def test_two_threads_leave_no_filter_behind() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        before = list(warnings.filters)
        start = threading.Barrier(4)

        def work() -> None:
            start.wait()
            for _ in range(200):
                with foreign_warnings_ignored():
                    _torch_warning()

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert warnings.filters == before
