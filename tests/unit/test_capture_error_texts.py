"""The capture-error rewriter and diagnose against the wheel's literal texts (issue 18).

The inputs are written out here as torch-npu 2.13.0 assembles them (the wheel's
`include/torch_npu/csrc/core/npu/NPUException.h` message layout and the error_code_map of
`NPUErrorCodes.h`, whose strings are also in `lib/libtorch_npu.so`; docs/semantics.md §8), not
built from ascendgraph's TEXT_* constants, so a drifted constant or signature shows here.
"""

from __future__ import annotations

from ascendgraph.errors import (
    ResourceAllocFailed,
    StreamResourceExhausted,
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_STREAMS_INSUFFICIENT,
    classify_capture_error,
    rewrite_capture_error,
)
from ascendgraph.tools.diagnose import diagnose_lines

# "<func>:<file>:<line> NPU function error: <call>, error code is <code>" + PTA_ERROR + "\n[Error]: " + map text
WHEEL_207008 = (
    "capture_begin:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:230 NPU function error: "
    "c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), error code is 207008\n"
    "[ERROR] 2026-12-01-10:00:00 (PID:100, Device:0, RankID:0) ERR00100 PTA call acl api failed\n"
    "[Error]: Stream resources are insufficient.\n"
    "        Check whether the number of streams meets the requirements by referring to the description of the "
    "acl.rt.create_stream interface."
)
WHEEL_207005 = (
    "capture_begin:build/CMakeFiles/torch_npu.dir/compiler_depend.ts:230 NPU function error: "
    "c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), error code is 207005\n"
    "[ERROR] 2026-12-01-10:00:00 (PID:100, Device:0, RankID:0) ERR00100 PTA call acl api failed\n"
    "[Error]: Failed to apply for memory.\n"
    "        Check the remaining storage space in the hardware environment."
)


def test_the_wheels_207008_text_is_a_stream_exhaustion():
    typed = rewrite_capture_error(RuntimeError(WHEEL_207008))
    assert isinstance(typed, StreamResourceExhausted)
    assert WHEEL_207008 in str(typed)  # the original is kept after the guidance
    assert classify_capture_error(WHEEL_207008)[0] == "stream_exhaustion"


def test_the_wheels_207005_text_is_a_resource_allocation_failure():
    typed = rewrite_capture_error(RuntimeError(WHEEL_207005))
    assert isinstance(typed, ResourceAllocFailed)


def test_the_project_texts_are_the_wheels():
    assert "c10_npu::acl::AclmdlRICaptureBegin(capture_stream_, capture_mode), error code is 207008" in TEXT_207008_CAPTURE_BEGIN
    assert TEXT_STREAMS_INSUFFICIENT == "[Error]: Stream resources are insufficient."


def test_diagnose_finds_the_wheels_text_in_a_log():
    lines = ["INFO starting capture", *(f"(Worker_TP0 pid=1) ERROR {line}" for line in WHEEL_207008.split("\n")),
             "INFO shutting down"]
    diagnosis = diagnose_lines(lines)
    classes = [failure.classification for failure in diagnosis.failures]
    assert classes == ["stream_exhaustion"], classes
