"""Capture sizes and spec-decode rounding against vLLM 0.32.

compute_capture_sizes        <-> VllmConfig._set_cudagraph_sizes
round_sizes_for_spec_decode  <-> CompilationConfig.adjust_cudagraph_sizes_for_spec_decode
"""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vLLM is not importable: build the parity env with scripts/parity-env.sh")

import parity_harness as h  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from ascendgraph.errors import ConfigError  # noqa: E402

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(h.version_mismatch_reason() is not None, reason=str(h.version_mismatch_reason())),
]

# Boundaries of the size rule (1/2/4, the 8-step up to 256, the 16-step, the 512 cap) are
# drawn often; anything else in range now and then.
BOUNDARIES = [1, 2, 3, 4, 5, 7, 8, 9, 31, 32, 33, 127, 128, 129, 255, 256, 257, 271, 272, 511, 512, 513]
max_num_seqs = st.one_of(
    st.sampled_from(BOUNDARIES), st.integers(1, 64), st.integers(1, 1100)
)
max_num_batched_tokens = st.one_of(
    st.sampled_from(BOUNDARIES + [1024, 2048, 8192]), st.integers(1, 600), st.integers(1, 20_000)
)
num_speculative_tokens = st.one_of(st.just(0), st.integers(0, 4), st.integers(0, 16))
performance_mode = st.sampled_from(["balanced", "interactivity", "throughput"])
user_max = st.one_of(st.sampled_from(BOUNDARIES), st.integers(1, 1100))
# User lists: duplicates and out-of-range sizes are the interesting part.
user_sizes = st.lists(
    st.one_of(st.sampled_from([1, 2, 4, 8, 16, 24, 32, 64, 128, 256, 512]), st.integers(1, 1200)),
    min_size=1,
    max_size=40,
)


def _compare(**inputs) -> None:
    theirs = h.vllm_capture_sizes(**inputs)
    ours = h.ours_capture_sizes(**inputs)
    h.assert_same_outcome(theirs, ours, repr(inputs))


@h.parity_settings
@given(
    mns=max_num_seqs,
    mnbt=max_num_batched_tokens,
    k=num_speculative_tokens,
    max_size=st.none() | user_max,
    mode=performance_mode,
)
def test_generated_sizes_match_vllm(mns, mnbt, k, max_size, mode):
    _compare(
        max_num_seqs=mns,
        max_num_batched_tokens=mnbt,
        num_speculative_tokens=k,
        capture_sizes=None,
        max_capture_size=max_size,
        performance_mode=mode,
    )


@h.parity_settings
@given(
    mns=max_num_seqs,
    mnbt=max_num_batched_tokens,
    k=num_speculative_tokens,
    sizes=user_sizes,
    max_choice=st.sampled_from(["none", "consistent", "random"]),
    random_max=user_max,
    mode=performance_mode,
)
def test_user_sizes_match_vllm(mns, mnbt, k, sizes, max_choice, random_max, mode):
    if max_choice == "none":
        max_size = None
    elif max_choice == "consistent":
        kept = [s for s in sizes if s <= mnbt]
        max_size = max(kept) if kept else random_max
    else:
        max_size = random_max
    _compare(
        max_num_seqs=mns,
        max_num_batched_tokens=mnbt,
        num_speculative_tokens=k,
        capture_sizes=sizes,
        max_capture_size=max_size,
        performance_mode=mode,
    )


# ---------------------------------------------------------------- documented divergences
# vLLM guards these with `assert` or not at all; ascendgraph rejects them with ConfigError
# (docs/parity.md, "Errors"). Both halves are asserted so a change on either side shows.

BASE = dict(max_num_seqs=8, max_num_batched_tokens=64, num_speculative_tokens=0, performance_mode="balanced")


@pytest.mark.parametrize(
    "sizes, max_size, vllm_kind",
    [
        ([], None, "precondition"),  # assert len(sizes) > 0
        (None, 0, "precondition"),  # assert max >= 1
        ([0, 4], None, "ok"),  # vLLM keeps a zero size
        ([-3, 4], None, "ok"),  # ... and a negative one
    ],
)
def test_inputs_vllm_asserts_on_or_lets_through_are_config_errors_here(sizes, max_size, vllm_kind):
    inputs = dict(BASE, capture_sizes=sizes, max_capture_size=max_size)
    theirs = h.vllm_capture_sizes(**inputs)
    ours = h.ours_capture_sizes(**inputs)
    assert theirs.kind == vllm_kind, theirs.describe()
    assert isinstance(ours.error, ConfigError), ours.describe()


# ---------------------------------------------------------------- spec-decode rounding


@h.parity_settings
@given(
    sizes=st.one_of(
        st.just([]),
        st.lists(st.integers(1, 600), min_size=1, max_size=30),
        st.lists(st.integers(1, 40), min_size=1, max_size=8),
    ),
    max_choice=st.sampled_from(["last", "random"]),
    random_max=st.integers(1, 700),
    q=st.one_of(st.integers(1, 5), st.integers(1, 40)),
)
def test_spec_decode_rounding_matches_vllm(sizes, max_choice, random_max, q):
    sizes = sorted(set(sizes))
    max_size = sizes[-1] if (max_choice == "last" and sizes) else random_max
    theirs = h.vllm_round_for_spec_decode(sizes, max_size, q)
    ours = h.ours_round_for_spec_decode(sizes, max_size, q)
    h.assert_same_outcome(theirs, ours, f"sizes={sizes} max={max_size} q={q}")
    assert theirs.messages == [], "vLLM's rounding is silent"


@h.parity_settings
@given(
    mns=max_num_seqs,
    mnbt=max_num_batched_tokens,
    k=st.integers(1, 16),
    mode=performance_mode,
)
def test_rounding_the_default_sizes_matches_vllm(mns, mnbt, k, mode):
    """The path every speculative FULL config takes: default sizes, then rounding."""
    inputs = dict(
        max_num_seqs=mns,
        max_num_batched_tokens=mnbt,
        num_speculative_tokens=k,
        capture_sizes=None,
        max_capture_size=None,
        performance_mode=mode,
    )
    theirs = h.vllm_capture_sizes(**inputs)
    assert theirs.kind == "ok", theirs.describe()
    sizes, max_size = theirs.value
    h.assert_same_outcome(
        h.vllm_round_for_spec_decode(sizes, max_size, k + 1),
        h.ours_round_for_spec_decode(sizes, max_size, k + 1),
        f"{inputs} -> sizes={sizes} max={max_size}",
    )


# ---------------------------------------------------------------- texts users grep for


def test_the_harness_sees_vllms_warnings():
    """Guards the properties against comparing two empty message lists by accident."""
    inputs = dict(BASE, capture_sizes=None, max_capture_size=100)
    theirs = h.vllm_capture_sizes(**inputs)
    assert theirs.messages == ["Truncating max_cudagraph_capture_size to 64"]
    assert h.ours_capture_sizes(**inputs).messages == theirs.messages


def test_inconsistent_max_error_text_is_vllms():
    inputs = dict(BASE, max_num_batched_tokens=4, capture_sizes=[8, 16], max_capture_size=16)
    theirs = h.vllm_capture_sizes(**inputs)
    ours = h.ours_capture_sizes(**inputs)
    assert theirs.kind == ours.kind == "invalid"
    assert str(ours.error) == str(theirs.error)


def test_rounding_error_text_is_vllms():
    theirs = h.vllm_round_for_spec_decode([5, 7], 4, 5)
    ours = h.ours_round_for_spec_decode([5, 7], 4, 5)
    assert theirs.kind == ours.kind == "invalid"
    assert str(ours.error) == str(theirs.error)
