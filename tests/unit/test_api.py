"""The Python API: ascendgraph.explain / ascendgraph.run return what the CLI prints."""

from __future__ import annotations

import sys

import pytest

import ascendgraph
from ascendgraph import ConfigError, GraphConfig, GraphMode

# Engine runs that never look at the compile cache: they share the worker's (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("worker_compile_cache")


@pytest.mark.parametrize("call", [
    lambda: ascendgraph.explain(compilation_config={"cudagraph_mode": "FULL"}, attention_backend="mla"),
    lambda: ascendgraph.explain({"compilation_config": {"cudagraph_mode": "FULL"}, "attention_backend": "mla"}),
    lambda: ascendgraph.explain(GraphConfig.from_vllm_args(compilation_config={"cudagraph_mode": "FULL"},
                                                           attention_backend="mla")),
])
def test_explain_accepts_a_config_a_mapping_or_keywords(call):
    resolution = call()
    assert resolution.requested_mode is GraphMode.FULL and resolution.mode is GraphMode.FULL_DECODE_ONLY
    assert resolution.decision("attention_narrowing") is not None


def test_explain_takes_resolve_options():
    resolution = ascendgraph.explain(optimization_level=1, stream_limit=20, hccl_op_expansion_mode="AIV",
                                     compilation_config={"cudagraph_capture_sizes": [1, 2, 4, 8]}, env={})
    assert resolution.stream_plan.max_num_sizes == 3 and not resolution.stream_plan.fits


def test_explain_refuses_a_config_and_keywords_together():
    with pytest.raises(ConfigError, match="not both"):
        ascendgraph.explain(GraphConfig(), max_num_seqs=4)


def test_explain_refuses_something_else():
    with pytest.raises(ConfigError, match="expected a GraphConfig or a mapping"):
        ascendgraph.explain(["--enforce-eager"])  # type: ignore[arg-type]


def test_importing_ascendgraph_does_not_import_the_engine():
    import subprocess

    code = "import ascendgraph, sys; print('ascendgraph.runtime.engine' in sys.modules, 'torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "False"], done.stderr


def test_run_returns_the_report_the_cli_prints():
    report = ascendgraph.run({"model": "tiny", "num_layers": 1, "max_num_seqs": 4,
                              "compilation_config": {"cudagraph_mode": "FULL_DECODE_ONLY",
                                                     "cudagraph_capture_sizes": [1, 2, 4]}},
                             device="sim", requests=4, seed=3)
    assert isinstance(report, ascendgraph.Report)
    assert report.exit_code == 0 and report.requests_completed == 4 and report.requests_failed == 0
    assert report.effective_mode == "FULL_DECODE_ONLY"
