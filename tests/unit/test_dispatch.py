"""docs/semantics.md §5: dispatcher keys, capture order, dispatch, LoRA cases."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ascendgraph import BatchDescriptor as B
from ascendgraph import ConfigError, GraphDispatcher
from ascendgraph import GraphMode as M
from ascendgraph.dispatch import captured_lora_counts

SIZES = [1, 2, 4, 8]


def dispatcher(mode, sizes=SIZES, seqs=4, q=1, **kwargs):
    return GraphDispatcher(mode, capture_sizes=sizes, max_num_seqs=seqs, uniform_decode_query_len=q, **kwargs)


def test_batch_descriptor_is_frozen_and_hashable_with_vllm_defaults():
    key = B(8)
    assert (key.num_tokens, key.num_reqs, key.uniform, key.has_lora, key.num_active_loras) == (8, None, False, False, 0)
    assert {key: 1}[B(8)] == 1
    with pytest.raises(Exception):
        key.num_tokens = 4  # type: ignore[misc]


KEY_CASES = [
    ("NONE has no keys", M.NONE, {}, [], []),
    ("PIECEWISE: relaxed mixed keys", M.PIECEWISE, {}, [B(8), B(4), B(2), B(1)], []),
    ("FULL: mixed keys with num_reqs = min(size, mns)", M.FULL, {}, [],
     [B(8, 4), B(4, 4), B(2, 2), B(1, 1)]),
    ("FULL_DECODE_ONLY: decode keys only, sizes q..q*mns", M.FULL_DECODE_ONLY, {}, [],
     [B(4, 4, True), B(2, 2, True), B(1, 1, True)]),
    ("FULL_AND_PIECEWISE: piecewise mixed + full decode", M.FULL_AND_PIECEWISE, {},
     [B(8), B(4), B(2), B(1)], [B(4, 4, True), B(2, 2, True), B(1, 1, True)]),
    ("FDO with q=2: decode sizes 2..8, num_reqs = size // q", M.FULL_DECODE_ONLY, dict(q=2), [],
     [B(8, 4, True), B(4, 2, True), B(2, 1, True)]),
]


@pytest.mark.parametrize("mode, kwargs, piecewise, full", [c[1:] for c in KEY_CASES], ids=[c[0] for c in KEY_CASES])
def test_keys_per_mode(mode, kwargs, piecewise, full):
    d = dispatcher(mode, **kwargs)
    assert d.keys(M.PIECEWISE) == piecewise
    assert d.keys(M.FULL) == full


def test_capture_order_is_piecewise_first_then_full_largest_first():
    d = dispatcher(M.FULL_AND_PIECEWISE)
    order = d.capture_order()
    assert [m for m, _ in order] == [M.PIECEWISE] * 4 + [M.FULL] * 3
    assert [k.num_tokens for _, k in order] == [8, 4, 2, 1, 4, 2, 1]


def test_keys_of_none_is_an_error():
    with pytest.raises(ConfigError):
        dispatcher(M.FULL).keys(M.NONE)


DISPATCH_CASES = [
    # id, mode, dispatch kwargs, expected (mode, descriptor)
    ("NONE mode always eager", M.NONE, dict(num_tokens=3), (M.NONE, B(3))),
    ("over max is eager with bare descriptor", M.FULL, dict(num_tokens=9), (M.NONE, B(9))),
    ("zero tokens pads to zero", M.PIECEWISE, dict(num_tokens=0), (M.NONE, B(0))),
    ("PIECEWISE pads 3 -> 4", M.PIECEWISE, dict(num_tokens=3), (M.PIECEWISE, B(4))),
    ("FULL pads 3 -> 4 with num_reqs 4", M.FULL, dict(num_tokens=3), (M.FULL, B(4, 4))),
    ("FULL ignores uniform (no separate routine)", M.FULL, dict(num_tokens=3, uniform_decode=True), (M.FULL, B(4, 4))),
    ("FDO mixed batch runs eagerly", M.FULL_DECODE_ONLY, dict(num_tokens=3), (M.NONE, B(3))),
    ("FDO uniform decode replays FULL", M.FULL_DECODE_ONLY, dict(num_tokens=3, uniform_decode=True), (M.FULL, B(4, 4, True))),
    ("FDO uniform decode over q*mns falls back to eager", M.FULL_DECODE_ONLY, dict(num_tokens=7, uniform_decode=True),
     (M.NONE, B(7))),
    ("F&P mixed -> PIECEWISE", M.FULL_AND_PIECEWISE, dict(num_tokens=5), (M.PIECEWISE, B(8))),
    ("F&P uniform -> FULL", M.FULL_AND_PIECEWISE, dict(num_tokens=2, uniform_decode=True), (M.FULL, B(2, 2, True))),
    ("F&P uniform beyond decode keys -> PIECEWISE", M.FULL_AND_PIECEWISE, dict(num_tokens=8, uniform_decode=True),
     (M.PIECEWISE, B(8))),
    ("cascade attention forbids FULL", M.FULL_AND_PIECEWISE,
     dict(num_tokens=2, uniform_decode=True, invalid_modes={M.FULL}), (M.PIECEWISE, B(2))),
    ("valid_modes NONE only is eager", M.FULL, dict(num_tokens=2, valid_modes={M.NONE}), (M.NONE, B(2))),
    ("empty valid_modes means all", M.FULL, dict(num_tokens=2, valid_modes=set()), (M.FULL, B(2, 2))),
    ("FULL mode but only PIECEWISE allowed -> NONE", M.FULL, dict(num_tokens=2, valid_modes={M.PIECEWISE, M.NONE}),
     (M.NONE, B(2))),
    ("bare descriptor drops lora on the early return", M.NONE, dict(num_tokens=2, has_lora=True, num_active_loras=1),
     (M.NONE, B(2))),
]


@pytest.mark.parametrize("mode, kwargs, expected", [c[1:] for c in DISPATCH_CASES], ids=[c[0] for c in DISPATCH_CASES])
def test_dispatch_table(mode, kwargs, expected):
    assert dispatcher(mode).dispatch(**kwargs) == expected


def test_dispatch_with_an_empty_allowed_set_is_an_error():
    with pytest.raises(ConfigError, match="no runtime mode is allowed"):
        dispatcher(M.FULL).dispatch(2, valid_modes={M.FULL}, invalid_modes={M.FULL})


def test_dispatch_without_a_match_and_none_forbidden_names_the_allowed_modes():
    with pytest.raises(ConfigError, match=r"allowed modes: \{PIECEWISE\}"):
        dispatcher(M.FULL).dispatch(2, valid_modes={M.PIECEWISE})


def test_early_return_holds_even_when_none_is_not_allowed():
    assert dispatcher(M.FULL).dispatch(100, valid_modes={M.FULL}) == (M.NONE, B(100))


# ---------------------------------------------------------------- LoRA

@pytest.mark.parametrize("max_loras, specialize, expected", [
    (1, False, [2]), (4, False, [5]), (1, True, [1, 2]), (4, True, [1, 2, 4, 5]), (6, True, [1, 2, 4, 7])])
def test_captured_lora_counts(max_loras, specialize, expected):
    assert captured_lora_counts(max_loras, specialize) == expected


@pytest.mark.parametrize("kwargs, cases", [
    (dict(), [0]),
    (dict(max_loras=4), [0, 5]),
    (dict(max_loras=4, specialize_active_lora=True), [0, 1, 2, 4, 5]),
    (dict(max_loras=4, specialize_lora=False), [5]),
])
def test_lora_cases(kwargs, cases):
    d = dispatcher(M.PIECEWISE, **kwargs)
    assert d.lora_cases == cases
    assert len(d.keys(M.PIECEWISE)) == len(SIZES) * len(cases)


def test_lora_keys_are_repeated_per_case_and_sorted_by_tokens_then_loras():
    d = dispatcher(M.FULL, sizes=[1, 2], max_loras=2, specialize_active_lora=True)
    assert [(k.num_tokens, k.num_active_loras, k.has_lora) for k in d.keys(M.FULL)] == [
        (2, 3, True), (2, 2, True), (2, 1, True), (2, 0, False), (1, 3, True), (1, 2, True), (1, 1, True), (1, 0, False)]


@pytest.mark.parametrize("kwargs, active, expected", [
    (dict(max_loras=4, specialize_active_lora=True), 3, 4),
    (dict(max_loras=4, specialize_active_lora=True), 5, 5),
    (dict(max_loras=4, specialize_active_lora=True), 9, 9),
    (dict(max_loras=4), 3, 5),
])
def test_dispatch_normalises_the_active_lora_count(kwargs, active, expected):
    mode, key = dispatcher(M.PIECEWISE, **kwargs).dispatch(3, has_lora=True, num_active_loras=active)
    if expected <= 5:
        assert (mode, key) == (M.PIECEWISE, B(4, None, False, True, expected))
    else:  # no graph for that many adapters: eager with the bare descriptor
        assert (mode, key) == (M.NONE, B(3))


@pytest.mark.parametrize("specialize", [False, True])
def test_has_lora_without_a_lora_dispatcher_is_an_error(specialize):
    with pytest.raises(ConfigError, match="max_loras"):
        dispatcher(M.PIECEWISE, specialize_active_lora=specialize).dispatch(3, has_lora=True, num_active_loras=1)


def test_uniform_decode_size_not_multiple_of_q_is_reported():
    with pytest.raises(ConfigError, match="multiple of the decode query length"):
        dispatcher(M.FULL_DECODE_ONLY, sizes=[3, 4], q=3, seqs=4)


# ---------------------------------------------------------------- properties

@settings(max_examples=400, deadline=None)
@given(
    mode=st.sampled_from(list(M)),
    sizes=st.lists(st.integers(1, 64), min_size=1, max_size=10, unique=True),
    seqs=st.integers(1, 40),
    num_tokens=st.integers(0, 80),
    uniform=st.booleans(),
    invalid=st.sampled_from([None, {M.FULL}, {M.PIECEWISE}]),
)
def test_dispatch_never_returns_a_descriptor_that_is_not_a_key_unless_none(mode, sizes, seqs, num_tokens, uniform, invalid):
    d = GraphDispatcher(mode, capture_sizes=sizes, max_num_seqs=seqs)
    runtime, key = d.dispatch(num_tokens, uniform_decode=uniform, invalid_modes=invalid)
    if runtime is M.NONE:
        assert key == B(num_tokens)
    else:
        assert key in d.keys(runtime)
        assert key.num_tokens >= num_tokens
        assert key.num_tokens in sizes
        assert invalid is None or runtime not in invalid


# mutants of dispatch.py (docs/testing.md "Mutation testing")


@pytest.mark.parametrize("num_tokens", [True, False, 8.0, "8", -1])
def test_dispatch_refuses_a_token_count_that_is_not_a_non_negative_integer(num_tokens):
    # dispatch.py: `isinstance(n, bool) or not isinstance(n, int) or n < 0` with an `and`
    # let True (an int) or a negative count through
    from ascendgraph.dispatch import GraphDispatcher
    from ascendgraph.modes import GraphMode

    dispatcher = GraphDispatcher(GraphMode.FULL_AND_PIECEWISE, capture_sizes=[1, 2, 4, 8], max_num_seqs=4)
    with pytest.raises(ValueError, match="num_tokens must be an integer >= 0"):
        dispatcher.dispatch(num_tokens)


def test_a_none_mode_dispatcher_has_its_keys_initialised_as_vllms_does():
    # dispatch.py `_initialise_keys`: vLLM 0.32's initialize_cudagraph_keys sets
    # keys_initialized = True before its early exit for NONE; the mutant left it False
    from ascendgraph.dispatch import GraphDispatcher
    from ascendgraph.modes import GraphMode

    dispatcher = GraphDispatcher(GraphMode.NONE, capture_sizes=[], max_num_seqs=4)
    assert dispatcher.keys_initialized is True
    assert dispatcher.dispatch(4)[0] is GraphMode.NONE
