"""`ascendgraph diagnose`: capture failures found in vLLM / vLLM Ascend logs, collapsed, classified,
with the rewriter's guidance, the stream plan of the logged config, and robust reading."""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ascendgraph.tools.diagnose import reading as diagnose_module
from ascendgraph.cli.app import main
from ascendgraph.tools.diagnose import (
    FAILURE_CLASSES,
    LogConfig,
    diagnose_file,
    diagnose_lines,
    diagnosis_to_json,
    format_diagnosis,
)
from ascendgraph.tools.diagnose.classes import split_line
from ascendgraph.tools.diagnose.logconfig import update_config
from ascendgraph.errors import (
    LAUNCH_BLOCKING_MESSAGE,
    TASK_QUEUE_2_DURING_CAPTURE,
    TEXT_207005,
    TEXT_207008_CAPTURE_BEGIN,
    TEXT_ALLOC_SQ_CQ,
    TEXT_EL0009,
    TEXT_STREAMS_INSUFFICIENT,
    rewrite_capture_error,
)
from ascendgraph.modes import GraphMode
from ascendgraph.sizes import plan_stream_budget

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def log(name: str) -> str:
    return str(LOGS / name)


def rewriter_guidance(text: str) -> str:
    """What rewrite_capture_error puts before "Original error:" for this runtime text."""
    rewritten = rewrite_capture_error(RuntimeError(text))
    assert rewritten is not None and str(rewritten) != text
    return str(rewritten).split("\nOriginal error:\n")[0]


STREAM_GUIDANCE = rewriter_guidance(TEXT_207008_CAPTURE_BEGIN + "\n" + TEXT_STREAMS_INSUFFICIENT)
OLD_HDK_GUIDANCE = rewriter_guidance(TEXT_ALLOC_SQ_CQ.format(stream_id=7))
RESOURCE_GUIDANCE = rewriter_guidance(TEXT_207005)

# One log per signature, each mixed with unrelated noise: (file, [(line, classification)], guidance of the first).
SIGNATURE_LOGS = [
    ("stream_exhaustion_tp4.log", [(48, "stream_exhaustion")], STREAM_GUIDANCE),
    ("stream_207008_offline.log", [(15, "stream_exhaustion")], STREAM_GUIDANCE),
    ("stream_el0009.log", [(8, "stream_exhaustion")], STREAM_GUIDANCE),
    ("legacy_insufficient_streams.log", [(3, "stream_exhaustion")], STREAM_GUIDANCE),
    ("old_hdk_alloc_sq_cq.log", [(12, "old_hdk")], OLD_HDK_GUIDANCE),
    ("resource_alloc_207005.log", [(7, "resource_alloc")], RESOURCE_GUIDANCE),
    ("address_mismatch.log", [(9, "address_mismatch")], FAILURE_CLASSES["address_mismatch"].guidance),
    ("launch_blocking.log", [(10, "launch_blocking")], LAUNCH_BLOCKING_MESSAGE),
    ("task_queue_2.log", [(5, "task_queue_2")], TASK_QUEUE_2_DURING_CAPTURE),
    ("oom_during_capture.log", [(9, "oom_during_capture")], FAILURE_CLASSES["oom_during_capture"].guidance),
    ("capture_end_507903.log", [(2, "capture_error")], FAILURE_CLASSES["capture_error"].guidance.format(code=507903)),
    ("two_attempts.log", [(5, "stream_exhaustion"), (11, "stream_exhaustion")], STREAM_GUIDANCE),
]


@pytest.mark.parametrize("name, expected, guidance", SIGNATURE_LOGS, ids=[c[0] for c in SIGNATURE_LOGS])
def test_each_signature_log_yields_exactly_its_failures_with_line_class_and_guidance(name, expected, guidance):
    diagnosis = diagnose_file(log(name))
    found = [(f.line, f.classification) for f in diagnosis.failures]
    assert found == expected, format_diagnosis(diagnosis)
    assert diagnosis.failures[0].guidance == guidance
    assert diagnosis.exit_code == 1


@pytest.mark.parametrize("name", ["clean.log", "oom_outside_capture.log"])
def test_logs_without_capture_failures_exit_0(name):
    diagnosis = diagnose_file(log(name))
    assert diagnosis.failures == [], format_diagnosis(diagnosis)
    assert diagnosis.exit_code == 0


def test_guidance_is_the_rewriters_text_for_all_three_signatures():
    for name, text in [("stream_exhaustion", TEXT_EL0009), ("old_hdk", TEXT_ALLOC_SQ_CQ.format(stream_id=1)),
                       ("resource_alloc", TEXT_207005)]:
        assert FAILURE_CLASSES[name].guidance == rewriter_guidance(text)


# --------------------------------------------------------------------------- collapsing


def test_one_failure_on_four_ranks_with_reraises_is_one_finding():
    diagnosis = diagnose_file(log("stream_exhaustion_tp4.log"))
    (failure,) = diagnosis.failures
    assert failure.processes == ["Worker_TP0", "Worker_TP1", "Worker_TP2", "Worker_TP3", "EngineCore_DP0"]
    assert failure.occurrences == 5
    assert failure.error_class == "StreamResourceExhausted"


def test_a_long_traceback_between_the_error_and_its_reraise_does_not_split_the_failure():
    frames = [f'  File "/srv/app/module_{i}.py", line {i}, in step_{i}' for i in range(120)]
    lines = (["INFO 01-01 00:00:00 [model_runner_v1.py:1] Starting to capture ACL graphs for cases: [8, 4], "
              "mode: PIECEWISE, uniform_decode: False",
              "RuntimeError: " + TEXT_207008_CAPTURE_BEGIN, TEXT_STREAMS_INSUFFICIENT, "",
              "The above exception was the direct cause of the following exception:", "Traceback (most recent call last):"]
             + frames
             + ["RuntimeError: " + STREAM_GUIDANCE, "Original error:", TEXT_207008_CAPTURE_BEGIN, TEXT_STREAMS_INSUFFICIENT])
    diagnosis = diagnose_lines(lines)
    assert [(f.line, f.classification, f.occurrences) for f in diagnosis.failures] == [(2, "stream_exhaustion", 2)]


def test_an_engine_restart_separates_two_failures_of_the_same_kind():
    attempt = ["non-default args: {'tensor_parallel_size': 2}",
               "ERROR 01-01 00:00:01 [core.py:1] RuntimeError: " + TEXT_EL0009]
    diagnosis = diagnose_lines(attempt + attempt)
    assert [f.line for f in diagnosis.failures] == [2, 4]


def test_different_failure_kinds_in_one_log_are_all_reported():
    lines = ["ERROR 01-01 00:00:01 [core.py:1] RuntimeError: " + TEXT_EL0009] + ["noise"] * 60 + [
        "ValueError: " + LAUNCH_BLOCKING_MESSAGE]
    diagnosis = diagnose_lines(lines)
    assert [f.classification for f in diagnosis.failures] == ["stream_exhaustion", "launch_blocking"]


def test_207008_alone_is_a_capture_error_but_not_stream_exhaustion():
    # docs/semantics.md §8: "207008" alone is not enough for the stream signature.
    diagnosis = diagnose_lines(["RuntimeError: " + TEXT_207008_CAPTURE_BEGIN])
    (failure,) = diagnosis.failures
    assert failure.classification == "capture_error" and "207008" in failure.guidance


@pytest.mark.parametrize("line", [
    '(APIServer pid=1) INFO:     127.0.0.1:5 - "POST /v1/completions HTTP/1.1" 200 OK chatcmpl-207005.',
    "INFO 01-01 00:00:00 [x.py:1] the step took 0.207005 s",
    "INFO 01-01 00:00:00 [kv_cache_utils.py:1] GPU KV cache size: 207,008 tokens",
    "WARNING 01-01 00:00:00 [w.py:1] lower gpu_memory_utilization to avoid running out of memory",
    "INFO 01-01 00:00:00 [x.py:1] Starting to capture ACL graphs for cases: [4, 2, 1], mode: FULL, uniform_decode: True",
])
def test_noise_that_looks_like_a_signature_is_not_a_failure(line):
    assert diagnose_lines([line] * 3).failures == []


# --------------------------------------------------------------------------- config, plan, suggestion


def test_config_dump_with_stream_exhaustion_gives_a_plan_and_a_smaller_list_that_fits():
    diagnosis = diagnose_file(log("stream_exhaustion_tp4.log"))
    config = diagnosis.config
    assert config.mode() == (GraphMode.PIECEWISE, "log")
    assert len(config.sizes) == 67 and config.sizes[-1] == 512
    assert (config.num_hidden_layers, config.tensor_parallel_size, config.data_parallel_size) == (36, 4, 1)
    expected = plan_stream_budget(num_hidden_layers=36, capture_sizes=config.sizes, mode=GraphMode.PIECEWISE,
                                  tensor_parallel_size=4)
    plan = diagnosis.stream_plan
    assert plan is not None and not plan.fits
    assert (plan.max_num_sizes, plan.streams_per_size) == (expected.max_num_sizes, expected.streams_per_size) == (15, 111)
    assert diagnosis.suggested_sizes == expected.sizes
    assert len(diagnosis.suggested_sizes) == 15 and diagnosis.suggested_sizes[-1] == 512
    assert set(diagnosis.suggested_sizes) <= set(config.sizes)
    assert diagnosis.aiv_plan is not None and diagnosis.aiv_plan.max_num_sizes == 23


def test_text_report_shows_line_class_guidance_plan_and_the_flag_to_paste():
    text = format_diagnosis(diagnose_file(log("stream_exhaustion_tp4.log")))
    assert "1. line 48: stream_exhaustion (StreamResourceExhausted)" in text
    assert "reported 5 times on Worker_TP0, Worker_TP1, Worker_TP2, Worker_TP3, EngineCore_DP0" in text
    assert "ACL graph capture failed with a known stream-resource exhaustion signature." in text
    assert "DOES NOT FIT: at most 15 sizes fit" in text
    assert "with HCCL_OP_EXPANSION_MODE=AIV: up to 23 sizes fit" in text
    assert '--compilation-config \'{"cudagraph_capture_sizes": [1, 24, 56,' in text


def test_plan_uses_the_config_of_the_latest_failing_attempt():
    diagnosis = diagnose_file(log("two_attempts.log"))
    assert len(diagnosis.config.sizes) == 35
    assert diagnosis.config.hccl_op_expansion_mode == "AIV" and diagnosis.config.num_hidden_layers == 40
    assert diagnosis.stream_plan.expansion_mode == "AIV"
    assert diagnosis.suggested_sizes == diagnosis.stream_plan.sizes and len(diagnosis.suggested_sizes) == 20


def test_a_plan_that_fits_despite_the_failure_suggests_half_the_sizes():
    diagnosis = diagnose_file(log("stream_207008_offline.log"))
    assert diagnosis.stream_plan.fits
    assert len(diagnosis.suggested_sizes) == 17 and diagnosis.suggested_sizes[-1] == 256
    assert any("yet the stack ran out" in note for note in diagnosis.notes)


def test_clean_log_gets_a_fitting_plan_when_the_layer_count_is_given():
    diagnosis = diagnose_file(log("clean.log"), num_layers=28)
    assert diagnosis.failures == []
    assert diagnosis.config.mode() == (GraphMode.FULL_DECODE_ONLY, "log")
    assert diagnosis.stream_plan is not None and diagnosis.stream_plan.fits
    assert diagnosis.suggested_sizes is None


def test_a_log_without_a_layer_count_says_how_to_get_a_plan():
    diagnosis = diagnose_file(log("clean.log"))
    assert diagnosis.stream_plan is None
    assert any("--num-layers" in note for note in diagnosis.notes)


CONFIG_LINES = [
    ("non-default args: {'tensor_parallel_size': 4, 'compilation_config': {'cudagraph_mode': "
     "<CUDAGraphMode.FULL_AND_PIECEWISE: (2, 1)>, 'cudagraph_capture_sizes': [1, 2, 4]}}",
     {"tensor_parallel_size": 4, "cudagraph_mode": "FULL_AND_PIECEWISE", "capture_sizes": [1, 2, 4]}),
    ('compilation_config={"level":3,"cudagraph_mode":[2,0],"cudagraph_capture_sizes":[8,4,2,1]}',
     {"cudagraph_mode": "FULL_DECODE_ONLY", "capture_sizes": [8, 4, 2, 1]}),
    ('compilation_config={"cudagraph_mode":1}', {"cudagraph_mode": "PIECEWISE"}),
    ("'cudagraph_mode': None, 'cudagraph_capture_sizes': None", {"cudagraph_mode": None, "capture_sizes": None}),
    ("tensor_parallel_size=8, pipeline_parallel_size=1, data_parallel_size=2, data_parallel_size_local=1",
     {"tensor_parallel_size": 8, "data_parallel_size": 2}),
    ("Adjusted ACL graph batch sizes for Qwen3MoeForCausalLM model (layers: 48): 67 → 12 sizes",
     {"num_hidden_layers": 48}),
    ('{"architectures": ["DeepseekV3ForCausalLM"], "num_hidden_layers": 61}',
     {"num_hidden_layers": 61, "architecture": "DeepseekV3ForCausalLM"}),
    ("vllm serve /m --tensor-parallel-size 8 -dp 2 --enforce-eager \\",
     {"tensor_parallel_size": 8, "data_parallel_size": 2, "enforce_eager": True}),
    ("re-run with --enforce-eager to confirm", {"enforce_eager": None}),
    ("export HCCL_OP_EXPANSION_MODE=\"AIV\"", {"hccl_op_expansion_mode": "AIV"}),
    ("To both improve communication performance and increase the number of supported shapes, set "
     "HCCL_OP_EXPANSION_MODE=AIV.", {"hccl_op_expansion_mode": None}),
    ("Currently, communication is performed using FFTS+ method, which reduces the number of available streams",
     {"hccl_op_expansion_mode": "FFTS+"}),
    ("Starting to capture ACL graphs for cases: [16, 8, 1], mode: FULL, uniform_decode: True",
     {"captured_cases": [1, 8, 16], "captured_phases": ["FULL"]}),
]


@pytest.mark.parametrize("text, expected", CONFIG_LINES, ids=[c[0][:40] for c in CONFIG_LINES])
def test_config_values_are_read_from_the_ways_vllm_prints_them(text, expected):
    config = LogConfig()
    update_config(config, split_line(1, "INFO 01-01 00:00:00 [x.py:1] " + text, None))
    for name, value in expected.items():
        assert getattr(config, name) == value, name


def test_capture_phases_give_the_mode_when_the_log_does_not_print_it():
    config = LogConfig()
    for number, text in enumerate([
        "Starting to capture ACL graphs for cases: [16, 8], mode: PIECEWISE, uniform_decode: False",
        "Starting to capture ACL graphs for cases: [8], mode: FULL, uniform_decode: True",
    ], 1):
        update_config(config, split_line(number, text, None))
    assert config.mode() == (GraphMode.FULL_AND_PIECEWISE, "capture lines")


def test_line_prefixes_are_stripped_and_the_innermost_process_kept():
    line = split_line(3, "\x1b[1;36m(vLLMHttpServer pid=7) (Worker_TP3 pid=8)\x1b[0m ERROR 04-20 21:27:00 "
                         "[multiproc_executor.py:932] RuntimeError: boom", None)
    assert (line.process, line.level, line.message) == ("Worker_TP3", "ERROR", "RuntimeError: boom")
    assert split_line(4, "   continuation", "Worker_TP3").process == "Worker_TP3"


# --------------------------------------------------------------------------- reading


def test_binary_garbage_and_bad_encodings_are_read_not_fatal(tmp_path):
    path = tmp_path / "mixed.log"
    path.write_bytes(b"\x00\xff\xfe garbage \x80\x81\n"
                     + "caf\xe9 latin-1 line\n".encode("latin-1")
                     + b"\xde\xad\xbe\xef" * 100 + b"\n"
                     + ("RuntimeError: " + TEXT_EL0009 + "\n").encode()
                     + bytes(b for b in range(256) if b != 0x0A) + b"\n")
    diagnosis = diagnose_file(str(path))
    assert [(f.line, f.classification) for f in diagnosis.failures] == [(4, "stream_exhaustion")]
    assert diagnosis.lines_read == 5


def test_an_over_long_line_is_cut_and_counted_as_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(diagnose_module, "MAX_LINE_BYTES", 64)
    path = tmp_path / "long.log"
    path.write_bytes(b"x" * 10_000 + b"\n" + ("RuntimeError: " + TEXT_EL0009 + "\n").encode())
    diagnosis = diagnose_file(str(path))
    assert diagnosis.lines_read == 2
    assert [f.line for f in diagnosis.failures] == [2]  # the cut is at 64 bytes, the signature fits in one read


def test_gzip_logs_are_read(tmp_path):
    path = tmp_path / "vllm.log.gz"
    path.write_bytes(gzip.compress((LOGS / "old_hdk_alloc_sq_cq.log").read_bytes()))
    assert [f.classification for f in diagnose_file(str(path)).failures] == ["old_hdk"]


def test_a_big_log_is_streamed(tmp_path):
    noise = '(APIServer pid=880) INFO:     127.0.0.1:51022 - "POST /v1/chat/completions HTTP/1.1" 200 OK\n'
    path = tmp_path / "big.log"
    with open(path, "w") as handle:
        for _ in range(50_000):
            handle.write(noise)
        handle.write("ERROR 01-01 00:00:01 [core.py:1] RuntimeError: " + TEXT_EL0009 + "\n")
    diagnosis = diagnose_file(str(path))
    assert diagnosis.lines_read == 50_001 and [f.line for f in diagnosis.failures] == [50_001]


def test_stdin_is_read_with_a_dash():
    data = (LOGS / "launch_blocking.log").read_bytes()
    diagnosis = diagnose_file("-", stdin=io.BytesIO(data))
    assert diagnosis.source == "<stdin>"
    assert [f.classification for f in diagnosis.failures] == ["launch_blocking"]


def test_stdin_through_the_real_command_line():
    data = (LOGS / "resource_alloc_207005.log").read_bytes()
    result = subprocess.run([sys.executable, "-m", "ascendgraph", "diagnose", "-", "--json"], input=data,
                            capture_output=True, timeout=120)
    assert result.returncode == 1, result.stderr.decode()
    doc = json.loads(result.stdout)
    assert doc["source"] == "<stdin>" and doc["failures"][0]["classification"] == "resource_alloc"


@pytest.mark.parametrize("target", ["missing.log", "."])
def test_unreadable_input_is_one_line_and_exit_2(target, tmp_path, capsys):
    path = str(tmp_path / target) if target != "." else str(tmp_path)
    assert main(["diagnose", path]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("ascendgraph diagnose: error: cannot read log") and "- to read standard input" in err


def test_unreadable_input_has_no_traceback_in_a_real_process(tmp_path):
    result = subprocess.run([sys.executable, "-m", "ascendgraph", "diagnose", str(tmp_path / "nope.log")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr


# --------------------------------------------------------------------------- command line


def test_cli_exit_codes_follow_what_was_found(capsys):
    assert main(["diagnose", log("clean.log")]) == 0
    assert main(["diagnose", log("old_hdk_alloc_sq_cq.log")]) == 1
    out, err = capsys.readouterr()
    assert err == ""  # the diagnosis is the result: stdout
    assert "no capture failures" in out and "1. line 12: old_hdk (OldHdkStack)" in out


def test_cli_json_has_schema_version_and_the_failures(capsys):
    assert main(["diagnose", "--json", log("stream_exhaustion_tp4.log")]) == 1
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert doc["schema_version"] == 1
    assert {"source", "lines_read", "failures", "config", "stream_plan", "suggested_capture_sizes", "notes"} <= set(doc)
    (failure,) = doc["failures"]
    assert (failure["line"], failure["classification"], failure["occurrences"]) == (48, "stream_exhaustion", 5)
    assert failure["guidance"] == STREAM_GUIDANCE
    assert doc["stream_plan"]["max_num_sizes"] == 15 and doc["stream_plan"]["fits"] is False
    assert doc["suggested_capture_sizes"] == doc["stream_plan"]["sizes"]


def test_cli_num_layers_flag_gives_a_plan(capsys):
    assert main(["diagnose", "--json", "--num-layers", "28", log("clean.log")]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["stream_plan"]["fits"] is True and doc["suggested_capture_sizes"] is None


def test_json_round_trips_for_every_test_log():
    for path in sorted(LOGS.glob("*.log")):
        json.dumps(diagnosis_to_json(diagnose_file(str(path))))
