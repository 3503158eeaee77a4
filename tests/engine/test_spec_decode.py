"""Speculative decoding (q = 1 + k tokens per decoding request) end to end."""

from __future__ import annotations

import pytest

from ascendgraph.modes import GraphMode
from ascendgraph.resolve import resolve
from ascendgraph.runtime.workload import WorkloadSpec
from tests.engine.helpers import run_engine, small_config

WORKLOAD = WorkloadSpec(num_requests=4, seed=1, prompt_words=(3, 8), output_tokens=(4, 8), burst_size=2, burst_gap=3)


# Each row runs one k by default; the other k of each row is the exhaustive rest (-m slow).
@pytest.mark.parametrize(
    "k, mode, model, backend",
    [
        pytest.param(2, "FULL_DECODE_ONLY", "tiny-mla", "mla"),
        pytest.param(1, "FULL_AND_PIECEWISE", "tiny", "ascend"),
        pytest.param(1, "FULL_DECODE_ONLY", "tiny-mla", "mla", marks=pytest.mark.slow),
        pytest.param(2, "FULL_AND_PIECEWISE", "tiny", "ascend", marks=pytest.mark.slow),
    ],
)
def test_spec_decode_serves_uniform_batches_of_q_tokens_per_request_in_full_graphs(k, mode, model, backend):
    q = 1 + k
    config = small_config(mode, model=model, backend=backend, sizes=(1, 2, 4, 8), num_speculative_tokens=k,
                          max_num_batched_tokens=16)
    resolution = resolve(config)
    assert all(size % q == 0 for size in resolution.capture_sizes), "sizes are rounded to multiples of q"
    result = run_engine(config, workload=WORKLOAD)
    report = result.report
    assert report.ok, report.format_text()
    assert report.max_abs_diff_vs_eager <= 1e-5
    full = [r for r in result.steps if r.runtime_mode is GraphMode.FULL]
    assert full, "decode batches replay FULL graphs"
    for record in full:
        assert record.descriptor.uniform and record.descriptor.num_tokens % q == 0
        assert record.descriptor.num_reqs == record.descriptor.num_tokens // q
        assert record.num_tokens == record.num_reqs * q
