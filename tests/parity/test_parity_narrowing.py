"""narrow_for_attention against vLLM 0.32's CompilationConfig.resolve_cudagraph_mode_and_sizes.

"Attention split" is vLLM's splitting_ops holding the whole `_attention_ops` list; no split
is splitting_ops == []. Modes, sizes, max and the warnings vLLM logs are compared; errors
by kind.
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
SUPPORTS = ["NEVER", "UNIFORM_SINGLE_TOKEN_DECODE", "UNIFORM_BATCH", "ALWAYS"]
COMPILATION_MODES = ["NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"]


@st.composite
def size_lists(draw):
    """Sorted unique sizes with max = the last one, as the size rule leaves them."""
    sizes = draw(
        st.one_of(
            st.lists(st.integers(1, 64), min_size=1, max_size=12),
            st.lists(st.integers(1, 600), min_size=1, max_size=40),
            st.sampled_from([[1], [1, 2, 4, 8], [1, 2, 4, 8, 16, 24, 32], [3], [5, 7]]),
        )
    )
    sizes = sorted(set(sizes))
    return tuple(sizes), sizes[-1]


@st.composite
def narrowing_cases(draw):
    sizes, max_size = draw(size_lists())
    return h.NarrowingCase(
        mode=draw(st.sampled_from(MODES)),
        support=draw(st.sampled_from(SUPPORTS)),
        capture_sizes=sizes,
        max_capture_size=max_size,
        uniform_decode_query_len=draw(st.one_of(st.just(1), st.integers(1, 4), st.integers(1, 20))),
        compilation_mode=draw(st.sampled_from(COMPILATION_MODES)),
        attention_split=draw(st.booleans()),
        inductor_partition=draw(st.booleans()),
        use_v2_model_runner=draw(st.booleans()),
        piecewise_capture_available=draw(st.booleans()),
        backend_name=draw(st.sampled_from(["FLASH_ATTN", "mla", "AscendAttentionBackend", "TRITON_MLA"])),
    )


@h.parity_settings
@given(case=narrowing_cases())
def test_narrowing_matches_vllm(case):
    h.assert_same_outcome(h.vllm_narrow(case), h.ours_narrow(case), repr(case))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("support", SUPPORTS)
@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("q", [1, 2])
@pytest.mark.parametrize("pca", [True, False])
def test_narrowing_table_matches_vllm(mode, support, split, q, pca):
    """Every (mode, support, split, q, piecewise capture) corner once, VLLM_COMPILE."""
    case = h.NarrowingCase(
        mode=mode,
        support=support,
        capture_sizes=(1, 2, 4, 8, 16),
        max_capture_size=16,
        uniform_decode_query_len=q,
        compilation_mode="VLLM_COMPILE",
        attention_split=split,
        inductor_partition=False,
        use_v2_model_runner=False,
        piecewise_capture_available=pca,
        backend_name="mla",
    )
    h.assert_same_outcome(h.vllm_narrow(case), h.ours_narrow(case), repr(case))


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"])
def test_never_support_error_text_is_vllms(mode):
    case = h.NarrowingCase(
        mode=mode,
        support="NEVER",
        capture_sizes=(1, 2, 4),
        max_capture_size=4,
        uniform_decode_query_len=1,
        compilation_mode="VLLM_COMPILE",
        attention_split=True,
        inductor_partition=False,
        use_v2_model_runner=False,
        piecewise_capture_available=True,
        backend_name="mla",
    )
    theirs, ours = h.vllm_narrow(case), h.ours_narrow(case)
    h.assert_same_outcome(theirs, ours, repr(case))
    if theirs.error is not None:
        assert str(ours.error) == str(theirs.error)


def test_the_harness_sees_vllms_narrowing_warnings():
    case = h.NarrowingCase(
        mode="FULL",
        support="UNIFORM_BATCH",
        capture_sizes=(1, 2, 4),
        max_capture_size=4,
        uniform_decode_query_len=1,
        compilation_mode="VLLM_COMPILE",
        attention_split=False,
        inductor_partition=False,
        use_v2_model_runner=False,
        piecewise_capture_available=True,
        backend_name="mla",
    )
    assert h.vllm_narrow(case).messages == [
        "CUDAGraphMode.FULL is not supported with mla backend (support: "
        "AttentionCGSupport.UNIFORM_BATCH); setting cudagraph_mode=FULL_DECODE_ONLY"
    ]
