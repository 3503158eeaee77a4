"""The simulated NPU as a torch device (`sim.npu_device`): npu tensors whose memory the
simulator owns, CPU kernels on that memory, copies, pinned host memory, generators, the
device guard's streams, and the bad inputs torch_npu refuses.

Enabling the device spells PrivateUse1 "npu" in this process (irreversible, as with
torch_npu); the facade does the same, so every worker may do it."""

from __future__ import annotations

import dataclasses
import gc
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import sim.npu_device as npu_device
from sim.device import SimDevice
from sim.pool_memory import DeadWeakReference
from sim.profiles import PROFILES


@pytest.fixture()
def sim_npu() -> SimDevice:
    npu_device.enable()
    device = SimDevice(profile="A2")
    npu_device.attach(device)
    yield device
    npu_device.attach(None)


def _held(device: SimDevice) -> int:
    from sim.npu_device import simulator

    return simulator.allocated_bytes(device)


def test_tensors_made_on_npu_live_on_the_npu_device_in_memory_the_simulator_accounts(sim_npu: SimDevice) -> None:
    before = _held(sim_npu)
    empty = torch.empty(256, device="npu")
    zeros = torch.zeros(2, 3, device="npu:0")
    assert empty.device == torch.device("npu", 0) and zeros.device.type == "npu"
    assert _held(sim_npu) - before >= 256 * 4 + 6 * 4
    assert npu_device.driver().owner(empty.untyped_storage().data_ptr()) is sim_npu
    del empty, zeros
    assert _held(sim_npu) == before


def test_ops_run_the_cpu_kernels_on_the_device_memory_itself(sim_npu: SimDevice) -> None:
    host = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    x = host.to("npu")
    row = x[1]  # a view: same storage
    x.add_(1)
    assert row.device.type == "npu" and row.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
    assert row.cpu().tolist() == (host[1] + 1).tolist()
    y = torch.matmul(x, x.t()).softmax(-1)
    assert y.device.type == "npu"
    torch.testing.assert_close(y.cpu(), torch.matmul(host + 1, (host + 1).t()).softmax(-1))
    assert x.sum().item() == float((host + 1).sum())
    assert bool(x[0, 0] == 1.0)
    assert "device='npu:0'" in repr(x)


def test_copies_between_host_and_device_and_host_reads(sim_npu: SimDevice) -> None:
    host = torch.tensor([1.0, 2.0, 3.0])
    for non_blocking in (False, True):
        x = host.to("npu", non_blocking=non_blocking)  # unpinned + non_blocking: allowed, synchronous
        assert x.device.type == "npu" and x.tolist() == [1.0, 2.0, 3.0]
    pinned = host.pin_memory()
    x = pinned.to("npu", non_blocking=True)
    back = torch.empty(3, pin_memory=True)
    back.copy_(x * 2, non_blocking=True)
    sim_npu.synchronize()
    assert back.tolist() == [2.0, 4.0, 6.0]
    assert x.cpu().device.type == "cpu" and x.npu().device.type == "npu"


def test_pinned_host_memory_is_a_real_pinned_cpu_allocation(sim_npu: SimDevice) -> None:
    start = npu_device.pinned_bytes()
    factory = torch.empty(64, pin_memory=True)
    copied = torch.ones(8).pin_memory()
    assert factory.device.type == "cpu" and factory.is_pinned() and copied.is_pinned()
    assert factory[8:16].is_pinned()  # a view of pinned memory is pinned memory
    assert not torch.ones(8).is_pinned()
    assert copied.pin_memory() is copied or copied.pin_memory().data_ptr() == copied.data_ptr()
    assert npu_device.pinned_bytes() - start >= 64 * 4 + 8 * 4
    del factory, copied
    assert npu_device.pinned_bytes() == start


def test_generators_on_npu_are_reproducible_and_advance(sim_npu: SimDevice) -> None:
    generator = torch.Generator(device="npu")
    assert generator.device.type == "npu"
    generator.manual_seed(7)
    first = torch.randn(4, device="npu", generator=generator).cpu()
    second = torch.randn(4, device="npu", generator=generator).cpu()
    generator.manual_seed(7)
    assert torch.equal(torch.randn(4, device="npu", generator=generator).cpu(), first)
    assert not torch.equal(first, second)
    default = npu_device.default_generator(0)
    default.manual_seed(3)
    a = torch.rand(5, device="npu").cpu()
    default.manual_seed(3)
    assert torch.equal(torch.rand(5, device="npu").cpu(), a)


def test_the_device_guard_reports_the_simulators_streams(sim_npu: SimDevice) -> None:
    assert torch.accelerator.current_stream("npu").stream_id == sim_npu.current_stream().stream_id
    side = sim_npu.new_stream()
    with sim_npu.stream(side):
        assert torch.accelerator.current_stream("npu").stream_id == side.stream_id
    new = torch.Stream(device="npu")
    assert new.stream_id not in (0, side.stream_id)
    event = torch.Event(device="npu")
    event.record(new)
    event.synchronize()
    assert event.query()


def test_a_cpu_tensor_where_an_npu_one_is_needed_is_refused_in_torchs_words(sim_npu: SimDevice) -> None:
    x = torch.ones(3, 4, device="npu")
    with pytest.raises(RuntimeError, match=r"^Expected all tensors to be on the same device, but got index is on cpu, "
                                           r"different from other tensors on npu:0 \(when checking argument in method "
                                           r"wrapper_NPU__index_select\)$"):
        torch.index_select(x, 0, torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match=r"^Expected all tensors to be on the same device, but found at least two "
                                           r"devices, npu:0 and cpu!$"):  # TensorIterator's own check
        torch.add(x, torch.ones(3, 4))
    assert (x + torch.tensor(2.0)).tolist() == [[3.0] * 4] * 3  # a 0-dim CPU tensor is a scalar
    assert x[torch.tensor([0, 2])].shape == (2, 4)  # indexing takes its indices from the host


def test_a_tensor_outlives_the_simulated_npu_it_was_made_on(sim_npu: SimDevice) -> None:
    # The facade gives each test a fresh simulated NPU; a tensor kept from before (a module-level
    # cache of the code under test) keeps its memory and stays usable, as on a node.
    old = torch.ones(3, device="npu")
    npu_device.attach(SimDevice(profile="A2"))
    gc.collect()
    new = torch.zeros(3, device="npu")
    new.copy_(old)
    assert (old + new).tolist() == [2.0, 2.0, 2.0]
    assert npu_device.driver().owner(old.untyped_storage().data_ptr()) is sim_npu


def test_two_simulated_npus_copy_between_their_devices_and_refuse_mixing_in_one_op() -> None:
    npu_device.enable()
    first, second = SimDevice(profile="A2"), SimDevice(profile="A3")
    npu_device.attach({0: first, 1: second})
    try:
        x = torch.arange(4.0, device="npu:0")
        y = torch.zeros(4, device="npu:1")
        assert torch.npu.device_count() == 2 if hasattr(torch.npu, "device_count") else True
        y.copy_(x)  # a copy between the two simulated NPUs, as between two cards
        assert y.device == torch.device("npu", 1) and y.tolist() == [0.0, 1.0, 2.0, 3.0]
        assert npu_device.driver().owner(y.untyped_storage().data_ptr()) is second
        assert x.to("npu:1").tolist() == x.tolist()
        with pytest.raises(RuntimeError, match=r"^Expected all tensors to be on the same device, but got index is on "
                                               r"npu:1, different from other tensors on npu:0"):
            torch.index_select(x, 0, torch.tensor([0, 1], device="npu:1"))
        with pytest.raises(RuntimeError, match="Invalid device id"):
            torch.empty(2, device="npu:2")
    finally:
        npu_device.attach(None)


def test_an_allocation_past_the_devices_memory_raises_torch_npus_out_of_memory_text() -> None:
    npu_device.enable()
    small = dataclasses.replace(PROFILES["A2"].device, memory_bytes=64 << 20)
    npu_device.attach(SimDevice(profile=small))
    try:
        keep = torch.empty(24 << 20, dtype=torch.uint8, device="npu")
        with pytest.raises(torch.OutOfMemoryError, match=r"^NPU out of memory\. Tried to allocate 48\.00 MiB"):
            torch.empty(12 << 20, dtype=torch.float32, device="npu")
        del keep
    finally:
        npu_device.attach(None)


def test_weak_alias_is_a_plain_tensor_over_the_same_memory_and_refuses_a_read_after_free(sim_npu: SimDevice) -> None:
    owner = torch.arange(4, dtype=torch.float32, device="npu")
    weak = npu_device.weak_alias(owner)
    assert type(weak) is torch.Tensor and weak.device.type == "npu"
    assert weak.data_ptr() == owner.data_ptr() and weak.tolist() == [0.0, 1.0, 2.0, 3.0]
    owner.mul_(2)
    assert weak.cpu().tolist() == [0.0, 2.0, 4.0, 6.0]
    del owner
    with pytest.raises(DeadWeakReference, match=r"^simulator: .*_weak_ref_tensor \(shape \(4,\), float32\) .*freed"):
        weak.tolist()


def test_no_attached_simulated_npu_is_one_clear_error() -> None:
    npu_device.enable()
    npu_device.attach(None)
    with pytest.raises(npu_device.NoSimulatedNpu, match="no simulated NPU is attached"):
        torch.empty(2, device="npu")


def test_a_failed_build_is_one_line_naming_the_compiler_error_and_the_cache_path(tmp_path: Path) -> None:
    from sim.npu_device.build import build_directory

    source = tmp_path / "npu_device.cpp"
    source.write_text("#error the simulated device does not build\n")
    # What a build killed outright (SIGKILL) left behind: the next build of the key removes it.
    killed = build_directory(str(tmp_path / "cache"), (source,))
    killed = killed.with_name(build_directory(str(tmp_path / "cache"), (source,)).name + ".build-killed0")
    killed.mkdir(parents=True)
    (killed / "npu_device.o").write_bytes(b"half")
    probe = textwrap.dedent(f"""
        from pathlib import Path
        from sim.npu_device.build import load_extension, NpuDeviceBuildError
        try:
            load_extension({str(tmp_path / 'cache')!r}, sources=(Path({str(source)!r}),))
        except NpuDeviceBuildError as exc:
            print(exc)
        from sim.device import SimDevice
        import torch
        device = SimDevice()
        x = torch.ones(4)
        with device.graph(device.new_graph()):
            y = x * 2
        print("cpu simulator works")
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[2])
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    assert len(lines) == 2 and lines[1] == "cpu simulator works"
    assert lines[0].startswith("sim.npu_device: building the npu device extension failed: ")
    assert "error: #error the simulated device does not build" in lines[0]
    assert str(tmp_path / "cache") in lines[0] and lines[0].endswith("the CPU simulator works without it")
    failed = list((tmp_path / "cache").glob("npu-device-*.failed"))
    assert len(failed) == 1 and (failed[0] / "build.log").exists()
    finals = [p for p in (tmp_path / "cache").iterdir() if re.fullmatch(r"npu-device-[0-9a-f]{16}", p.name)]
    assert finals == []  # nothing left under the name a later process would load
    assert not killed.exists() and list((tmp_path / "cache").glob("npu-device-*.build-*")) == []
