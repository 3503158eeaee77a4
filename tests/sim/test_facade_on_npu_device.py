"""The facade's pieces that meet the npu device (sim.npu_device): weak references of npu
tensors, and Python custom ops on npu tensors seen through the simulator's modes as the kernels
they issue (vLLM's attention, GEMM and rotary ops under a capture)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from sim import recorder


def test_a_weak_reference_of_an_npu_tensor_is_an_npu_tensor_over_the_same_memory(npu: Any) -> None:
    tensor = torch.arange(6.0).to("npu")
    weak = npu._C._weak_ref_tensor(tensor)
    assert weak.device.type == "npu" and weak.data_ptr() == tensor.data_ptr()
    tensor.add_(1)
    assert weak.cpu().tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert (weak + torch.ones(6).to("npu")).cpu().tolist() == [2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # an op with npu tensors


_LIBRARY: list[Any] = []


def double_into_op() -> Any:
    """A Python custom op registered for the npu device's key, as vLLM registers its ops for
    the accelerator's (defined once the device is spelled "npu")."""
    if not _LIBRARY:
        library = torch.library.Library("ascendgraph_pydevop", "DEF")
        library.define("double_into(Tensor x, Tensor(a!) out) -> ()")

        def double_into(x: torch.Tensor, out: torch.Tensor) -> None:
            out.copy_(x * 2)

        library.impl("double_into", double_into, "PrivateUse1")
        _LIBRARY.append(library)
    return torch.ops.ascendgraph_pydevop.double_into


class Seen(recorder._Mode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def handle(self, func: Any, args: Any, kwargs: dict) -> Any:
        self.ops.append(str(func))
        return func(*args, **kwargs)


def test_a_python_custom_op_on_npu_tensors_is_seen_as_the_ops_it_issues(npu: Any, monkeypatch: Any) -> None:
    monkeypatch.setattr(recorder, "PYTHON_DEVICE_OP_NAMESPACES", frozenset({"ascendgraph_pydevop"}))
    x, out = torch.ones(3).to("npu"), torch.zeros(3).to("npu")
    op = double_into_op()
    mode = Seen()
    with mode:
        op(x, out)
    assert "ascendgraph_pydevop.double_into.default" not in mode.ops
    assert "aten.mul.Tensor" in mode.ops and "aten.copy_.default" in mode.ops
    assert out.cpu().tolist() == [2.0, 2.0, 2.0]


def test_each_thread_works_on_the_npu_it_set_as_its_own(two_simulated_npus: Any) -> None:
    """Two threads, each after ``torch.npu.set_device(i)``: its npu tensors are ``npu:i``, its
    memory and its graph are NPU i's, and the other thread's current device is untouched
    (torch_npu's current device is per thread)."""
    import threading

    seen: dict[int, Any] = {}

    def rank(index: int) -> None:
        from sim import facade

        torch.npu.set_device(index)
        x = torch.ones(4, device="npu")
        graph = torch.npu.NPUGraph()
        with torch.npu.graph(graph):
            y = x + index
        graph.replay()
        seen[index] = (x.device, y.device, y.cpu().tolist(), facade.device() is two_simulated_npus[index].device,
                       torch.npu.current_device())

    threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen[0] == (torch.device("npu", 0), torch.device("npu", 0), [1.0] * 4, True, 0)
    assert seen[1] == (torch.device("npu", 1), torch.device("npu", 1), [2.0] * 4, True, 1)
    assert [rt.device.stats().graphs_captured_total for rt in two_simulated_npus] == [1, 1]
    assert torch.npu.device_count() == 2 and torch.npu.current_device() == 0
    with pytest.raises(RuntimeError, match="same device"):
        torch.ones(2, device="npu:0") + torch.ones(2, device="npu:1")
