"""docs/semantics.md §2 (capture sizes) and §9 (stream budget), table-driven, plus properties."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascendgraph import ConfigError, GraphMode
from ascendgraph.sizes import (
    align_sizes_to_tp,
    ascend_default_max_capture_size,
    compute_capture_sizes,
    pad_num_tokens,
    padding_table,
    padding_waste,
    plan_stream_budget,
    request_counts,
    round_sizes_for_spec_decode,
    sample_sizes,
    select_sizes,
)

LEGACY_67 = [1, 2, 4] + list(range(8, 513, 8))


def generated(max_size: int) -> list[int]:
    out = [s for s in (1, 2, 4) if s <= max_size]
    out += list(range(8, min(max_size + 1, 256), 8))
    out += list(range(256, max_size + 1, 16))
    return out


# ---------------------------------------------------------------- §2 step 1-3 (vLLM rule)

SIZE_CASES = [
    # id, kwargs, expected sizes, expected max, expected warnings (fragments)
    ("default 256 seqs: max 512, decode size 256 already there",
     dict(max_num_seqs=256, max_num_batched_tokens=8192), generated(512), 512, []),
    ("default 8 seqs: max 16, plus decode size 8",
     dict(max_num_seqs=8, max_num_batched_tokens=8192), [1, 2, 4, 8, 16], 16, []),
    ("default 3 seqs: max 6 -> [1,2,4] plus decode size 3",
     dict(max_num_seqs=3, max_num_batched_tokens=8192), [1, 2, 3, 4], 4, []),
    ("mnbt below the default max caps it and is itself captured",
     dict(max_num_seqs=256, max_num_batched_tokens=100), generated(100) + [100], 100, []),
    ("spec decode k=1 with 4 seqs: decode sizes 2,4,8 within max 16",
     dict(max_num_seqs=4, max_num_batched_tokens=8192, num_speculative_tokens=1), [1, 2, 4, 8, 16], 16, []),
    ("spec decode k=2 with 5 seqs: decode sizes n*3",
     dict(max_num_seqs=5, max_num_batched_tokens=8192, num_speculative_tokens=2),
     sorted(set(generated(30) + [3, 6, 12, 15])), 24, []),
    ("user max gets no decode sizes",
     dict(max_num_seqs=3, max_num_batched_tokens=8192, max_capture_size=8), [1, 2, 4, 8], 8, []),
    ("user max that is not a generated size is truncated with a warning",
     dict(max_num_seqs=77, max_num_batched_tokens=8192, max_capture_size=77), generated(72), 72,
     ["Truncating max_cudagraph_capture_size to 72"]),
    ("user max above mnbt: mnbt becomes max and is captured; warning",
     dict(max_num_seqs=8, max_num_batched_tokens=20, max_capture_size=64), [1, 2, 4, 8, 16, 20], 20,
     ["Truncating max_cudagraph_capture_size to 20"]),
    ("user sizes: de-duplicated and sorted, no warning when nothing is lost",
     dict(max_num_seqs=8, max_num_batched_tokens=8192, capture_sizes=[8, 1, 4]), [1, 4, 8], 8, []),
    ("user sizes with a duplicate warn (the list shrank)",
     dict(max_num_seqs=8, max_num_batched_tokens=8192, capture_sizes=[4, 4, 2]), [2, 4], 4,
     ["cudagraph_capture_sizes specified in compilation_config [4, 4, 2] is overridden by config [2, 4]"]),
    ("user sizes above mnbt are dropped (not those above max)",
     dict(max_num_seqs=2, max_num_batched_tokens=64, capture_sizes=[1, 32, 64, 128]), [1, 32, 64], 64,
     ["is overridden by config [1, 32, 64]"]),
    ("user sizes all above mnbt: empty and max 0 with the warning",
     dict(max_num_seqs=8, max_num_batched_tokens=16, capture_sizes=[32, 64]), [], 0,
     ["is overridden by config []"]),
    ("user sizes and a matching user max are fine",
     dict(max_num_seqs=8, max_num_batched_tokens=8192, capture_sizes=[2, 6], max_capture_size=6), [2, 6], 6, []),
    ("interactivity starts with every size up to 32",
     dict(max_num_seqs=64, max_num_batched_tokens=8192, max_capture_size=48, performance_mode="interactivity"),
     list(range(1, 33)) + [40, 48], 48, []),
]


@pytest.mark.parametrize("kwargs, sizes, max_size, warnings", [c[1:] for c in SIZE_CASES], ids=[c[0] for c in SIZE_CASES])
def test_compute_capture_sizes_table(kwargs, sizes, max_size, warnings):
    result = compute_capture_sizes(**kwargs)
    assert result.sizes == sizes
    assert result.max_size == max_size
    assert len(result.warnings) == len(warnings)
    for fragment, text in zip(warnings, result.warnings):
        assert fragment in text


def test_user_max_inconsistent_with_user_sizes_is_an_error():
    with pytest.raises(ConfigError, match=r"customized max_cudagraph_capture_size\(=16\) should be consistent "
                                          r"with the max value of cudagraph_capture_sizes\(=8\)"):
        compute_capture_sizes(max_num_seqs=8, max_num_batched_tokens=8192, capture_sizes=[1, 8], max_capture_size=16)


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(max_num_seqs=8, max_num_batched_tokens=8192, capture_sizes=[]), "must not be empty"),
    (dict(max_num_seqs=0, max_num_batched_tokens=8192), "max_num_seqs must be >= 1, got 0"),
    (dict(max_num_seqs=8, max_num_batched_tokens=-5), "max_num_batched_tokens must be >= 1, got -5"),
    (dict(max_num_seqs=8, max_num_batched_tokens=64, num_speculative_tokens=-1), "num_speculative_tokens"),
    (dict(max_num_seqs=8, max_num_batched_tokens=64, capture_sizes=[0, 4]), "entry must be >= 1"),
    (dict(max_num_seqs=8, max_num_batched_tokens=64, max_capture_size=0), "max_cudagraph_capture_size"),
    (dict(max_num_seqs="8", max_num_batched_tokens=64), "must be an integer"),
    (dict(max_num_seqs=8, max_num_batched_tokens=64, performance_mode="fast"), "performance_mode"),
])
def test_bad_size_inputs_are_config_errors_naming_the_key(kwargs, fragment):
    with pytest.raises(ConfigError, match=fragment):
        compute_capture_sizes(**kwargs)


def test_request_counts_follow_the_vllm_grid():
    assert request_counts(3) == [1, 2, 3]
    assert request_counts(20) == [1, 2, 4, 8, 16, 20]
    assert request_counts(300)[-4:] == [256, 272, 288, 300]
    assert request_counts(10_000)[-1] == 512


# ---------------------------------------------------------------- Ascend default max

@pytest.mark.parametrize("seqs, k, expected", [(40, 3, 160), (200, 3, 512), (256, 0, 256), (1, 0, 1), (600, 0, 512)])
def test_ascend_default_max_has_no_factor_two(seqs, k, expected):
    assert ascend_default_max_capture_size(seqs, k) == expected


# ---------------------------------------------------------------- TP alignment

TP_CASES = [
    ([1, 2, 4, 8, 16], 2, [2, 4, 8, 16]),
    ([1, 2, 4, 8, 16], 4, [4, 8, 16]),
    ([1, 2, 4, 8, 16], 16, [16]),
    ([1, 2, 3, 6, 12], 3, [3, 6, 12]),
    ([8, 16, 24], 1, [8, 16, 24]),
    ([], 4, []),
]


@pytest.mark.parametrize("sizes, tp, expected", TP_CASES)
def test_align_sizes_to_tp_table(sizes, tp, expected):
    assert align_sizes_to_tp(sizes, tp) == expected


def test_align_sizes_to_tp_with_nothing_left_names_the_sizes_and_tp():
    with pytest.raises(ConfigError, match=r"cudagraph_capture_sizes \[1, 3, 5\] does not contain values that are "
                                          r"multiples of tp_size 4"):
        align_sizes_to_tp([1, 3, 5], 4)


# ---------------------------------------------------------------- spec-decode rounding

ROUND_CASES = [
    ([1, 2, 4, 8], 8, 2, [2, 4, 8], 8),
    ([1, 2, 4, 8, 16], 16, 3, [3, 6, 9, 18][:3], 9),
    ([1, 2, 4], 4, 3, [3], 3),
    ([1, 2], 2, 2, [2], 2),
    ([1], 1, 1, [1], 1),
    ([], 0, 3, [], 0),
    ([5, 7], 7, 5, [5], 5),
    ([1], 3, 3, [3], 3),
]


@pytest.mark.parametrize("sizes, max_size, q, expected, expected_max", ROUND_CASES)
def test_round_sizes_for_spec_decode_table(sizes, max_size, q, expected, expected_max):
    assert round_sizes_for_spec_decode(sizes, max_size, query_len=q) == (expected, expected_max)


def test_rounding_without_any_valid_size_is_an_error():
    with pytest.raises(ConfigError, match=r"^No valid cudagraph sizes after rounding to multiple of 3 "
                                          r"\(num_speculative_tokens \+ 1\) please adjust num_speculative_tokens "
                                          r"\(2\) or max_cudagraph_capture_size \(2\) or cudagraph_capture_sizes "
                                          r"\(\[1, 2\]\)$"):
        round_sizes_for_spec_decode([1, 2], 2, query_len=3)


# ---------------------------------------------------------------- padding

def test_padding_table_pads_up_to_the_next_capture_size():
    assert padding_table([1, 2, 4, 8]) == [0, 1, 2, 4, 4, 8, 8, 8, 8]
    assert padding_table([]) == [0]
    assert pad_num_tokens(9, [1, 2, 4, 8]) is None
    assert pad_num_tokens(0, [1, 2]) == 0


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 600), min_size=1, max_size=40))
def test_padding_is_monotone_and_lands_on_a_capture_size(sizes):
    table = padding_table(sizes)
    capture = set(sizes)
    assert table[0] == 0
    assert len(table) == max(sizes) + 1
    for t in range(1, len(table)):
        assert table[t] in capture
        assert table[t] >= t
        assert table[t] >= table[t - 1]
        assert not any(t <= s < table[t] for s in capture)


# ---------------------------------------------------------------- §9 stream budget

def test_even_sampling_of_the_legacy_67_sizes_to_6():
    assert len(LEGACY_67) == 67
    assert sample_sizes(LEGACY_67, 6) == [1, 88, 192, 304, 408, 512]


@pytest.mark.parametrize("n, expected", [(1, [512]), (0, [512]), (2, [1, 512]), (67, LEGACY_67), (100, LEGACY_67)])
def test_sample_sizes_edges_keep_the_largest(n, expected):
    assert sample_sizes(LEGACY_67, n) == expected


STREAM_CHECKS = [
    ("opt-125m-like FFTS+", dict(hccl_op_expansion_mode=None), 138),
    ("opt-125m-like AIV", dict(hccl_op_expansion_mode="AIV"), 137),
    ("opt-125m-like AIV with a 2-layer draft", dict(hccl_op_expansion_mode="AIV", draft_num_hidden_layers=2), 111),
]


@pytest.mark.parametrize("extra, expected", [c[1:] for c in STREAM_CHECKS], ids=[c[0] for c in STREAM_CHECKS])
def test_semantics_stream_budget_checks(extra, expected):
    plan = plan_stream_budget(num_hidden_layers=12, capture_sizes=range(1, 151), mode=GraphMode.PIECEWISE, **extra)
    assert plan.max_num_sizes == expected
    assert not plan.fits
    assert len(plan.sizes) == expected
    assert plan.sizes[0] == 1 and plan.sizes[-1] == 150


STREAM_FORMULA_CASES = [
    # layers, kwargs, expected N, expected streams_per_size
    (48, dict(tensor_parallel_size=4, hccl_op_expansion_mode="FFTS+", max_streams=1920), 12, 49 * 3),
    (48, dict(tensor_parallel_size=4, hccl_op_expansion_mode="AIV", max_streams=1920), (1920 - 2 * 49) // 49 // 2, 98),
    (48, dict(tensor_parallel_size=4, hccl_op_expansion_mode="AIV", is_moe=True, max_streams=1920), 19, 98),
    (10, dict(tensor_parallel_size=2, data_parallel_size=2, hccl_op_expansion_mode="AIV", is_moe=True,
              enable_expert_parallel=True, multistream_overlap_shared_expert=True), 1800 // 11 // 6, 66),
    (10, dict(prefill_context_parallel_size=2, decode_context_parallel_size=2), (1800 - 200) // 11, 11),
    (10, dict(tensor_parallel_size=2, prefill_context_parallel_size=2), (1800 - 100 - 40) // 11 // 3, 33),
]


@pytest.mark.parametrize("layers, kwargs, expected_n, per_size", STREAM_FORMULA_CASES)
def test_stream_budget_formula_table(layers, kwargs, expected_n, per_size):
    plan = plan_stream_budget(num_hidden_layers=layers, capture_sizes=[1, 2], mode=GraphMode.PIECEWISE, **kwargs)
    assert plan.max_num_sizes == expected_n
    assert plan.streams_per_size == per_size


def test_full_and_piecewise_first_subtracts_the_number_of_sizes():
    sizes = list(range(1, 41))
    piecewise = plan_stream_budget(num_hidden_layers=12, capture_sizes=sizes, mode=GraphMode.PIECEWISE)
    both = plan_stream_budget(num_hidden_layers=12, capture_sizes=sizes, mode=GraphMode.FULL_AND_PIECEWISE)
    assert piecewise.max_num_sizes == 1800 // 13
    assert both.max_num_sizes == (1800 - 40) // 13
    assert both.full_graph_reserve == 40


def test_full_modes_cost_one_stream_per_size():
    plan = plan_stream_budget(num_hidden_layers=28, capture_sizes=[1, 2, 4], mode=GraphMode.FULL_DECODE_ONLY)
    assert plan.graphs_per_size == 1 and plan.streams_per_size == 1 and plan.fits


def test_plan_names_the_largest_fitting_selection_when_it_does_not_fit():
    plan = plan_stream_budget(num_hidden_layers=12, capture_sizes=LEGACY_67, mode=GraphMode.PIECEWISE, max_streams=6 * 13)
    assert plan.max_num_sizes == 6
    assert plan.sizes == [1, 88, 192, 304, 408, 512]
    assert not plan.fits
    assert any("at most 6 sizes fit" in w for w in plan.warnings)
    assert plan.first_failing_index() == 6
    assert plan.streams_needed(6) == 78 and plan.streams_needed(7) > 78


def test_ffts_with_communication_groups_hints_at_aiv():
    plan = plan_stream_budget(num_hidden_layers=4, capture_sizes=[1], mode=GraphMode.PIECEWISE, tensor_parallel_size=2)
    assert any("HCCL_OP_EXPANSION_MODE=AIV" in w for w in plan.warnings)


@settings(max_examples=200, deadline=None)
@given(layers=st.integers(1, 64), n_sizes=st.integers(1, 200), limit=st.integers(50, 4000),
       tp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([1, 2]), aiv=st.booleans(),
       mode=st.sampled_from([GraphMode.PIECEWISE, GraphMode.FULL_AND_PIECEWISE, GraphMode.FULL]))
def test_planner_n_fits_and_n_plus_one_does_not(layers, n_sizes, limit, tp, dp, aiv, mode):
    sizes = list(range(1, n_sizes + 1))
    plan = plan_stream_budget(num_hidden_layers=layers, capture_sizes=sizes, mode=mode, tensor_parallel_size=tp,
                              data_parallel_size=dp, hccl_op_expansion_mode="AIV" if aiv else None, max_streams=limit)
    n = plan.max_num_sizes
    assert plan.streams_needed(n) <= limit or n == 0
    assert plan.streams_needed(n + 1) > limit
    assert len(plan.sizes) == min(n_sizes, n) or (n == 0 and plan.sizes == [n_sizes])


# ---------------------------------------------------------------- workload-aware selection

def brute_force_best(candidates, n, workload):
    from itertools import combinations

    largest = max(candidates)
    rest = sorted(set(candidates) - {largest})
    best = None
    for k in range(0, min(n - 1, len(rest)) + 1):
        for combo in combinations(rest, k):
            chosen = sorted(combo) + [largest]
            cost = sum(pad_num_tokens(t, chosen) for t in workload if 0 < t <= largest)
            if best is None or cost < best[0]:
                best = (cost, chosen)
    return best[0]


@settings(max_examples=150, deadline=None)
@given(candidates=st.lists(st.integers(1, 64), min_size=1, max_size=8, unique=True),
       n=st.integers(1, 5), workload=st.lists(st.integers(1, 70), max_size=30))
def test_select_sizes_is_optimal_against_brute_force(candidates, n, workload):
    chosen = select_sizes(candidates, n, workload)
    assert max(candidates) in chosen
    assert len(chosen) <= n
    assert set(chosen) <= set(candidates)
    cost = sum(pad_num_tokens(t, chosen) for t in workload if 0 < t <= max(candidates))
    assert cost == brute_force_best(candidates, n, workload)


@settings(max_examples=150, deadline=None)
@given(candidates=st.lists(st.integers(1, 256), min_size=2, max_size=30, unique=True),
       n=st.integers(1, 8), workload=st.lists(st.integers(1, 256), min_size=1, max_size=50))
def test_select_sizes_is_never_worse_than_even_sampling(candidates, n, workload):
    ours = select_sizes(candidates, n, workload)
    even = sample_sizes(candidates, n)
    assert padding_waste(ours, workload) <= padding_waste(even, workload) + 1e-12 or \
        sum(pad_num_tokens(t, ours) or 0 for t in workload if t <= max(candidates)) <= \
        sum(pad_num_tokens(t, even) or 0 for t in workload if t <= max(candidates))


def test_select_sizes_rejects_a_bad_budget():
    with pytest.raises(ConfigError, match="budget"):
        select_sizes([1, 2], 0, [1])
