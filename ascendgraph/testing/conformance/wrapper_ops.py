"""Conformance section: wrapper ops."""

from __future__ import annotations

import torch

from ascendgraph import ops
from ascendgraph.dynamo_gate import defer_kernel_dynamo_guard
from ascendgraph.testing.conformance.registry import ALL, case
from ascendgraph.testing.conformance.helpers import is_sim, TinyAttention


@case(ALL)
def test_a_wrapper_op_records_its_kernels_with_frozen_host_lengths(device):
    attention = TinyAttention(device)
    context = {"seq_lens": [3, 5]}

    def impl(query: torch.Tensor, out: torch.Tensor) -> None:
        attention.launch(list(context["seq_lens"]), out=out)

    ops.register_wrapper_op(_context_attention, impl)
    try:
        attention.eager([3, 5])  # warm-up: a kernel's first launch for a shape is refused in a capture
        graph = device.new_graph()
        with device.graph(graph):
            _context_attention(attention.query, attention.out)
        context["seq_lens"] = [6, 9]  # a new batch: the graph still holds [3, 5]
        graph.replay()
        device.synchronize()
        torch.testing.assert_close(attention.out, attention.eager([3, 5]))
        if is_sim(device):
            assert "ascendgraph.paged_attention.default" in graph.recorded_ops()
    finally:
        ops.unregister_wrapper_op(_context_attention)


@torch.library.custom_op("ascendgraph_conformance::context_attention", mutates_args=("out",))
def _context_attention(query: torch.Tensor, out: torch.Tensor) -> None:
    impl = ops.wrapper_impl(_context_attention)
    if impl is None:
        raise RuntimeError("ascendgraph_conformance::context_attention used outside its test")
    impl(query, out)


defer_kernel_dynamo_guard(_context_attention)
