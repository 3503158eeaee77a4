"""The engine on the strict simulator: FULL padding as vLLM Ascend, bfloat16 by default,
float32 only as a declared leniency, warm-ups required, block sizes checked."""

from __future__ import annotations

import logging

import pytest
import torch

from ascendgraph.config import GraphConfig
from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import CaptureConstraintError, ConfigError
from ascendgraph.runtime import params as params_module
from ascendgraph.runtime.engine import FLOAT32_ATTENTION_WARNING, Engine, EngineOptions

from tests.engine.helpers import run_engine, small_config


@pytest.fixture
def padded_lists(monkeypatch):
    """Every (descriptor, actual_seq_lengths, kv lengths) a FULL update hands the kernel."""
    seen: list[tuple[BatchDescriptor, list[int], list[int]]] = []
    original = params_module.padded_attention_lengths

    def spy(metadata, descriptor, **kwargs):
        ends, lens = original(metadata, descriptor, **kwargs)
        seen.append((descriptor, ends, lens))
        return ends, lens

    monkeypatch.setattr(params_module, "padded_attention_lengths", spy)
    return seen


@pytest.mark.parametrize("mode", ["FULL", "FULL_DECODE_ONLY"])
def test_full_replays_end_the_last_request_at_t_with_one_row_per_request(mode, padded_lists):
    run = run_engine(small_config(mode))
    assert run.report.error is None, run.report.error
    assert run.report.requests_completed == 6
    assert padded_lists, "no FULL replay was updated"
    for descriptor, ends, lens in padded_lists:
        assert ends[-1] == descriptor.num_tokens  # T == last end (kernel contract tnd_tokens_equal_last_end)
        assert len(lens) == len(ends)
    if mode == "FULL":  # mixed batches replay FULL graphs: one dummy request, KV length 0
        mixed = [(d, e, l) for d, e, l in padded_lists if not d.uniform]
        assert mixed, "the workload has no mixed FULL batch"
        assert any(l[-1] == 0 and e[-1] > e[-2] for _, e, l in mixed if len(e) > 1)


def test_bfloat16_is_the_default_dtype():
    assert EngineOptions().dtype == "bfloat16"


def test_float32_on_sim_is_a_declared_leniency_with_one_warning(caplog):
    with caplog.at_level(logging.WARNING):
        run = run_engine(small_config("FULL_AND_PIECEWISE", sizes=(1, 2)), dtype="float32")
    assert run.report.error is None
    assert [r.getMessage() for r in caplog.records].count(FLOAT32_ATTENTION_WARNING) == 1
    assert "float32 attention" in run.report.extensions["lenient"]
    assert "lenient" in run.report.format_text()


def test_bfloat16_runs_are_not_lenient(shared_run):
    run = shared_run(small_config("FULL_AND_PIECEWISE", sizes=(1, 2)))
    assert run.report.error is None and "lenient" not in run.report.extensions


def test_float32_on_npu_is_refused_up_front():
    with pytest.raises(ConfigError, match="float32 is refused on npu") as info:
        Engine(small_config("FULL"), EngineOptions(device="npu", dtype="float32", progress=False))
    assert info.value.key == "dtype"


def test_without_warm_up_the_capture_fails_with_lazy_initialisation(shared_run):
    warmed_config = small_config("FULL_DECODE_ONLY", model="tiny", backend="ascend")
    config = GraphConfig.from_vllm_args(
        compilation_config={"cudagraph_capture_sizes": [1, 2, 4], "cudagraph_mode": "FULL_DECODE_ONLY",
                            "cudagraph_num_of_warmups": 0},
        model="tiny", attention_backend="ascend", num_layers=2, max_num_seqs=4, max_num_batched_tokens=8,
    )
    run = run_engine(config)
    assert isinstance(run.engine.error, CaptureConstraintError)
    assert "lazy initialisation during capture" in str(run.engine.error)
    # the same configuration with its warm-ups (the mode grid's run, shared)
    warmed = shared_run(warmed_config)
    assert warmed.report.error is None


def test_the_default_run_is_bfloat16_and_not_lenient_on_the_report(shared_run):
    run = shared_run(small_config("FULL_AND_PIECEWISE", sizes=(1, 2)))
    assert run.report.dtype == "bfloat16"
    assert run.engine.dtype is torch.bfloat16
