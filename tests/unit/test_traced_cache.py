"""Compile once per model: the traced graph is kept across runs (ascendgraph.compile.cache).

What must hold: a second engine of the same model, mode and passes takes the traced graph
from the cache and never runs Dynamo or aot_autograd (the backend is never called), and runs
exactly what the first computed (same report but for timings); any change of the package's
sources, the torch version, the model, the mode or the passes is another key; a corrupt, a
foreign or a non-regular entry (a FIFO) is ignored with one warning and the model is traced
again, and the entry is replaced.
"""

from __future__ import annotations

import logging
import os
import pickle

import pytest
import torch

from ascendgraph.compile import cache as compile_cache
from ascendgraph.compile.backend import AscendGraphBackend
from ascendgraph.compile.cache import TRACED_SUBDIR, parse_source, resolve_source, traced_key
from ascendgraph.config import GraphConfig
from ascendgraph.runtime.engine import run

MODES = ("FULL_AND_PIECEWISE", "FULL")


def _run(mode: str = "FULL_AND_PIECEWISE") -> dict:
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=4, max_num_batched_tokens=16,
                                        compilation_config={"cudagraph_mode": mode, "cudagraph_capture_sizes": [1, 2, 4]})
    report = run(config, device="sim", requests=2, seed=0, progress=False)
    assert report.ok, report.error
    document = report.to_json()
    for timing in ("capture_seconds", "compile_seconds"):
        document.pop(timing)
    return document


@pytest.fixture
def backend_calls(monkeypatch):
    calls: list[int] = []
    original = AscendGraphBackend.__call__

    def counting(self, graph_module, example_inputs):
        calls.append(1)
        return original(self, graph_module, example_inputs)

    monkeypatch.setattr(AscendGraphBackend, "__call__", counting)
    return calls


def _entries(root) -> list:
    return sorted((root / "compile" / TRACED_SUBDIR).glob("*.pkl"))


@pytest.mark.parametrize("mode", MODES)
def test_a_second_run_traces_nothing_and_reports_the_same(tmp_path, monkeypatch, backend_calls, mode):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    first = _run(mode)
    assert len(backend_calls) == 1 and len(_entries(tmp_path)) == 1
    second = _run(mode)
    assert len(backend_calls) == 1  # Dynamo never handed the backend a graph: nothing was traced
    assert second == first


def test_the_key_follows_sources_torch_model_mode_and_passes(monkeypatch):
    from ascendgraph.compile.passes.noop import NoopEliminationPass

    base = traced_key("spec", "FULL", True, [NoopEliminationPass()], "sim:cpu")
    assert base == traced_key("spec", "FULL", True, [NoopEliminationPass()], "sim:cpu")
    for other in (traced_key("spec2", "FULL", True, [NoopEliminationPass()], "sim:cpu"),
                  traced_key("spec", "PIECEWISE", True, [NoopEliminationPass()], "sim:cpu"),
                  traced_key("spec", "FULL", False, [NoopEliminationPass()], "sim:cpu"),
                  traced_key("spec", "FULL", True, [], "sim:cpu"),
                  traced_key("spec", "FULL", True, [NoopEliminationPass()], "sim:meta")):
        assert other != base
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert traced_key("spec", "FULL", True, [NoopEliminationPass()], "sim:cpu") != base
    monkeypatch.undo()
    monkeypatch.setattr(compile_cache, "_package_digest_memo", "an edited source tree")
    assert traced_key("spec", "FULL", True, [NoopEliminationPass()], "sim:cpu") != base


def test_an_edited_source_is_another_key_and_traces_again(tmp_path, monkeypatch, backend_calls):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    _run()
    monkeypatch.setattr(compile_cache, "_package_digest_memo", "an edited source tree")
    _run()
    assert len(backend_calls) == 2 and len(_entries(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["corrupt", "foreign", "fifo"])
def test_a_broken_entry_is_ignored_with_one_warning_and_replaced(tmp_path, monkeypatch, backend_calls, caplog, damage):
    monkeypatch.setenv("ASCENDGRAPH_CACHE_DIR", str(tmp_path))
    expected = _run()
    (entry,) = _entries(tmp_path)
    if damage == "corrupt":
        entry.write_bytes(b"\x80\x05 not a pickle")
    elif damage == "foreign":
        entry.write_bytes(pickle.dumps({"format": 1, "key": "another key", "module": None, "sources": [], "matches": {}}))
    else:
        entry.unlink()
        os.mkfifo(entry)  # opened non-blocking and refused: never waited on
    with caplog.at_level(logging.WARNING, logger="ascendgraph"):
        assert _run() == expected
    # the readers' one cache-miss warning (ascendgraph.readers.cache_miss), naming the entry
    warnings = [r for r in caplog.records if r.name.startswith("ascendgraph") and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and entry.name in warnings[0].getMessage()
    assert len(backend_calls) == 2  # traced again
    if damage != "fifo":  # the traced graph replaced the broken entry
        with open(entry, "rb") as handle:
            assert pickle.load(handle)["key"] == entry.stem


def test_sources_are_parsed_never_evaluated():
    model = torch.nn.Sequential(torch.nn.Linear(2, 3))
    ids = torch.zeros(5, dtype=torch.long)
    weight = parse_source("L['model']._modules['0']._parameters['weight']")
    size = parse_source("L['input_ids'].size()[0]")
    roots = {"model": model, "input_ids": ids, "positions": ids}
    assert resolve_source(weight, roots) is model[0].weight and resolve_source(size, roots) == 5
    for bad in ("L['model'].__class__", "__import__('os')", "L['other']", "L['model']._modules['0'].forward()"):
        with pytest.raises(ValueError):
            parse_source(bad)
