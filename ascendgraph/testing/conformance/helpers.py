"""Helpers the conformance sections share (tensors, captures, the tiny paged-attention setup)."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

import pytest
import torch

from ascendgraph import ops
from ascendgraph.device import Device

__all__ = [
    "is_sim",
    "on_simulator",
    "tensor",
    "capture",
    "raises_text",
    "assert_clean",
    "TinyAttention",
    "capture_updatable_attention",
    "update_attention",
]


def is_sim(device: Device) -> bool:
    return device.name == "sim"


def on_simulator(device: Any) -> bool:
    """The simulator directly, or hw/ on the simulator's torch_npu facade (whose modules carry
    the ``__ascendgraph_facade__`` mark): what only the simulator reports is observable."""
    import sys

    return is_sim(device) or bool(getattr(sys.modules.get("torch_npu"), "__ascendgraph_facade__", False))


def tensor(device: Any, *shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).to(device=device.torch_device, dtype=dtype)


def capture(device: Any, fn: Callable[[], Any], **graph_options: Any) -> tuple[Any, Any]:
    graph = device.new_graph()
    with device.graph(graph, **graph_options):
        out = fn()
    return graph, out


def raises_text(device: Any, exc: pytest.ExceptionInfo, text: str) -> None:
    """Hardware appends codes and context to torch_npu's texts: check containment."""
    assert text in str(exc.value), f"expected {text!r} in {str(exc.value)!r}"


def assert_clean(device: Any, before: Any) -> None:
    after = device.stats()
    assert after.streams_in_use == before.streams_in_use, (before, after)
    assert after.pool_bytes == before.pool_bytes, (before, after)
    assert after.graphs_alive == before.graphs_alive, (before, after)
    assert not device.is_current_stream_capturing()


class TinyAttention:
    """A tiny paged-attention setup a card accepts: 2 requests of 1 query token, 4 heads over 2 KV heads.

    Legal for torch_npu's fused attention on every device (`ascendgraph.kernel_contracts`):
    bfloat16, a 16-aligned head_dim (16 on the simulator, 128 on hardware, its well-trodden
    shape), a 16-aligned block size (16 on the simulator, vLLM Ascend's 128 on hardware) and
    one block-table row per request.
    """

    def __init__(self, device: Any) -> None:
        on_sim = is_sim(device)
        dtype = torch.bfloat16
        self.heads, self.kv_heads = 4, 2
        self.block_size = 16 if on_sim else 128
        self.head_dim = 16 if on_sim else 128
        self.tokens = 2
        self.query = tensor(device, self.tokens, self.heads, self.head_dim, seed=1, dtype=dtype)
        self.key_cache = tensor(device, 8, self.block_size, self.kv_heads, self.head_dim, seed=2, dtype=dtype)
        self.value_cache = tensor(device, 8, self.block_size, self.kv_heads, self.head_dim, seed=3, dtype=dtype)
        self.block_table = torch.arange(8, dtype=torch.int32, device=device.torch_device).view(2, 4)
        self.out = torch.zeros(self.tokens, self.heads, self.head_dim, device=device.torch_device, dtype=dtype)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    def launch(self, seq_lens: list[int], out: Optional[torch.Tensor] = None) -> None:
        ops.paged_attention(
            self.query, self.key_cache, self.value_cache, self.block_table,
            list(range(1, self.tokens + 1)), seq_lens, self.scale, self.out if out is None else out,
        )

    def eager(self, seq_lens: list[int]) -> torch.Tensor:
        expected = torch.empty_like(self.out)
        self.launch(seq_lens, out=expected)
        return expected


def capture_updatable_attention(device: Any, attention: TinyAttention, seq_lens: list[int]) -> tuple[Any, Any, Any]:
    """The docs/semantics.md §7 capture protocol around one attention call, after one eager warm-up
    (the kernel's first launch for a shape allocates its workspace, which a capture refuses)."""
    attention.eager(seq_lens)
    graph = device.new_graph()
    with device.graph(graph):
        stream = device.current_stream()
        event = device.new_external_event()
        event.wait(stream)
        event.reset(stream)
        device.task_group_begin(stream)
        attention.launch(seq_lens)
        handle = device.task_group_end(stream)
    return graph, handle, event


def update_attention(device: Any, attention: TinyAttention, handle: Any, event: Any, seq_lens: list[int], stream: Any) -> None:
    with device.stream(stream):
        device.task_update_begin(stream, handle)
        attention.launch(seq_lens)
        device.task_update_end(stream)
        event.record(stream)
