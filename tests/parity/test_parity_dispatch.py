"""GraphDispatcher against vLLM 0.32's CudagraphDispatcher: keys, capture order, dispatch.

vLLM's dispatcher is built on a stand-in VllmConfig exposing what it reads
(compilation_config, num_speculative_tokens, lora_config, scheduler_config.max_num_seqs);
``max_loras=0`` on our side is ``lora_config=None`` on vLLM's. Each example builds one
dispatcher pair and sends it a batch of queries.
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not importable: build the parity env with scripts/parity-env.sh")

import parity_harness as h  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(h.version_mismatch_reason() is not None, reason=str(h.version_mismatch_reason())),
]

MODES = ["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
SEPARATE_ROUTINE = {"FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"}
RUNTIME = ["NONE", "PIECEWISE", "FULL"]

# Mostly "no restriction" (None), as the runner calls it; restrictions and the empty set
# (which vLLM reads as "all modes") now and then.
mode_sets = st.one_of(
    st.none(),
    st.none(),
    st.none(),
    st.frozensets(st.sampled_from(RUNTIME), min_size=1),
    st.just(frozenset()),
)
# Cascade attention passes invalid_modes={FULL}.
invalid_mode_sets = st.one_of(
    st.none(), st.none(), st.just(frozenset({"FULL"})), st.frozensets(st.sampled_from(RUNTIME))
)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@st.composite
def dispatcher_cases(draw, *, sizes_fit_decode: bool):
    """A dispatcher set-up. With sizes_fit_decode, separate-routine modes get sizes that are
    multiples of q, as vLLM's V1 runner leaves them after spec-decode rounding."""
    mode = draw(st.sampled_from(MODES))
    q = draw(st.one_of(st.just(1), st.integers(1, 4), st.integers(1, 9)))
    raw = draw(
        st.one_of(
            st.lists(st.integers(1, 48), min_size=1, max_size=10),
            st.lists(st.integers(1, 520), min_size=1, max_size=30),
        )
    )
    if sizes_fit_decode and mode in SEPARATE_ROUTINE:
        raw = [_round_up(s, q) for s in raw]
    max_loras = draw(st.one_of(st.just(0), st.integers(0, 6)))
    return h.DispatcherCase(
        mode=mode,
        capture_sizes=tuple(sorted(set(raw))),
        max_num_seqs=draw(st.one_of(st.integers(1, 16), st.integers(1, 300))),
        uniform_decode_query_len=q,
        max_loras=max_loras,
        # vLLM reads specialize_active_lora from the LoRA config, so it only exists with LoRA.
        specialize_active_lora=draw(st.booleans()) if (max_loras or not sizes_fit_decode) else False,
        specialize_lora=draw(st.booleans()),
    )


@st.composite
def realistic_queries(draw, case: h.DispatcherCase):
    """Queries a model runner sends: uniform batches are n * q tokens, has_lora iff a
    positive active count within max_loras."""
    top = max(case.capture_sizes) + 8
    q = case.uniform_decode_query_len
    uniform = draw(st.booleans())
    if uniform:
        num_tokens = q * draw(st.integers(1, max(1, top // q)))
    else:
        num_tokens = draw(st.integers(0, top))
    loras = draw(st.integers(0, case.max_loras))
    return h.DispatchQuery(
        num_tokens=num_tokens,
        uniform_decode=uniform,
        has_lora=loras > 0,
        num_active_loras=loras,
        valid_modes=draw(mode_sets),
        invalid_modes=draw(invalid_mode_sets),
    )


@st.composite
def any_queries(draw, case: h.DispatcherCase):
    """Anything the signature allows (num_tokens >= 0): inconsistent LoRA flags, uniform
    batches that are not multiples of q, counts above max_loras."""
    return h.DispatchQuery(
        num_tokens=draw(st.integers(0, max(case.capture_sizes) + 8)),
        uniform_decode=draw(st.booleans()),
        has_lora=draw(st.booleans()),
        num_active_loras=draw(st.integers(0, case.max_loras + 3)),
        valid_modes=draw(mode_sets),
        invalid_modes=draw(invalid_mode_sets),
    )


def _check(case: h.DispatcherCase, queries: list[h.DispatchQuery]) -> None:
    theirs_built, ours_built = h.build_both(case)
    h.assert_same_outcome(
        h.Outcome(value=None, error=theirs_built.error, messages=theirs_built.messages),
        h.Outcome(value=None, error=ours_built.error),
        f"construct {case}",
    )
    if theirs_built.error is not None:
        return
    theirs, ours = theirs_built.value, ours_built.value
    assert ours.keys() == theirs.keys(), f"keys differ for {case}"
    assert ours.capture_order() == theirs.capture_order(), f"capture order differs for {case}"
    for query in queries:
        h.assert_same_outcome(theirs.dispatch(query), ours.dispatch(query), f"{case} / {query}")


@h.parity_settings
@given(data=st.data(), case=dispatcher_cases(sizes_fit_decode=True))
def test_dispatcher_matches_vllm_on_runner_inputs(data, case):
    queries = data.draw(st.lists(realistic_queries(case), min_size=1, max_size=25))
    _check(case, queries)


@h.parity_settings
@given(data=st.data(), case=dispatcher_cases(sizes_fit_decode=False))
def test_dispatcher_matches_vllm_on_any_inputs(data, case):
    queries = data.draw(st.lists(any_queries(case), min_size=1, max_size=25))
    _check(case, queries)


def test_a_full_decode_batch_replays_the_same_graph_as_in_vllm():
    """A readable anchor for the properties above: FULL_AND_PIECEWISE, q = 2, LoRA."""
    case = h.DispatcherCase(
        mode="FULL_AND_PIECEWISE",
        capture_sizes=(2, 4, 8, 16),
        max_num_seqs=4,
        uniform_decode_query_len=2,
        max_loras=2,
        specialize_active_lora=True,
        specialize_lora=True,
    )
    queries = [
        h.DispatchQuery(6, uniform_decode=True),
        h.DispatchQuery(6, uniform_decode=True, has_lora=True, num_active_loras=1),
        h.DispatchQuery(12),
        h.DispatchQuery(12, invalid_modes=frozenset({"FULL"})),
        h.DispatchQuery(17),
    ]
    _check(case, queries)
    theirs = h.VllmDispatcher(case)
    assert theirs.dispatch(queries[0]).value == ("FULL", (8, 4, True, False, 0))


def test_lora_disabled_with_specialised_counts_rejects_lora_batches_like_vllm():
    case = h.DispatcherCase(
        mode="PIECEWISE",
        capture_sizes=(1,),
        max_num_seqs=1,
        uniform_decode_query_len=1,
        max_loras=0,
        specialize_active_lora=True,
        specialize_lora=False,
    )
    query = h.DispatchQuery(0, has_lora=True, num_active_loras=1)
    theirs, ours = h.VllmDispatcher(case), h.OurDispatcher(case)
    h.assert_same_outcome(theirs.dispatch(query), ours.dispatch(query), f"{case} / {query}")
