"""vLLM Ascend's ACLGraphWrapper (vllm_ascend/compilation/acl_graph.py) capturing and
replaying on the facade: FULL around a whole model, PIECEWISE around pieces (the last one
with weak_ref_output), with and without gc_disable; replays with new inputs in the static
buffers equal eager; a runtime mode that does not match the wrapper's runs eagerly."""

from __future__ import annotations

import harness

harness.require()

import pytest  # noqa: E402
import torch  # noqa: E402
from vllm.compilation.cuda_graph import CUDAGraphOptions  # noqa: E402
from vllm.compilation.monitor import set_cudagraph_capturing_enabled  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402

import vllm_ascend.ops  # noqa: E402,F401
from sim import facade  # noqa: E402
from vllm_ascend.compilation.acl_graph import ACLGraphWrapper  # noqa: E402

TOKENS, WIDTH = 8, 32
DEVICE = harness.DEVICE


@pytest.fixture(autouse=True)
def fresh() -> None:
    facade.configure()
    harness.reset_vllm_ascend_state()
    set_cudagraph_capturing_enabled(True)


class Piece(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(WIDTH, WIDTH, dtype=torch.bfloat16, device=DEVICE)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.silu(self.linear(x)) + x


def _count_empty_cache() -> list[int]:
    calls = [0]
    device = facade.device()
    original = device.empty_cache

    def counted() -> None:
        calls[0] += 1
        original()

    device.empty_cache = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("gc_disable", [False, True])
@pytest.mark.parametrize("weak_ref_output", [False, True])
def test_full_wrapper_replays_new_inputs_equal_to_eager(gc_disable: bool, weak_ref_output: bool) -> None:
    config = harness.vllm_config("FULL")
    model = torch.nn.Sequential(Piece(1), Piece(2))
    wrapper = ACLGraphWrapper(model, config, CUDAGraphMode.FULL,
                              CUDAGraphOptions(gc_disable=gc_disable, weak_ref_output=weak_ref_output))
    static = torch.zeros(TOKENS, WIDTH, dtype=torch.bfloat16, device=DEVICE)
    empty_cache_calls = _count_empty_cache()
    with harness.forward_context(config, None, "FULL", TOKENS):
        static.copy_(torch.randn(TOKENS, WIDTH))
        captured = wrapper(static)
        # torch.npu.graph empties the cache before capturing unless gc_disable patched it away
        # (acl_graph.py:170-176 patches torch.npu.empty_cache, the facade's graph looks it up late).
        assert empty_cache_calls[0] == (0 if gc_disable else 1)
        for seed in range(3):
            static.copy_(torch.randn(TOKENS, WIDTH, generator=torch.Generator().manual_seed(seed)))
            replayed = wrapper(static)
            assert replayed.data_ptr() == captured.data_ptr()
            assert torch.equal(replayed, model(static))
    entry = next(iter(wrapper.concrete_aclgraph_entries.values()))
    assert entry.aclgraph.sim_graph.is_captured
    assert len(wrapper.concrete_aclgraph_entries) == 1


def test_piecewise_wrappers_capture_each_piece_and_chain_replays_equal_to_eager() -> None:
    config = harness.vllm_config("PIECEWISE")
    pieces = [Piece(1), Piece(2), Piece(3)]
    wrappers = [ACLGraphWrapper(piece, config, CUDAGraphMode.PIECEWISE,
                                CUDAGraphOptions(gc_disable=index > 0, weak_ref_output=index == len(pieces) - 1))
                for index, piece in enumerate(pieces)]
    static = torch.zeros(TOKENS, WIDTH, dtype=torch.bfloat16, device=DEVICE)

    def run() -> torch.Tensor:
        hidden = static
        for wrapper in wrappers:
            hidden = wrapper(hidden)
        return hidden

    def eager() -> torch.Tensor:
        hidden = static
        for piece in pieces:
            hidden = piece(hidden)
        return hidden

    with harness.forward_context(config, None, "PIECEWISE", TOKENS):
        static.copy_(torch.randn(TOKENS, WIDTH))
        run()
        for seed in range(3):
            static.copy_(torch.randn(TOKENS, WIDTH, generator=torch.Generator().manual_seed(seed)))
            assert torch.equal(run(), eager())
    assert [len(w.concrete_aclgraph_entries) for w in wrappers] == [1, 1, 1]
    assert facade.device().stats().graphs_captured_total == 3


def test_a_runtime_mode_other_than_the_wrappers_runs_the_module_eagerly() -> None:
    config = harness.vllm_config("FULL")
    model = Piece(4)
    wrapper = ACLGraphWrapper(model, config, CUDAGraphMode.FULL, CUDAGraphOptions())
    x = torch.randn(TOKENS, WIDTH).to(torch.bfloat16).to(DEVICE)
    with harness.forward_context(config, None, "PIECEWISE", TOKENS):
        assert torch.equal(wrapper(x), model(x))
    assert wrapper.concrete_aclgraph_entries == {}
    assert facade.device().stats().graphs_captured_total == 0
