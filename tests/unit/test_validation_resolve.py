"""Resolution-level input checks: a graph mode left without capture sizes says so, the token
budget must cover max_num_seqs (vLLM 0.32 SchedulerConfig), and HCCL_OP_EXPANSION_MODE is
checked (an explicit bad value is a ConfigError, a bad environment value a warning)."""

from __future__ import annotations

import pytest

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.modes import GraphMode
from ascendgraph.resolve import resolve

# --------------------------------------------------------------------------- no capture size left


def test_graph_mode_with_every_size_dropped_warns_and_records_a_decision():
    config = GraphConfig.from_vllm_args(compilation_config={"cudagraph_capture_sizes": [100000]})
    resolution = resolve(config, env={})
    assert resolution.mode is GraphMode.FULL_AND_PIECEWISE  # docs/semantics.md §2.3: not an error, mode kept
    assert resolution.capture_sizes == [] and resolution.stream_plan is None
    expected = ("no capture size remains (every configured size in [100000] exceeds max_num_batched_tokens=8192): "
                "cudagraph_mode=FULL_AND_PIECEWISE captures nothing and every batch runs eagerly; "
                "choose cudagraph_capture_sizes <= 8192")
    assert any(w.startswith(expected) for w in resolution.warnings), resolution.warnings
    decision = resolution.decision("no_capture_sizes")
    assert decision is not None and decision.before == "FULL_AND_PIECEWISE" and "nothing captured" in decision.after


def test_sizes_that_fit_and_eager_mode_get_no_such_warning():
    fitting = resolve(GraphConfig.from_vllm_args(compilation_config={"cudagraph_capture_sizes": [100000, 8]}), env={})
    eager = resolve(GraphConfig.from_vllm_args(compilation_config={"cudagraph_capture_sizes": [100000]},
                                               enforce_eager=True), env={})
    for resolution in (fitting, eager):
        assert resolution.decision("no_capture_sizes") is None
        assert not any("no capture size remains" in w for w in resolution.warnings)


def test_explain_shows_the_warning(capsys):
    from ascendgraph.cli.app import main

    assert main(["explain", "--compilation-config", '{"cudagraph_capture_sizes":[100000]}']) == 0
    out, _ = capsys.readouterr()
    assert "no capture size remains" in out and "[no_capture_sizes]" in out


# --------------------------------------------------------------------------- token budget


def test_a_token_budget_below_max_num_seqs_is_refused_like_vllm():
    with pytest.raises(ConfigError) as info:
        GraphConfig.from_vllm_args(max_num_seqs=512, max_num_batched_tokens=64)
    assert info.value.key == "max_num_batched_tokens"
    message = str(info.value)
    # vLLM 0.32 SchedulerConfig.verify_max_model_len, verbatim, then the fix.
    assert message.startswith("max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (512).")
    assert "at least 512" in message and "at most 64" in message


@pytest.mark.parametrize("kwargs, seqs", [
    (dict(max_num_batched_tokens=64), 64),  # vLLM: an unset max_num_seqs defaults to min(256, budget)
    (dict(max_num_batched_tokens=1000), 256),
    (dict(max_num_seqs=64, max_num_batched_tokens=64), 64),
    (dict(max_num_seqs=600), 600),
])
def test_budgets_vllm_accepts_are_accepted(kwargs, seqs):
    assert GraphConfig.from_vllm_args(**kwargs).max_num_seqs == seqs


def test_defaulting_max_num_seqs_leaves_the_capture_sizes_alone():
    small = resolve(GraphConfig.from_vllm_args(max_num_batched_tokens=100), env={})
    assert small.capture_sizes[-1] == 100 and small.max_capture_size == 100


def test_explain_refuses_the_budget_with_exit_2(capsys):
    from ascendgraph.cli.app import main

    assert main(["explain", "--max-num-seqs", "512", "--max-num-batched-tokens", "64"]) == 2
    _, err = capsys.readouterr()
    assert "max_num_batched_tokens (64) must be greater than or equal to max_num_seqs (512)" in err
    assert "Traceback" not in err


# --------------------------------------------------------------------------- HCCL_OP_EXPANSION_MODE


def test_an_explicit_bad_expansion_mode_is_a_config_error_naming_the_valid_values():
    with pytest.raises(ConfigError) as info:
        resolve(GraphConfig(), env={}, hccl_op_expansion_mode="bogus")
    assert info.value.key == "hccl_op_expansion_mode"
    message = str(info.value)
    assert "got 'bogus'" in message and "AIV" in message and "FFTS+" in message


@pytest.mark.parametrize("value, label", [
    ("AIV", "AIV"), ("aiv", "AIV"), (" AIV ", "AIV"), ("FFTS+", "FFTS+"), ("AICPU", "AICPU"), ("ai_cpu", "AI_CPU"),
    ("HOST", "HOST"), (None, "FFTS+"), ("", "FFTS+"),
])
def test_valid_explicit_expansion_modes_are_accepted(value, label):
    resolution = resolve(GraphConfig(), env={}, hccl_op_expansion_mode=value)
    assert resolution.stream_plan is not None and resolution.stream_plan.expansion_mode == label
    assert not any("HCCL_OP_EXPANSION_MODE" in w for w in resolution.warnings)


def test_a_bad_environment_expansion_mode_warns_and_plans_as_ffts():
    resolution = resolve(GraphConfig(), env={"HCCL_OP_EXPANSION_MODE": "bogus"})
    assert resolution.stream_plan is not None and resolution.stream_plan.expansion_mode == "FFTS+"
    warning = next(w for w in resolution.warnings if "HCCL_OP_EXPANSION_MODE='bogus'" in w)
    assert "export HCCL_OP_EXPANSION_MODE=AIV" in warning
    # an explicit value wins over the environment, and a good environment value is quiet
    assert not any("HCCL" in w for w in resolve(GraphConfig(), env={"HCCL_OP_EXPANSION_MODE": "bogus"},
                                                hccl_op_expansion_mode="AIV").warnings)
    assert resolve(GraphConfig(), env={"HCCL_OP_EXPANSION_MODE": "aiv"}).stream_plan.expansion_mode == "AIV"


def test_explain_refuses_a_bad_expansion_flag_with_exit_2(capsys):
    from ascendgraph.cli.app import main

    assert main(["explain", "--hccl-op-expansion-mode", "bogus"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "got 'bogus'" in err and "(BOGUS)" not in err
