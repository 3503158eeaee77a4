"""What the Ascend kernels demand of their arguments: one table of rules, as data.

Theory of operation. Each `KernelRule` belongs to one torch_npu kernel (``kernel``, its
torch_npu name) and reads the kernel's arguments keyed by torch_npu's schema keyword
names (``query``, ``block_table``, ``actual_seq_lengths_kv``...). ``applies`` says whether
the rule's branch matches the call (page attention, TND, sparse_mode 3...), ``holds``
whether the call satisfies it and ``describe`` names the offending values. ``source``
cites where the rule comes from: the torch-npu 2.13.0 wheel's op documentation
(``torch_npu/_op_plugin_docs.py`` line), its registered schema, or vLLM Ascend's call site
(file@commit or pull request) where the wheel documents nothing (docs/decisions.md "Kernel contracts": where the docs and
vLLM Ascend's production calls disagree, vLLM Ascend wins and the rule is relaxed).

Two levels. The torch_npu rules above; and the rules our own ops imply
(``kernel="ascendgraph::paged_attention"`` ...), keyed by the op's argument names, for
what hw/'s mapping of the op onto the torch_npu call needs (cache layout, output like the
query). `ascendgraph.kernel_calls.kernel_calls(op, args, in_graph=...)` is that mapping,
written once so the simulator (which enforces the table) and hw/ (whose pre-checks use
it) agree on which torch_npu arguments an op call becomes. Eagerly hw passes attention only the real query
tokens (``query[:actual_seq_lengths[-1]]``); in a graph (capture or task update) the
whole captured query, so there ``T == actual_seq_lengths[-1]`` is the caller's job (the
FULL padding of `ascendgraph.forward_context.fia_padded_lengths`).

`check(kernel, arguments)` raises `KernelContractError` naming the rule, the values and
the source. The kernels' own error texts come from CANN's tiling code, which the wheel does
not ship; where vLLM Ascend's threads quote them (``CANN_TEXT_*``: PR #10769, issue #6076),
the rule's source quotes them too, so a card's message can be matched to the rule.
Rules read dtype, shape, contiguity and host lists, not tensor *values* (reading values
would be a host synchronisation inside a capture), except the MoE kernels' index rules
(`VALUE_READING_KERNELS`), which read expert ids and group lists where the tensor holds
values (eager calls; fake and meta tensors are passed over).

Layout. One module per kernel family, each holding its rules as a tuple and the named
predicates they use: `fused_attention` (v1), `fused_attention_v2`, `fused_semantics` (the
rules v1 and v2 share, and their argument readers written once over each kernel's argument
names, `FIA_ARGUMENTS` and `FIA_V2_ARGUMENTS`), `paged_attention` (the ``ascendgraph::`` op
level and ATB's paged attention), `kv_cache` (the KV writes), `norms`, `quantisation`,
`model_layers` (the kernels a model's own layers issue: rotary embedding, mrope, swiglu), `moe`
(vLLM Ascend's unquantised fused MoE: gating top-k, init routing v2, grouped matmul, token
un-permute). `common` holds what
they share (`KernelRule`, kernel names, dtype lists, sources, argument readers); `table`
assembles `RULES` in order and answers the lookups. Every public name is re-exported here:
import from ``ascendgraph.kernel_contracts``. A rule is a one-line lambda or a named,
documented function (tests/unit/test_kernel_contracts.py checks it).
"""

from ascendgraph.block_sizes import block_size_problem
from ascendgraph.errors import KernelContractError
from ascendgraph.kernel_contracts.common import (
    ADD_RMS_NORM,
    ADD_RMS_NORM_DYNAMIC_QUANT,
    ADD_RMS_NORM_QUANT,
    ATB_PAGED_ATTENTION,
    CANN_TEXT_BLOCK_TABLE,
    CANN_TEXT_KV_LENGTHS,
    CANN_TEXT_QUERY_T,
    DOCS,
    DYNAMIC_QUANT,
    FIA,
    FIA_MASK_SIZE,
    FIA_MAX_WORKSPACE,
    FIA_SPARSE_MODE,
    FIA_V2,
    HALF,
    MASK_DTYPES,
    NORM,
    PAGED_ATTENTION_OP,
    QUANTIZE,
    QUANT_OFFSET_DTYPES,
    QUANT_SCALE_DTYPES,
    RESHAPE_AND_CACHE,
    RMS_NORM,
    MROPE,
    ROTARY_EMBEDDING,
    SWIGLU,
    SCATTER_PA_KV_CACHE,
    SLOT_DTYPES,
    SRC_ADD_RMS_NORM,
    SRC_ATB_SIGNATURE,
    SRC_FIA_PAD,
    SRC_FIA_V2_CALL,
    SRC_PA_CALL,
    SRC_RESHAPE_CALL,
    SRC_ROPE_CALL,
    SRC_SCATTER_CALL,
    SRC_ZERO_KV,
    VA_COMMIT,
    VLLM_ASCEND,
    KernelRule,
)
from ascendgraph.kernel_contracts.fused_semantics import (
    FIA_ARGUMENTS,
    FIA_V2_ARGUMENTS,
    NON_TND_LAYOUTS,
    FusedArguments,
    SRC_OP_PLUGIN_FIA,
    SRC_TND_MASKED_MODE_0,
    SRC_WORKSPACE,
    V1_LAYOUTS,
    V2_LAYOUTS,
)
from ascendgraph.kernel_contracts.moe import (
    C_ASCEND_GATING_TOP_K,
    GATING_TOP_K,
    GROUPED_MATMUL,
    INIT_ROUTING_V2,
    TOKEN_UNPERMUTE,
    VALUE_READING_KERNELS,
)
from ascendgraph.kernel_contracts.table import (
    CONFIG_RULES,
    FLOAT32_LENIENT_RULES,
    KERNELS,
    RULES,
    SIMULATOR_MODEL_RULES,
    check,
    message,
    rules_for,
    violations,
)

__all__ = [
    "KernelRule",
    "KernelContractError",
    "RULES",
    "KERNELS",
    "FLOAT32_LENIENT_RULES",
    "VALUE_READING_KERNELS",
    "violations",
    "check",
    "message",
    "rules_for",
    "block_size_problem",
    "FIA",
    "FIA_MASK_SIZE",
    "FIA_SPARSE_MODE",
    "CONFIG_RULES",
    "SIMULATOR_MODEL_RULES",
    "ADD_RMS_NORM",
    "ADD_RMS_NORM_DYNAMIC_QUANT",
    "ADD_RMS_NORM_QUANT",
    "ATB_PAGED_ATTENTION",
    "CANN_TEXT_BLOCK_TABLE",
    "CANN_TEXT_KV_LENGTHS",
    "CANN_TEXT_QUERY_T",
    "DOCS",
    "DYNAMIC_QUANT",
    "FIA_MAX_WORKSPACE",
    "FIA_V2",
    "HALF",
    "MASK_DTYPES",
    "NON_TND_LAYOUTS",
    "FusedArguments",
    "FIA_ARGUMENTS",
    "FIA_V2_ARGUMENTS",
    "NORM",
    "PAGED_ATTENTION_OP",
    "QUANTIZE",
    "QUANT_OFFSET_DTYPES",
    "QUANT_SCALE_DTYPES",
    "RESHAPE_AND_CACHE",
    "RMS_NORM",
    "MROPE",
    "ROTARY_EMBEDDING",
    "SWIGLU",
    "SCATTER_PA_KV_CACHE",
    "SLOT_DTYPES",
    "SRC_ADD_RMS_NORM",
    "SRC_ATB_SIGNATURE",
    "SRC_FIA_PAD",
    "SRC_FIA_V2_CALL",
    "SRC_OP_PLUGIN_FIA",
    "SRC_PA_CALL",
    "SRC_RESHAPE_CALL",
    "SRC_ROPE_CALL",
    "SRC_SCATTER_CALL",
    "SRC_TND_MASKED_MODE_0",
    "SRC_WORKSPACE",
    "SRC_ZERO_KV",
    "V1_LAYOUTS",
    "V2_LAYOUTS",
    "VA_COMMIT",
    "VLLM_ASCEND",
    "C_ASCEND_GATING_TOP_K",
    "GATING_TOP_K",
    "GROUPED_MATMUL",
    "INIT_ROUTING_V2",
    "TOKEN_UNPERMUTE",
]
