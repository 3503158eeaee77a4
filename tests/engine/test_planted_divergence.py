"""A divergence planted just below and just above the eager-check tolerance (issue 18).

`perturb(x)` on site ``replay`` (docs/faults.md) adds x to a replayed graph's output, so
the graph result differs from eager by x exactly (graph and eager are otherwise identical in
float32 on the simulator). The tolerance is the documented float32 default, 1e-4
(docs/semantics.md "Checking against eager"), written here as a literal: a loosened or
tightened default fails one of the two runs.
"""

from __future__ import annotations

import pytest

from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import run

FLOAT32_ATOL = 1e-4


def _run(perturbation: float):
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=4, max_num_batched_tokens=32,
                                        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY",
                                                            "cudagraph_capture_sizes": [1, 2, 4]})
    return run(config, device="sim", requests=2, dtype="float32", faults=f"replay=perturb({perturbation!r})",
               progress=False)


def test_a_divergence_just_below_the_tolerance_passes():
    report = _run(0.8 * FLOAT32_ATOL)
    assert report.ok, report.format_text()
    assert report.atol == FLOAT32_ATOL
    assert 0.7 * FLOAT32_ATOL < report.max_abs_diff_vs_eager <= FLOAT32_ATOL  # the planted x was seen


def test_a_divergence_just_above_the_tolerance_fails_the_run():
    report = _run(1.25 * FLOAT32_ATOL)
    assert not report.ok
    assert report.requests_failed > 0
    assert FLOAT32_ATOL < report.max_abs_diff_vs_eager < 1.5 * FLOAT32_ATOL


def test_perturb_is_a_replay_action_with_a_finite_value():
    from ascendgraph.errors import ConfigError
    from sim.faults import FaultPlan

    assert str(FaultPlan.parse("replay=2*off->perturb(0.5)").rules["replay"][1]) == "perturb(0.5)"
    for bad in ("capture_begin=perturb(1)", "replay=perturb(nan)", "replay=perturb(inf)", "replay=perturb()",
                "replay=perturb"):
        with pytest.raises(ConfigError, match="perturb"):
            FaultPlan.parse(bad)


# bfloat16: the gate is the larger of atol (2e-2) and 4 bfloat16 ulp of the step's largest
# eager value (docs/semantics.md "Checking against eager"): a card's bf16 graph path may
# differ from eager by a few ulp, and at |x| = 4.5 one ulp is already 0.031 > 2e-2.
def test_the_bfloat16_gate_is_a_few_ulp_of_the_magnitude_and_never_below_atol():
    import torch

    from ascendgraph.runtime.stages.check import bfloat16_ulp, step_tolerance

    assert bfloat16_ulp(4.5) == 2.0 ** -5 and bfloat16_ulp(1.0) == 2.0 ** -7 and bfloat16_ulp(0.0) == 0.0
    assert step_tolerance(2e-2, torch.bfloat16, 4.5, explicit_atol=False) == 4 * 2.0 ** -5
    assert step_tolerance(2e-2, torch.bfloat16, 0.5, explicit_atol=False) == 2e-2  # atol is the floor
    assert step_tolerance(2e-2, torch.bfloat16, 4.5, explicit_atol=True) == 2e-2  # a user's atol is exact
    assert step_tolerance(FLOAT32_ATOL, torch.float32, 4.5, explicit_atol=False) == FLOAT32_ATOL


def _run_bfloat16(perturbation: float):
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=4, max_num_batched_tokens=32,
                                        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY",
                                                            "cudagraph_capture_sizes": [1, 2, 4]})
    return run(config, device="sim", requests=2, dtype="bfloat16", faults=f"replay=perturb({perturbation!r})",
               progress=False)


def test_a_bfloat16_divergence_of_a_fraction_of_an_ulp_passes_and_a_large_one_is_caught():
    assert _run_bfloat16(1e-3).ok
    caught = _run_bfloat16(1.0)
    assert not caught.ok and caught.requests_failed > 0
    assert caught.max_abs_diff_vs_eager >= 0.9
