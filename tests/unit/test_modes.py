"""docs/semantics.md §1: every GraphMode row, AttentionGraphSupport and CompilationMode."""

from __future__ import annotations

import pytest

from ascendgraph import AttentionGraphSupport, CompilationMode, ConfigError, GraphMode

N, P, F = GraphMode.NONE, GraphMode.PIECEWISE, GraphMode.FULL

# member, value, decode, mixed, separate_routine, has_full, has_piecewise, runtime?, bool, max, without_piecewise
MODE_TABLE = [
    (GraphMode.NONE, 0, N, N, False, False, False, True, False, N, N),
    (GraphMode.PIECEWISE, 1, P, P, False, False, True, True, True, P, N),
    (GraphMode.FULL, 2, F, F, False, True, False, True, True, F, F),
    (GraphMode.FULL_DECODE_ONLY, (2, 0), F, N, True, True, False, False, True, F, GraphMode.FULL_DECODE_ONLY),
    (GraphMode.FULL_AND_PIECEWISE, (2, 1), F, P, True, True, True, False, True, F, GraphMode.FULL_DECODE_ONLY),
]


@pytest.mark.parametrize(
    "mode, value, decode, mixed, separate, has_full, has_piecewise, runtime, truth, max_mode, without",
    MODE_TABLE,
    ids=[row[0].name for row in MODE_TABLE],
)
def test_graph_mode_row_matches_semantics_table(
    mode, value, decode, mixed, separate, has_full, has_piecewise, runtime, truth, max_mode, without
):
    assert mode.value == value
    assert mode.decode_mode() is decode
    assert mode.mixed_mode() is mixed
    assert mode.separate_routine() is separate
    assert mode.has_full_graphs() is has_full
    assert mode.has_piecewise_graphs() is has_piecewise
    assert mode.requires_piecewise_compilation() is has_piecewise
    assert (mode in GraphMode.runtime_modes()) is runtime
    assert bool(mode) is truth
    assert mode.max_mode() is max_mode
    assert mode.without_piecewise() is without
    assert str(mode) == mode.name


def test_runtime_modes_are_exactly_none_piecewise_full():
    assert GraphMode.runtime_modes() == frozenset({N, P, F})
    assert isinstance(GraphMode.runtime_modes(), frozenset)


@pytest.mark.parametrize("text", ["full_decode_only", "FULL_DECODE_ONLY", "Full_Decode_Only", " full_decode_only "])
def test_parse_is_case_insensitive(text):
    assert GraphMode.parse(text) is GraphMode.FULL_DECODE_ONLY


def test_parse_accepts_a_member_unchanged():
    assert GraphMode.parse(GraphMode.PIECEWISE) is GraphMode.PIECEWISE


def test_parse_of_a_bad_name_is_a_config_error_listing_valid_names():
    with pytest.raises(ConfigError) as info:
        GraphMode.parse("FULLL")
    message = str(info.value)
    assert "'FULLL'" in message
    for member in GraphMode:
        assert member.name in message
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("decode, mixed, expected", [
    (N, N, GraphMode.NONE), (P, P, GraphMode.PIECEWISE), (F, F, GraphMode.FULL),
    (F, N, GraphMode.FULL_DECODE_ONLY), (F, P, GraphMode.FULL_AND_PIECEWISE), (N, F, None), (P, F, None),
])
def test_from_pair_maps_back_to_the_member_or_none(decode, mixed, expected):
    assert GraphMode.from_pair(decode, mixed) is expected


def test_attention_support_levels_are_ordered():
    assert [s.value for s in AttentionGraphSupport] == [0, 1, 2, 3]
    assert (AttentionGraphSupport.NEVER < AttentionGraphSupport.UNIFORM_SINGLE_TOKEN_DECODE
            < AttentionGraphSupport.UNIFORM_BATCH < AttentionGraphSupport.ALWAYS)
    assert AttentionGraphSupport.parse("uniform_batch") is AttentionGraphSupport.UNIFORM_BATCH


def test_compilation_modes_have_vllm_names_and_values():
    assert [(m.name, m.value) for m in CompilationMode] == [
        ("NONE", 0), ("STOCK_TORCH_COMPILE", 1), ("DYNAMO_TRACE_ONCE", 2), ("VLLM_COMPILE", 3)]
    assert CompilationMode.parse("vllm_compile") is CompilationMode.VLLM_COMPILE
    assert CompilationMode.parse(3) is CompilationMode.VLLM_COMPILE
    with pytest.raises(ConfigError):
        CompilationMode.parse(7)


# mutants of modes.py `_parse_enum` (docs/testing.md "Mutation testing")


@pytest.mark.parametrize("enum_type", [GraphMode, CompilationMode, AttentionGraphSupport])
@pytest.mark.parametrize("value", [True, False])
def test_a_bool_is_not_an_enum_value_although_it_equals_0_or_1(enum_type, value):
    # modes.py `isinstance(value, int) and not isinstance(value, bool)`: with `or`, True would
    # parse as the member whose value is 1 (PIECEWISE, ...) instead of being refused
    with pytest.raises(ConfigError, match="invalid"):
        enum_type.parse(value)


def test_integers_still_parse_by_value():
    assert CompilationMode.parse(3) is CompilationMode.VLLM_COMPILE
    assert GraphMode.parse("piecewise") is GraphMode.PIECEWISE
