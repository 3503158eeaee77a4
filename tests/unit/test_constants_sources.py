"""Every Ascend-specific constant, pinned to its upstream source (docs/semantics.md, issue 18).

Each test names where its figure comes from and writes the figure as a literal read from that
source, never taken from the implementation: a constant that drifts from its source fails
here. Where upstream states a worked example or users reported an observed result, the test
reproduces that example end to end (an independent oracle, not a restated formula).

Sources (commits and pull requests as cited in docs/semantics.md):

* vLLM Ascend `vllm_ascend/platform.py`: `_get_default_max_cudagraph_capture_size` (PR #7572),
  `MAX_CAPTURE_SIZES_FOR_950` (PR #10567), `check_and_update_config` at commit 8243ecf5
  (TP alignment, warm-ups, ASCEND_LAUNCH_BLOCKING).
* vLLM Ascend `vllm_ascend/config/aclgraph.py` `update_aclgraph_sizes` at commit 41896bc9
  (1800 / 40 / 100 and the FFTS+ / AIV formula with its worked examples).
* vLLM Ascend `vllm_ascend/ascend_config.py` (`XliteGraphConfig`, `AscendCompilationConfig`) and
  `vllm_ascend/xlite/xlite.py` (`max_m`), main (2026).
* Public observations: vLLM issue #32324, vLLM Ascend issues #1168 and #16049, PR #16970, a
  user's Kimi-K2.6 TP = 8 deployment note.
"""

from __future__ import annotations

import pytest

from ascendgraph import ConfigError
from ascendgraph.config import GraphConfig
from ascendgraph.errors import LAUNCH_BLOCKING_MESSAGE
from ascendgraph.resolve import A5_MAX_PIECEWISE_SIZES, ASCEND_WARMUPS, resolve
from ascendgraph.sizes import (
    ASCEND_MAX_CAPTURE_SIZE_CAP,
    CONTEXT_PARALLEL_RESERVED_STREAMS,
    DEFAULT_MAX_STREAMS,
    FFTS_STREAMS_PER_COMM_GROUP,
    align_sizes_to_tp,
    ascend_default_max_capture_size,
    plan_stream_budget,
    sample_sizes,
)
from ascendgraph.xlite import (
    XLITE_BLOCK_SIZE,
    XLITE_PIPELINE_PARALLEL_ERROR,
    XLITE_SPEC_DECODE_ERROR,
    xlite_token_budget,
)

# The default list of vLLM at the time of vLLM Ascend issue #1168: 1, 2, 4, then steps of 8 to 512.
SIZES_OF_ISSUE_1168 = [1, 2, 4] + list(range(8, 513, 8))


def _resolve(**engine_args):
    return resolve(GraphConfig.from_vllm_args(**engine_args), env={})


# --------------------------------------------------------------------------- §2 capture sizes


def test_default_max_cap_is_512():
    """vLLM Ascend `_get_default_max_cudagraph_capture_size` caps the default at 512 (PR #7572)."""
    assert ASCEND_MAX_CAPTURE_SIZE_CAP == 512
    assert ascend_default_max_capture_size(1024) == 512


def test_default_max_has_no_times_two():
    """vLLM issue #32324 (the motivation of vLLM Ascend PR #7572): max_num_seqs 40 with 3
    speculative tokens gave 320 with vLLM's `* 2`; Ascend's default is 160."""
    assert ascend_default_max_capture_size(40, 3) == 160
    assert ascend_default_max_capture_size(40, 0) == 40


@pytest.mark.parametrize(
    ("max_num_seqs", "observed"),
    [
        (12, [1, 2, 4, 8]),  # vLLM Ascend issue #16049's table
        (20, [1, 2, 4, 8, 16]),  # same table
        (77, [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72]),  # PR #16970's baseline: the sizes end at 72
    ],
)
def test_default_sizes_match_what_vllm_ascend_users_observed(max_num_seqs, observed):
    """The Ascend default max is injected as if the user had given it, so an off-grid
    max_num_seqs is truncated to the grid (the behaviour issue #16049 reports, FULL_DECODE_ONLY)."""
    resolution = _resolve(compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"}, max_num_seqs=max_num_seqs)
    assert resolution.capture_sizes == observed
    assert f"Truncating max_cudagraph_capture_size to {observed[-1]}" in resolution.warnings


def test_tp_alignment_error_text_matches_a_users_report():
    """A vLLM Ascend user's Kimi-K2.6 deployment at TP = 8 failed with exactly this text."""
    with pytest.raises(ConfigError) as info:
        align_sizes_to_tp([1, 2, 4], 8)
    assert str(info.value) == "cudagraph_capture_sizes [1, 2, 4] does not contain values that are multiples of tp_size 8"


def test_tp_alignment_under_shared_expert_dp_reaches_the_same_error():
    """vLLM Ascend `enable_sp(vllm_config, enable_shared_expert_dp)`: shared-expert DP forces
    sequence parallelism, whose branch of `check_and_update_config` (commit 8243ecf5) aligns
    the sizes to tp. The Ascend default max for 4 seqs gives [1, 2, 4], as in the report."""
    with pytest.raises(ConfigError) as info:
        _resolve(
            compilation_config={"cudagraph_mode": "PIECEWISE"},
            tensor_parallel_size=8,
            max_num_seqs=4,
            enable_expert_parallel=True,
            additional_config={"enable_shared_expert_dp": True},
        )
    assert str(info.value) == "cudagraph_capture_sizes [1, 2, 4] does not contain values that are multiples of tp_size 8"


def test_a5_captures_at_most_four_piecewise_sizes():
    """vLLM Ascend `MAX_CAPTURE_SIZES_FOR_950 = 4` and `_prune_capture_sizes_for_950` (PR #10567)."""
    assert A5_MAX_PIECEWISE_SIZES == 4
    resolution = _resolve(compilation_config={"cudagraph_mode": "PIECEWISE"}, soc="A5")
    assert len(resolution.capture_sizes) == 4
    assert resolution.capture_sizes[0] == 1  # first and last kept, as upstream's sampling does


def test_one_warm_up_per_size():
    """vLLM Ascend `check_and_update_config` (commit 8243ecf5) sets cudagraph_num_of_warmups to 1."""
    assert ASCEND_WARMUPS == 1
    assert _resolve().warmups == 1


# --------------------------------------------------------------------------- §3 resolution texts


def test_launch_blocking_text_is_vllm_ascends():
    """vLLM Ascend `check_and_update_config` (commit 8243ecf5): the ValueError's opening sentence."""
    assert LAUNCH_BLOCKING_MESSAGE.startswith(
        "ACL graph is incompatible with ASCEND_LAUNCH_BLOCKING=1. Please unset ASCEND_LAUNCH_BLOCKING or set it to 0."
    )


def test_310p_npugraph_ex_warning_is_vllm_ascends():
    """vLLM Ascend `AscendCompilationConfig` (main, 2026) warns with this text on 310P."""
    resolution = _resolve(
        compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY"},
        soc="310P",
        additional_config={"ascend_compilation_config": {"enable_npugraph_ex": True}},
    )
    assert resolution.npugraph_ex is False
    assert "npugraph_ex is not supported on Ascend 310P. Disabling it." in resolution.warnings


# --------------------------------------------------------------------------- §9 streams


def test_stream_constants_of_update_aclgraph_sizes():
    """`update_aclgraph_sizes` (vllm_ascend/config/aclgraph.py, commit 41896bc9):
    MAX_CAPTURE_SIZE = 1800, 40 streams per communication group under FFTS+,
    CP_ADDITIONAL_STREAM_NUM = 100."""
    assert DEFAULT_MAX_STREAMS == 1800
    assert FFTS_STREAMS_PER_COMM_GROUP == 40
    assert CONTEXT_PARALLEL_RESERVED_STREAMS == 100


def test_context_parallel_costs_100_streams_each():
    """Same function: pcp > 1 and dcp > 1 each take 100 streams from the FFTS+ budget."""
    base = dict(num_hidden_layers=4, capture_sizes=[1, 2, 4], mode="PIECEWISE", tensor_parallel_size=2)
    plain = plan_stream_budget(**base)
    both = plan_stream_budget(**base, prefill_context_parallel_size=2, decode_context_parallel_size=2)
    assert both.reserved_streams - plain.reserved_streams == 200


@pytest.mark.parametrize(
    ("expansion", "is_moe", "upstream_example"),
    [
        (None, False, 12),  # the FFTS+ branch's worked example: floor((1920 - 40) / 49 / 3)
        ("AIV", True, 19),  # the AIV branch's worked example: floor(1920 / 49 / 2)
    ],
)
def test_planner_reproduces_the_worked_examples_of_update_aclgraph_sizes(expansion, is_moe, upstream_example):
    """`update_aclgraph_sizes` comments a budget of 1920, 48 layers, dp 1 and tp 4."""
    plan = plan_stream_budget(
        num_hidden_layers=48,
        capture_sizes=SIZES_OF_ISSUE_1168,
        mode="PIECEWISE",
        tensor_parallel_size=4,
        hccl_op_expansion_mode=expansion,
        is_moe=is_moe,
        max_streams=1920,
    )
    assert plan.max_num_sizes == upstream_example


def test_even_sampling_matches_the_selection_users_observed():
    """vLLM Ascend issue #1168: with room for 6 of the 67 sizes of the time, the engine chose
    [512, 408, 304, 192, 88, 1] (the uniform sampling of update_aclgraph_sizes)."""
    assert len(SIZES_OF_ISSUE_1168) == 67
    assert sample_sizes(SIZES_OF_ISSUE_1168, 6) == [1, 88, 192, 304, 408, 512]


# --------------------------------------------------------------------------- §11 xlite


def test_xlite_error_texts_and_block_size_are_vllm_ascends():
    """vLLM Ascend `XliteGraphConfig` (vllm_ascend/ascend_config.py, main 2026): the two
    RuntimeError texts and the recommended block size 128."""
    assert XLITE_SPEC_DECODE_ERROR == "Xlite graph mode only support speculative decoding with num_speculative_tokens=1."
    assert XLITE_PIPELINE_PARALLEL_ERROR == (
        "Xlite graph mode is not compatible with pipeline parallelism. Please set pipeline_parallel_size to 1."
    )
    assert XLITE_BLOCK_SIZE == 128


@pytest.mark.parametrize(("batched", "tp", "expected"), [(8190, 4, 8192), (8192, 4, 8192), (100, 3, 102), (7, 1, 7)])
def test_xlite_full_mode_budget_is_batched_tokens_rounded_up_to_tp(batched, tp, expected):
    """vLLM Ascend `StandardXliteModel._build_model_config` (vllm_ascend/xlite/xlite.py, main 2026):
    full mode's `max_m` is ceil(max_num_batched_tokens / tp) * tp."""
    budget = xlite_token_budget(full_mode=True, max_num_seqs=256, max_num_batched_tokens=batched, tensor_parallel_size=tp)
    assert budget == expected
