"""docs/semantics.md §8: the capture-error rewriter, its signatures, priority and typed errors."""

from __future__ import annotations

import pytest

from ascendgraph import (
    CaptureError,
    ConfigError,
    OldHdkStack,
    ResourceAllocFailed,
    StreamResourceExhausted,
    XliteConfigError,
    rewrite_capture_error,
)
from ascendgraph.errors import (
    OLD_HDK_GUIDANCE,
    RESOURCE_ALLOC_GUIDANCE,
    STREAM_EXHAUSTION_GUIDANCE,
    TEXT_207005,
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_ALLOC_SQ_CQ,
    TEXT_EL0009,
    TEXT_STREAMS_INSUFFICIENT,
    CaptureContext,
    classify_capture_error,
)

REAL_207008 = TEXT_207008_CAPTURE_BEGIN + "\n" + TEXT_STREAMS_INSUFFICIENT
REAL_SQ_CQ = TEXT_ALLOC_SQ_CQ.format(stream_id=1043)

REWRITE_CASES = [
    ("207008 + Stream resources are insufficient", REAL_207008, StreamResourceExhausted, STREAM_EXHAUSTION_GUIDANCE),
    ("EL0009 alone", TEXT_EL0009, StreamResourceExhausted, STREAM_EXHAUSTION_GUIDANCE),
    ("insufficient_stream_resources any case", "INSUFFICIENT_STREAM_RESOURCES", StreamResourceExhausted,
     STREAM_EXHAUSTION_GUIDANCE),
    ("207008 with 'stream resource' in lower case", "error code is 207008: no stream resource left",
     StreamResourceExhausted, STREAM_EXHAUSTION_GUIDANCE),
    ("old HDK sq cq", REAL_SQ_CQ, OldHdkStack, OLD_HDK_GUIDANCE),
    ("207005", TEXT_207005, ResourceAllocFailed, RESOURCE_ALLOC_GUIDANCE),
    ("resource alloc fail without the code", "Resource Alloc Fail while capturing", ResourceAllocFailed,
     RESOURCE_ALLOC_GUIDANCE),
]


@pytest.mark.parametrize("text, cls, guidance", [c[1:] for c in REWRITE_CASES], ids=[c[0] for c in REWRITE_CASES])
def test_known_signatures_are_rewritten_with_guidance_and_the_original(text, cls, guidance):
    original = RuntimeError(text)
    new = rewrite_capture_error(original)
    assert type(new) is cls and isinstance(new, CaptureError) and isinstance(new, RuntimeError)
    assert str(new) == f"{guidance}\nOriginal error:\n{text}"
    assert new.__cause__ is original


def test_semantics_texts_are_verbatim():
    assert str(rewrite_capture_error(RuntimeError(REAL_207008))).startswith(
        "ACL graph capture failed with a known stream-resource exhaustion signature. Consider reducing "
        "cudagraph_capture_sizes, lowering max_cudagraph_capture_size, preferring FULL or FULL_DECODE_ONLY for "
        "mostly uniform decode workloads, or temporarily disabling graph mode to confirm the failure is "
        "capture-related.\nOriginal error:\n")
    assert str(rewrite_capture_error(RuntimeError(REAL_SQ_CQ))).startswith(
        "ACL graph capture failed with an old Ascend HDK/CANN stack signature (`Alloc sq cq fail`). Please upgrade "
        "Ascend HDK to 25.5.1 or later and use the matching CANN stack.\nOriginal error:\n")


@pytest.mark.parametrize("exc", [
    RuntimeError("error code is 207008"),  # 207008 alone is not enough
    RuntimeError("something unrelated"),
    ValueError("Stream resources are insufficient."),  # only RuntimeErrors are inspected
    KeyError("alloc sq cq fail"),
])
def test_other_errors_are_returned_unchanged(exc):
    assert rewrite_capture_error(exc) is exc


def test_priority_old_hdk_then_streams_then_207005():
    both = RuntimeError(REAL_SQ_CQ + "\n" + REAL_207008 + "\n207005")
    assert type(rewrite_capture_error(both)) is OldHdkStack
    streams_and_alloc = RuntimeError(REAL_207008 + "\n207005")
    assert type(rewrite_capture_error(streams_and_alloc)) is StreamResourceExhausted


def test_an_already_rewritten_error_is_returned_unchanged():
    once = rewrite_capture_error(RuntimeError(REAL_207008))
    assert rewrite_capture_error(once) is once


def test_context_numbers_travel_with_the_error():
    new = rewrite_capture_error(RuntimeError(REAL_207008), CaptureContext(graphs_captured=137, streams_in_use=1790,
                                                                          stream_budget=1800))
    assert (new.graphs_captured, new.streams_in_use, new.stream_budget) == (137, 1790, 1800)


def test_classify_returns_the_signature_name():
    assert classify_capture_error(REAL_207008)[0] == "stream_exhaustion"
    assert classify_capture_error("fine") is None


def test_error_hierarchy_matches_interfaces():
    assert issubclass(ConfigError, ValueError)
    assert issubclass(XliteConfigError, ConfigError) and issubclass(XliteConfigError, RuntimeError)
    for cls in (StreamResourceExhausted, OldHdkStack, ResourceAllocFailed):
        assert issubclass(cls, CaptureError) and issubclass(cls, RuntimeError)
