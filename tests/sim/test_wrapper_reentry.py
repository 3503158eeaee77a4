"""A wrapper op's implementation is recorded op by op, composite ops included: a
``Tensor.to(dtype)`` inside it is a recorded task, not a value frozen at capture."""

from __future__ import annotations

import torch

from ascendgraph import ops
from sim.device import SimDevice


@torch.library.custom_op("ascendgraph_test_reentry::convert_into", mutates_args=("out",))
def _convert_into(x: torch.Tensor, out: torch.Tensor) -> None:
    raise RuntimeError("used outside its test")


def test_a_dtype_conversion_inside_a_wrapper_op_is_replayed_with_the_new_input() -> None:
    def impl(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x.to(torch.int32) * 2)

    ops.register_wrapper_op(_convert_into, impl)
    try:
        device = SimDevice()
        x, out = torch.tensor([1, 2]), torch.zeros(2, dtype=torch.int32)
        graph = device.new_graph()
        with device.graph(graph):
            _convert_into(x, out)
        assert "aten._to_copy.default" in graph.recorded_ops()
        x.copy_(torch.tensor([5, 7]))
        graph.replay()
        device.synchronize()
        assert out.tolist() == [10, 14]
    finally:
        ops.unregister_wrapper_op(_convert_into)
