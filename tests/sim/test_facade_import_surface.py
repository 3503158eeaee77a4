"""The facade as real code imports it: module specs, import-time names, and the ``npu``
device it brings (in a subprocess, as real code starts: the rename of PrivateUse1 cannot be
undone in a process). One launch runs every probe below, each printing its own section; the
tests read the section of theirs."""

from __future__ import annotations

import subprocess
import sys

import pytest

# torch.distributed is imported before torch_npu, as vLLM Ascend's netloader does; torch before
# torch_npu, as every caller does.
PROBE = """
import importlib.util, torch.distributed as dist, torch, torch_npu
print("--- spec and device")
print(importlib.util.find_spec("torch_npu").name, torch_npu.__spec__.name, torch_npu.hifloat8)
device = torch.device("npu:0")
print("device", device.type, device.index, torch.zeros(2).npu().device.type, torch.zeros(2, device="npu").is_npu)
"""

DISTRIBUTED_PROBE = """
print("--- distributed")
from torch.distributed import is_hccl_available
from torch_npu._C._distributed_c10d import ProcessGroupHCCL
print(is_hccl_available(), dist.is_hccl_available is torch_npu.distributed.is_hccl_available)
try:
    ProcessGroupHCCL(None, 0, 1)
except NotImplementedError as exc:
    print(exc)
"""

PINNED_PROBE = """
print("--- pinned")
x = torch.arange(6, dtype=torch.int32).reshape(2, 3)
print(x.is_pinned())
p = x.pin_memory()
print(p.is_pinned(), p[1:].is_pinned(), p.pin_memory() is p or p.pin_memory().data_ptr() == p.data_ptr(),
      torch.equal(p, x), p.stride() == x.stride(), p.data_ptr() != x.data_ptr(), x.is_pinned())
q = p.to("npu", non_blocking=True)
print(q.device.type, torch.equal(q.cpu(), x))
e = torch.empty(4, pin_memory=True)
print(e.is_pinned(), e.device.type)
"""


def _run(*launcher: str) -> dict[str, list[str]]:
    """The probes' output under the launcher, by section."""
    done = subprocess.run([sys.executable, "-m", "sim.facade", *launcher, "--", sys.executable, "-c",
                           PROBE + DISTRIBUTED_PROBE + PINNED_PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    sections: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if line.startswith("--- "):
            sections[line[4:]] = []
        else:
            sections[list(sections)[-1]].append(line)
    return sections


@pytest.fixture(scope="module")
def plain_launch() -> dict[str, list[str]]:
    """The probes' output under the launcher without flags: one process pair for the tests that
    read it (the output is fixed by the code; nothing a test does changes it)."""
    return _run()


def test_find_spec_and_dtype_codes_work_under_the_facade_and_npu_is_a_torch_device(
        plain_launch: dict[str, list[str]]) -> None:
    spec_line, device_line = plain_launch["spec and device"]
    assert spec_line == "torch_npu torch_npu 290"
    assert device_line == "device npu 0 npu True"


def test_the_former_npu_device_flag_is_accepted_and_changes_nothing(plain_launch: dict[str, list[str]]) -> None:
    assert _run("--npu-device") == plain_launch


@pytest.mark.parametrize("name", ["memory_stats", "max_memory_allocated", "reset_peak_memory_stats",
                                  "get_device_properties", "config"])
def test_torch_npu_npu_has_the_names_vllm_ascend_reads_at_set_up(name: str) -> None:
    from sim.facade.modules import facade_modules

    npu = facade_modules()["torch_npu.npu"]
    assert hasattr(npu, name)
    if name == "get_device_properties":
        props = npu.get_device_properties(0)
        assert props.name == "Ascend910B3" and props.total_memory > 0
    if name == "memory_stats":
        assert set(npu.memory_stats()) >= {"allocated_bytes.all.current", "allocated_bytes.all.peak"}


def test_importing_torch_npu_adds_is_hccl_available_to_torch_distributed_as_torch_npu_does(
        plain_launch: dict[str, list[str]]) -> None:
    # vLLM Ascend's netloader imports both at module level (vLLM's model inspection reaches it).
    lines = plain_launch["distributed"]
    available, same = lines[0].split()
    assert (available, same) == ("False", "True")  # no HCCL backend is registered on the simulator
    assert lines[1].startswith(
        "torch_npu._C._distributed_c10d.ProcessGroupHCCL is not modelled by the simulator")


def test_uninstall_takes_is_hccl_available_away_again() -> None:
    import torch.distributed as dist

    from sim import facade

    had = hasattr(dist, "is_hccl_available")
    facade.install(quiet=True)
    try:
        assert dist.is_hccl_available() is False
    finally:
        facade.uninstall()
    assert hasattr(dist, "is_hccl_available") == had


def test_pinned_host_memory_is_a_pinned_cpu_allocation_of_the_npu_device(plain_launch: dict[str, list[str]]) -> None:
    assert plain_launch["pinned"] == ["False", "True True True True True True False", "npu True", "True cpu"]


def test_hccl_process_group_options_exist_as_vllm_ascends_group_set_up_builds_them() -> None:
    # vLLM Ascend builds ProcessGroupHCCL.Options for every group, whatever the backend
    # (utils.py:960-965 at 182b75ea); the process group itself stays unmodelled.
    from sim.facade.modules import facade_modules

    hccl = facade_modules()["torch_npu._C._distributed_c10d"].ProcessGroupHCCL
    options = hccl.Options()
    options.hccl_config = {"hccl_buffer_size": 200, "group_name": "world"}
    assert options.is_high_priority_stream is False and options.hccl_config["group_name"] == "world"
    with pytest.raises(NotImplementedError, match="ProcessGroupHCCL is not modelled by the simulator"):
        hccl(None, 0, 1)
