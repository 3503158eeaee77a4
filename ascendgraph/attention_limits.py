"""The attention kernel's decode query-length limit, without torch (a configuration-level rule).

Rule ``tnd_decode_query_len``: with speculative decoding a decode request carries
``1 + num_speculative_tokens`` query tokens, and vLLM Ascend refuses more than 16 of them for
the fused attention in TND layout (vllm_ascend/attention/attention_v1.py@182b75ea:252-260,
``AscendAttentionMetadataBuilder.__init__`` asserts ``decode_threshold <= 16``, naming
"npu_fused_infer_attention_score TND layout's limit of 16"). A single kernel call cannot tell
a decode request from a short prefill chunk, so the rule is checked where vLLM Ascend checks
it: on the configuration. Every attention backend here issues that TND call on an NPU
(hw/kernels.py), so it applies to all of them. `ascendgraph.config` and the kernel-contract
table (`ascendgraph.kernel_contracts.CONFIG_RULES`) share this module.
"""

from __future__ import annotations

from typing import Optional

__all__ = ["MAX_TND_DECODE_QUERY_LEN", "TND_DECODE_QUERY_LEN_SOURCE", "decode_query_len_problem"]

MAX_TND_DECODE_QUERY_LEN = 16
TND_DECODE_QUERY_LEN_SOURCE = (
    "vllm-project/vllm-ascend vllm_ascend/attention/attention_v1.py@182b75ea:252-260 "
    "(AscendAttentionMetadataBuilder.__init__: decode_threshold = 1 + num_speculative_tokens <= 16, "
    "the TND layout's limit of npu_fused_infer_attention_score)"
)


def decode_query_len_problem(num_speculative_tokens: int, attention_backend: str = "ascend") -> Optional[str]:
    """Why decode requests of ``1 + num_speculative_tokens`` query tokens would be refused (None: legal)."""
    query_len = 1 + int(num_speculative_tokens)
    if query_len <= MAX_TND_DECODE_QUERY_LEN:
        return None
    return (f"tnd_decode_query_len: decode requests of {query_len} query tokens (1 + num_speculative_tokens="
            f"{num_speculative_tokens}); the fused attention in TND layout takes at most {MAX_TND_DECODE_QUERY_LEN}, "
            f"so num_speculative_tokens <= {MAX_TND_DECODE_QUERY_LEN - 1} (attention backend {attention_backend}; "
            f"source: {TND_DECODE_QUERY_LEN_SOURCE})")
