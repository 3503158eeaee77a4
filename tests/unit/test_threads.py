"""torch's intra-op thread count is one process-wide policy (docs/decisions.md "One thread policy per process", issue 17 item 10)."""

from __future__ import annotations

import gc

import pytest
import torch

from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.runtime import threads
from ascendgraph.runtime.engine import Engine, EngineOptions


@pytest.fixture()
def outside_threads():
    """The process starts each test at a count no engine asks for by default, and gets its own back."""
    import gc

    if threads.live_request() is not None:
        # an engine another test in this worker left unclosed lets go of its lease when collected
        # (a full collection costs 0.3-0.9 s in a worker's heap: only when a lease is live)
        gc.collect()
    previous = torch.get_num_threads()
    torch.set_num_threads(3)
    yield 3
    torch.set_num_threads(previous)
    assert threads.live_request() is None, "a test left an engine holding the thread count"


def _engine(num_threads: threads.ThreadRequest = threads.AUTO, **options) -> Engine:
    config = GraphConfig.from_vllm_args(num_layers=1, max_num_seqs=2, compilation_config={"cudagraph_mode": "NONE"})
    return Engine(config, EngineOptions(device="sim", requests=1, num_threads=num_threads, progress=False, **options))


def test_two_engines_closed_in_creation_order_give_the_process_its_count_back(outside_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = _engine(2)
    assert torch.get_num_threads() == 2
    second = _engine(2)
    first.close()
    assert torch.get_num_threads() == 2, "the first engine to close must not change the count under the second"
    second.close()
    assert torch.get_num_threads() == outside_threads


def test_closed_in_reverse_order_and_twice(outside_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first, second = _engine(), _engine()
    assert torch.get_num_threads() == threads.CLI_NUM_THREADS
    second.close()
    second.close()
    assert torch.get_num_threads() == threads.CLI_NUM_THREADS
    first.close()
    assert torch.get_num_threads() == outside_threads


def test_two_live_engines_asking_for_different_counts_is_a_config_error(outside_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    first = _engine(2)
    try:
        with pytest.raises(ConfigError, match="num_threads=1 conflicts with another live engine") as info:
            _engine(1)
        assert info.value.key == "num_threads"
        assert torch.get_num_threads() == 2  # the refused engine changed nothing
        second = _engine(None)  # leaving torch alone never conflicts
        second.close()
        assert torch.get_num_threads() == 2
    finally:
        first.close()
    assert torch.get_num_threads() == outside_threads
    _engine(1).close()  # with the first one closed, another count is fine


def test_the_api_default_is_the_cli_policy(outside_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert EngineOptions().num_threads == threads.AUTO
    engine = _engine()
    assert torch.get_num_threads() == threads.CLI_NUM_THREADS == 1
    engine.close()
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user chose: leave torch alone, as the CLI does
    engine = _engine()
    assert torch.get_num_threads() == outside_threads and threads.live_request() is None
    engine.close()


def test_an_engine_never_closed_lets_go_when_collected(outside_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    engine = _engine(2)
    assert threads.live_request() == 2
    del engine
    gc.collect()
    assert threads.live_request() is None and torch.get_num_threads() == outside_threads


@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "two", 10**6])
def test_bad_thread_counts_are_config_errors(bad):
    with pytest.raises(ConfigError, match="num_threads must be") as info:
        EngineOptions(num_threads=bad)
    assert info.value.key == "num_threads"


def test_resolve_reads_omp_num_threads():
    assert threads.resolve_num_threads("auto", {}) == 1
    assert threads.resolve_num_threads("auto", {"OMP_NUM_THREADS": "4"}) is None
    assert threads.resolve_num_threads(None, {}) is None
    assert threads.resolve_num_threads(5, {}) == 5


def test_the_model_is_built_with_the_engines_thread_count(outside_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    seen: list[int] = []
    build = Engine._build_model

    def recording(self):
        seen.append(torch.get_num_threads())
        return build(self)

    monkeypatch.setattr(Engine, "_build_model", recording)
    _engine(2).close()
    assert seen == [2], "the weights were drawn and cast with the caller's count, not the engine's"


def test_an_engine_that_fails_after_joining_gives_the_count_back_at_once(outside_threads, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)

    def broken(self):
        raise RuntimeError("planted: the KV caches cannot be made")

    monkeypatch.setattr(Engine, "_make_kv_caches", broken)
    with pytest.raises(RuntimeError, match="planted") as info:
        _engine(2)
    # the traceback still holds the half-built engine: the lease must not wait for it to be collected
    assert info.value.__traceback__ is not None
    assert threads.live_request() is None and torch.get_num_threads() == outside_threads
