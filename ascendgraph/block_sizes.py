"""The paged KV cache's block size rule, without torch.

The fused attention hw/ issues (torch_npu's ``npu_fused_infer_attention_score``, TND, paged
KV) takes a block size by query length (torch-npu 2.13.0 ``torch_npu/_op_plugin_docs.py``):

* Q_S > 1 (the "当Q_S大于1时" branch opening at :8201; a prefill, or any batch with a request
  of more than one query token): :8219, block_size at least 128, at most 512, a multiple of
  128 (v2: :8759 / :8776, the same words);
* Q_S == 1 (the "当Q_S等于1时" branch at :8269; decode): :8280, non-zero, at most 512,
  16-aligned for float16/bfloat16 KV and 32-aligned for int8 KV, 128 recommended.

In TND the query's Q_S is per request: a batch takes the Q_S > 1 branch when any request has
more than one query token. An engine always runs prefills, so the configuration check asks
for the Q_S > 1 rule (vLLM Ascend's FIA backend supports the kernel block size 128 only:
``AscendAttentionBackend.get_supported_kernel_block_sizes``, vllm_ascend/attention/
attention_v1.py@182b75ea). The kernel-contract table (`ascendgraph.kernel_contracts`, rules
``paged_block_size`` / ``v2_paged_block_size``) and the configuration check share this
module, so ``explain`` and flag parsing can refuse an illegal ``--block-size`` without
importing torch.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["MAX_PAGED_BLOCK_SIZE", "PAGED_BLOCK_ALIGNMENT", "INT8_KV_BLOCK_ALIGNMENT", "PREFILL_BLOCK_ALIGNMENT",
           "PAGED_BLOCK_SIZE_SOURCE", "paged_block_size_ok", "describe_paged_block_size", "block_size_problem"]

MAX_PAGED_BLOCK_SIZE = 512
PAGED_BLOCK_ALIGNMENT = 16  # Q_S == 1, float16/bfloat16 KV
INT8_KV_BLOCK_ALIGNMENT = 32  # Q_S == 1, int8 KV
PREFILL_BLOCK_ALIGNMENT = 128  # Q_S > 1
PAGED_BLOCK_SIZE_SOURCE = (
    "torch-npu 2.13.0 torch_npu/_op_plugin_docs.py:8219 (Q_S > 1, the branch opening at :8201: page attention "
    "block_size at least 128, at most 512, a multiple of 128); :8280 (Q_S == 1, the branch at :8269: non-zero, "
    "<= 512, 16-aligned for float16/bfloat16 KV, 32-aligned for int8 KV, 128 recommended)"
)


def _alignment(max_query_len: int, int8_kv: bool = False) -> int:
    if int(max_query_len) > 1:
        return PREFILL_BLOCK_ALIGNMENT
    return INT8_KV_BLOCK_ALIGNMENT if int8_kv else PAGED_BLOCK_ALIGNMENT


def paged_block_size_ok(block_size: int, max_query_len: int = 2, *, int8_kv: bool = False) -> bool:
    """Whether page attention takes ``block_size`` for a batch whose longest request has
    ``max_query_len`` query tokens (Q_S; the default asks for the prefill rule), over an int8
    KV cache when ``int8_kv``."""
    alignment = _alignment(max_query_len, int8_kv)
    return alignment <= int(block_size) <= MAX_PAGED_BLOCK_SIZE and int(block_size) % alignment == 0


def describe_paged_block_size(block_size: int, max_query_len: int = 2, *, int8_kv: bool = False) -> str:
    alignment = _alignment(max_query_len, int8_kv)
    if int(max_query_len) > 1:
        branch = f"Q_S={max_query_len} > 1 (a request of several query tokens)"
    else:
        branch = "Q_S == 1 (decode) over an int8 KV cache" if int8_kv else "Q_S == 1 (decode)"
    return (f"block_size={block_size}; with {branch} page attention needs {alignment}..{MAX_PAGED_BLOCK_SIZE} in "
            f"steps of {alignment} (128 is vLLM Ascend's kernel block size)")


def block_size_problem(block_size: int, attention_backend: str = "ascend") -> Optional[str]:
    """Why a paged KV cache of ``block_size`` would be refused by the attention kernel (None: legal).

    Every attention backend here issues the same torch_npu call on an NPU (hw/kernels.py:
    the fused attention, TND, paged KV), and every engine runs prefills (Q_S > 1), so the
    rule is that call's ``paged_block_size`` for Q_S > 1.
    """
    if paged_block_size_ok(block_size):
        return None
    return (f"paged_block_size: {describe_paged_block_size(block_size)} (attention backend {attention_backend}; "
            f"source: {PAGED_BLOCK_SIZE_SOURCE})")
