"""Small conventions a user expects: counts that agree with their noun, excerpts cut at a word
with an ellipsis, no raw object reprs in log lines, and a checkout that `ascendgraph profile`
leaves clean."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest

from ascendgraph.cli.app import main
from ascendgraph.cli.profile import DEFAULT_PROFILE_DIR
from ascendgraph.explanation import count_noun
from ascendgraph.tools.diagnose.incidents import shorten

# Engine runs that never look at the compile cache: they share the worker's (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("worker_compile_cache")

REPO = Path(__file__).resolve().parents[2]


def test_count_noun_agrees_with_the_count():
    assert count_noun(1, "layer") == "1 layer"
    assert count_noun(2, "layer") == "2 layers"
    assert count_noun(0, "batch", "batches") == "0 batches"


@pytest.mark.parametrize("argv, text", [
    (["explain", "--num-layers", "1"], "(Qwen3ForCausalLM, 1 layer)"),
    (["plan", "--num-layers", "1", "--measure", "off", "--requests", "2"], "(Qwen3ForCausalLM, 1 layer)"),
    (["explain", "--num-layers", "2"], "(Qwen3ForCausalLM, 2 layers)"),
])
def test_reports_say_1_layer_not_1_layers(capsys, argv, text):
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert text in out and "1 layers" not in out


def test_an_excerpt_is_cut_at_a_word_with_an_ellipsis():
    text = "RuntimeError: " + "capture failed because the stream budget ran out " * 10
    short = shorten(text, 200)
    assert len(short) <= 200 and short.endswith("…")
    assert text.startswith(short[:-1])
    assert text[len(short) - 1] == " "  # the cut falls on a word boundary
    assert shorten("short enough", 200) == "short enough"


def test_a_capture_fallback_logs_readable_device_figures_not_a_repr(caplog):
    from ascendgraph import run

    caplog.set_level(logging.INFO, logger="ascendgraph")
    config = {"num_layers": 1, "max_num_seqs": 4, "max_num_batched_tokens": 8,
              "compilation_config": {"cudagraph_mode": "PIECEWISE", "cudagraph_capture_sizes": [1, 2, 4]}}
    report = run(config, device="sim", requests=1, faults="capture_begin=2*off->raise(207008)",
                 on_capture_error="eager")
    assert report.capture_fallback is not None
    released = [r.getMessage() for r in caplog.records if "released" in r.getMessage()]
    assert released and "DeviceStats(" not in released[0] and "streams in use" in released[0]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO / ".git").exists(), reason="not a git checkout")
def test_the_default_profile_folder_is_ignored_by_git():
    probe = f"{DEFAULT_PROFILE_DIR}/host_1_ascend_pt/ASCEND_PROFILER_OUTPUT/op_statistic.csv"
    result = subprocess.run(["git", "-C", str(REPO), "check-ignore", "-q", probe], check=False)
    assert result.returncode == 0, f"{DEFAULT_PROFILE_DIR}/ is not in .gitignore"
