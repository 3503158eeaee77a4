"""vLLM Ascend's Triton kernels as simulator kernels (sim.facade.triton_kernels): the slot
mapping against a formula written here from the Triton source, and the launcher's shape."""

from __future__ import annotations

import types

import pytest
import torch

from sim.facade import triton_kernels

CONSTEXPRS = dict(KV_CACHE_BLOCK_SIZE=4, BLOCKS_PER_KV_BLOCK=1, TOTAL_CP_WORLD_SIZE=1, TOTAL_CP_RANK=0,
                  CP_KV_CACHE_INTERLEAVE_SIZE=1, PAD_ID=-1, TILE_BLOCK_SIZE=1024, BLOCK_TABLE_WINDOW_SIZE=4)


def test_the_slot_mapping_maps_each_token_through_its_requests_block_table_and_pads_the_rest() -> None:
    # 3 requests of 2, 3 and 1 tokens; block size 4; positions continue each request's context.
    query_start_loc = torch.tensor([0, 2, 5, 6], dtype=torch.int32)
    positions = torch.tensor([6, 7, 0, 1, 2, 9], dtype=torch.int64)
    block_table = torch.tensor([[5, 2, 0], [7, 0, 0], [1, 3, 8]], dtype=torch.int32)
    slot_mapping = torch.full((10,), 123, dtype=torch.int32)
    kernel = triton_kernels.SimTritonKernel(triton_kernels.KERNELS[0], lambda *a: None)
    kernel[(4,)](6, 10, query_start_loc, positions, block_table, block_table.stride(0), 4, slot_mapping, **CONSTEXPRS)
    # request 0: positions 6, 7 -> block 1 (=2) offsets 2, 3; request 1: 0..2 -> block 0 (=7);
    # request 2: position 9 -> block 2 (=8) offset 1; then PAD_ID to max_num_tokens.
    assert slot_mapping.tolist() == [2 * 4 + 2, 2 * 4 + 3, 28, 29, 30, 8 * 4 + 1, -1, -1, -1, -1]


def test_context_parallelism_is_not_modelled() -> None:
    kernel = triton_kernels.SimTritonKernel(triton_kernels.KERNELS[0], lambda *a: None)
    with pytest.raises(NotImplementedError, match="without context parallelism"):
        kernel[(2,)](1, 2, torch.tensor([0, 1]), torch.tensor([0]), torch.zeros(1, 1, dtype=torch.int32), 1, 4,
                     torch.zeros(2, dtype=torch.int32), **{**CONSTEXPRS, "TOTAL_CP_WORLD_SIZE": 2})


def test_install_replaces_the_placeholder_jitted_kernel_wherever_vllm_ascend_holds_it(monkeypatch) -> None:
    def placeholder_jitted(*args):  # what vLLM's TritonPlaceholder.jit leaves: the plain function
        raise AssertionError("the Triton source is not executed")

    defining = types.ModuleType("vllm_ascend.ops.triton.compute_slot_mapping")
    defining._compute_slot_mapping_kernel = placeholder_jitted
    user = types.ModuleType("vllm_ascend.worker.block_table")
    user._compute_slot_mapping_kernel = placeholder_jitted
    for module in (defining, user):
        monkeypatch.setitem(__import__("sys").modules, module.__name__, module)
    assert triton_kernels.install() == ["vllm_ascend.ops.triton.compute_slot_mapping._compute_slot_mapping_kernel"]
    assert isinstance(user._compute_slot_mapping_kernel, triton_kernels.SimTritonKernel)
    assert user._compute_slot_mapping_kernel is defining._compute_slot_mapping_kernel
    assert triton_kernels.install() == [triton_kernels.KERNELS[0].module + "." + triton_kernels.KERNELS[0].name]
