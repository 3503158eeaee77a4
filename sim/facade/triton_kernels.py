"""vLLM Ascend's Triton kernels as simulator kernels.

On a card vLLM Ascend launches some of its device work as Triton kernels (triton-ascend is one
of its dependencies): ``kernel[grid](*args, **constexprs)``. Triton is not installed beside the
simulator, so vLLM's ``triton_utils`` hands vLLM Ascend a placeholder whose ``triton.jit``
returns the kernel's Python function unchanged (vllm/triton_utils/importing.py:94-111 at
0.27.1): the module imports, and the launch ``function[grid]`` fails ("'function' object is
not subscriptable"). vLLM Ascend's model runner launches one on every step that schedules
tokens: the slot mapping (vllm_ascend/worker/block_table.py@182b75ea:169-180, kernel
vllm_ascend/ops/triton/compute_slot_mapping.py:11-84).

`install()` gives every kernel of `KERNELS` a launcher: wherever a loaded ``vllm_ascend``
module holds the placeholder-jitted function, it now holds a `SimTritonKernel` whose
``[grid](...)`` runs the simulator's implementation of that kernel: torch ops on the device
tensors it is given, so the work is queued on the current stream like any other kernel (no
host read, capturable). The Triton source itself is not executed; the implementation is
written from it, and a constexpr combination it does not model raises NotImplementedError
naming the kernel. A Triton kernel without an implementation keeps the placeholder's
behaviour. Listed in docs/facade.md ("What it provides", "Deviations").
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

__all__ = ["KERNELS", "SimTritonKernel", "install", "compute_slot_mapping"]


def compute_slot_mapping(grid: tuple[int, ...], num_tokens: int, max_num_tokens: int, query_start_loc_ptr: torch.Tensor,
                         positions_ptr: torch.Tensor, block_table_ptr: torch.Tensor, block_table_stride: int,
                         block_size: int, slot_mapping_ptr: torch.Tensor, *, KV_CACHE_BLOCK_SIZE: int,
                         BLOCKS_PER_KV_BLOCK: int, TOTAL_CP_WORLD_SIZE: int, TOTAL_CP_RANK: int,
                         CP_KV_CACHE_INTERLEAVE_SIZE: int, PAD_ID: int, TILE_BLOCK_SIZE: int,
                         BLOCK_TABLE_WINDOW_SIZE: int) -> None:
    """``_compute_slot_mapping_kernel`` (compute_slot_mapping.py:11-84) without context
    parallelism: programs ``0 .. grid[0] - 2`` are the requests, each token ``t`` of request
    ``r`` (``query_start_loc[r] <= t < query_start_loc[r + 1]``) gets
    ``block_table[r, pos // block_size] * block_size + pos % block_size`` (pos its position);
    the last program writes ``PAD_ID`` from ``num_tokens`` to ``max_num_tokens``."""
    if TOTAL_CP_WORLD_SIZE != 1:
        raise NotImplementedError("sim.facade models _compute_slot_mapping_kernel without context parallelism "
                                  f"only (TOTAL_CP_WORLD_SIZE=1), got {TOTAL_CP_WORLD_SIZE}")
    num_reqs = int(grid[0]) - 1
    device = positions_ptr.device
    tokens = torch.arange(num_tokens, device=device, dtype=torch.int64)
    ends = query_start_loc_ptr[1: num_reqs + 1].to(torch.int64)
    starts = query_start_loc_ptr[:num_reqs].to(torch.int64)
    request = torch.searchsorted(ends, tokens, right=True)  # the request whose range holds the token
    inside = request < num_reqs
    request = request.clamp(max=max(num_reqs - 1, 0))
    inside &= tokens >= starts[request] if num_reqs else inside
    position = positions_ptr[:num_tokens].to(torch.int64)
    block = position // block_size
    flat = block_table_ptr.reshape(-1)
    numbers = flat[(request * block_table_stride + block).clamp(0, flat.numel() - 1)].to(torch.int64)
    slots = numbers * block_size + (position - block * block_size)
    written = slot_mapping_ptr[:num_tokens]
    written.copy_(torch.where(inside, slots, written.to(torch.int64)).to(slot_mapping_ptr.dtype))
    slot_mapping_ptr[num_tokens:max_num_tokens].fill_(PAD_ID)


@dataclass(frozen=True)
class KernelEntry:
    module: str  # where vLLM Ascend defines the Triton kernel
    name: str
    implementation: Callable[..., None]


KERNELS: tuple[KernelEntry, ...] = (
    KernelEntry("vllm_ascend.ops.triton.compute_slot_mapping", "_compute_slot_mapping_kernel", compute_slot_mapping),
)


class SimTritonKernel:
    """``kernel[grid](*args, **kwargs)`` on the simulator: the implementation runs with the grid."""

    def __init__(self, entry: KernelEntry, source: Callable[..., Any]) -> None:
        self.entry = entry
        self.source = source  # the placeholder-jitted Python function (the Triton source)
        self.__name__ = entry.name
        self.__qualname__ = entry.name

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)

        def launch(*args: Any, **kwargs: Any) -> None:
            self.entry.implementation(grid, *args, **kwargs)

        return launch

    def __repr__(self) -> str:
        return f"<Triton kernel {self.entry.module}.{self.entry.name} (simulator implementation)>"


def install() -> list[str]:
    """Replace each placeholder-jitted kernel of `KERNELS` by its `SimTritonKernel` in every
    loaded ``vllm_ascend`` module that holds it (idempotent). Returns the kernels installed.
    Does nothing where real Triton is present (the kernel is then a JITFunction)."""
    installed = []
    for entry in KERNELS:
        module = importlib.import_module(entry.module)
        current = getattr(module, entry.name)
        source = current.source if isinstance(current, SimTritonKernel) else current
        if not _is_placeholder_jitted(source):
            continue
        launcher = current if isinstance(current, SimTritonKernel) else SimTritonKernel(entry, source)
        for name, loaded in list(sys.modules.items()):
            if loaded is None or not (name == "vllm_ascend" or name.startswith("vllm_ascend.")):
                continue
            for attribute, value in list(vars(loaded).items()):
                if value is source:
                    setattr(loaded, attribute, launcher)
        installed.append(f"{entry.module}.{entry.name}")
    return installed


def _is_placeholder_jitted(value: Any) -> bool:
    """A plain Python function (vLLM's TritonPlaceholder.jit returns its argument)."""
    return callable(value) and type(value).__name__ == "function"
