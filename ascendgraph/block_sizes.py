"""The paged KV cache's block size rule, without torch.

The fused attention hw/ issues (torch_npu's ``npu_fused_infer_attention_score``, TND, paged
KV) takes a block size that is non-zero, at most 512 and 16-aligned for float16/bfloat16 KV
(torch-npu 2.13.0 ``torch_npu/_op_plugin_docs.py``:8280; 128 is recommended there and is
vLLM Ascend's default). The kernel-contract table (`ascendgraph.kernel_contracts`, rule
``paged_block_size``) and the configuration check share this module, so ``explain`` and
flag parsing can refuse an illegal ``--block-size`` without importing torch.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["MAX_PAGED_BLOCK_SIZE", "PAGED_BLOCK_ALIGNMENT", "PAGED_BLOCK_SIZE_SOURCE", "paged_block_size_ok",
           "describe_paged_block_size", "block_size_problem"]

MAX_PAGED_BLOCK_SIZE = 512
PAGED_BLOCK_ALIGNMENT = 16
PAGED_BLOCK_SIZE_SOURCE = (
    "torch-npu 2.13.0 torch_npu/_op_plugin_docs.py:8280 (page attention: block_size non-zero, <= 512, 16-aligned "
    "for float16/bfloat16 KV, 128 recommended); :8219 (Q_S>1: multiples of 128) is not applied: which "
    "branch a ragged TND batch takes is undocumented and vLLM Ascend runs 128 in both"
)


def paged_block_size_ok(block_size: int) -> bool:
    return 0 < int(block_size) <= MAX_PAGED_BLOCK_SIZE and int(block_size) % PAGED_BLOCK_ALIGNMENT == 0


def describe_paged_block_size(block_size: int) -> str:
    return (f"block_size={block_size}; page attention needs {PAGED_BLOCK_ALIGNMENT}..{MAX_PAGED_BLOCK_SIZE} in steps "
            f"of {PAGED_BLOCK_ALIGNMENT} (128 is vLLM Ascend's default)")


def block_size_problem(block_size: int, attention_backend: str = "ascend") -> Optional[str]:
    """Why a paged KV cache of ``block_size`` would be refused by the attention kernel (None: legal).

    Every attention backend here issues the same torch_npu call on an NPU (hw/kernels.py:
    the fused attention, TND, paged KV), so the rule is that call's ``paged_block_size``.
    """
    if paged_block_size_ok(block_size):
        return None
    return (f"paged_block_size: {describe_paged_block_size(block_size)} (attention backend {attention_backend}; "
            f"source: {PAGED_BLOCK_SIZE_SOURCE})")
