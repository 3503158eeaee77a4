"""Attention: the model's attention op, and the backends bound to backend names.

Theory of operation. Every attention layer calls ONE custom op,
``ascendgraph_attn::attention(query, key, value, out, layer_name)``. To the compiler it is
an opaque node (Dynamo compiles the model once for all sizes; piecewise splitting cuts the
graph at it) and it writes into ``out``, a buffer allocated by the graph piece before it,
so the piece after it reads a stable address when graphs replay.

At run time the op looks up the current forward context (`ascendgraph.forward_context`)
for the layer's backend, its KV cache and the batch's metadata, writes the new keys and
values into the paged cache (``reshape_and_cache``) and issues the FIA-like kernel
``paged_attention`` with *host* sequence lengths. Under a FULL-graph capture the kernel is
launched through `GraphParams.capture_attention` (external event + task group, docs/semantics.md
§7) so the engine can update the frozen lengths after each replay.

The op is registered as a *wrapper op* (docs/decisions.md "Attention under capture is a wrapper op"): a graph recorder
records the kernels it issues, with their host lists frozen by value, never the op
itself — so replay without a parameter update is stale, exactly as on an NPU.

Backends (`ATTENTION_IMPLS`) bind the names of `ascendgraph.models.backends` to an
implementation: ``ascend`` (ALWAYS), ``mla`` and the other UNIFORM_BATCH backends, and the
test-only ``never`` (NEVER). They share the kernel; their declared support drives mode
resolution, and each one refuses a FULL capture its support level does not allow (a
resolution or dispatch bug would otherwise pass silently).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch
from torch import Tensor

from ascendgraph import ops
from ascendgraph.dynamo_gate import defer_kernel_dynamo_guard
from ascendgraph.errors import CaptureConstraintError
from ascendgraph.forward_context import AttentionMetadata, ForwardContext, KVCache, get_forward_context
from ascendgraph.models.backends import AttentionBackendInfo, attention_backend_info
from ascendgraph.modes import AttentionGraphSupport, GraphMode

__all__ = [
    "ATTENTION_OP_NAMESPACE",
    "attention_op",
    "AttentionCall",
    "AttentionImpl",
    "ATTENTION_IMPLS",
    "attention_impl_for",
    "run_attention",
]

ATTENTION_OP_NAMESPACE = "ascendgraph_attn"


@dataclass
class AttentionCall:
    """One launch of the attention kernel: everything needed to issue it again.

    The tensors are the ones captured (static addresses); ``actual_seq_lengths`` and
    ``seq_lens`` are the host lists a captured graph freezes.
    """

    layer_name: str
    query: Tensor
    key_cache: Tensor
    value_cache: Tensor
    block_table: Tensor
    actual_seq_lengths: list[int]
    seq_lens: list[int]
    scale: float
    out: Tensor
    workspace: Optional[Tensor] = None  # `prepared()`: the kernel's scratch, made before the task group
    softmax_lse: Optional[Tensor] = None  # `prepared()`: the kernel's second output, likewise

    def prepared(self, workspace: Optional[Tensor] = None) -> "AttentionCall":
        """This call with its workspace and its softmax_lse allocated: what torch_npu's
        graph handler does in ``prepare_capture``, *before* graph_task_group_begin (and vLLM
        Ascend's ``full_graph_attention``: workspace, then ``softmax_lse = torch.empty(1, ...)``),
        so only the kernel task sits inside the group. ``out`` is the caller's already.
        ``workspace``: one made earlier for the same capture size (vLLM Ascend shares one per
        size across layers); None queries it."""
        if workspace is None:
            workspace = ops.attention_workspace(
                self.query, self.key_cache, self.value_cache, self.block_table,
                list(self.actual_seq_lengths), list(self.seq_lens), self.scale,
            )
        lse = torch.empty(1, dtype=self.query.dtype, device=self.query.device)
        return replace(self, workspace=workspace, softmax_lse=lse)

    def launch(
        self,
        actual_seq_lengths: Optional[list[int]] = None,
        seq_lens: Optional[list[int]] = None,
        block_table: Optional[Tensor] = None,
    ) -> None:
        """Issue the kernel, optionally with new host lengths / block table (a task update)."""
        ops.paged_attention(
            self.query,
            self.key_cache,
            self.value_cache,
            self.block_table if block_table is None else block_table,
            list(self.actual_seq_lengths if actual_seq_lengths is None else actual_seq_lengths),
            list(self.seq_lens if seq_lens is None else seq_lens),
            self.scale,
            self.out,
            self.workspace,
            self.softmax_lse,
        )


class AttentionImpl:
    """A backend: the graph support it declares and how it runs one layer."""

    def __init__(self, info: AttentionBackendInfo) -> None:
        self.info = info

    @property
    def name(self) -> str:
        return self.info.name

    @property
    def support(self) -> AttentionGraphSupport:
        return self.info.support

    def check_capture(self, context: ForwardContext, layer_name: str) -> None:
        """Refuse a FULL capture this backend's support level does not allow."""
        descriptor = context.batch_descriptor
        if self.support == AttentionGraphSupport.NEVER or (
            self.support < AttentionGraphSupport.ALWAYS and not descriptor.uniform
        ):
            raise CaptureConstraintError(
                f"attention backend {self.name!r} (support {self.support.name}) cannot be captured in a FULL "
                f"graph for batch {descriptor} (layer {layer_name}); resolution should have narrowed "
                "cudagraph_mode — this is an ascendgraph bug, please report it"
            )

    def forward(
        self,
        layer_name: str,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        out: Tensor,
        scale: float,
        kv_cache: KVCache,
        metadata: AttentionMetadata,
        context: ForwardContext,
    ) -> None:
        # Only the real tokens reach the KV write, as vLLM Ascend slices them
        # (vllm_ascend/attention/attention_v1.py reshape_and_cache: key[:num_actual_tokens]):
        # padding tokens carry slot -1, which the KV-write kernel must never see. (In a FULL
        # capture the slice is the capture size, frozen like vLLM Ascend's.)
        real = int(metadata.num_actual_tokens)
        slots = metadata.slot_mapping
        if 0 <= real < int(key.shape[0]):
            key, value, slots = key[:real], value[:real], slots[:real]
        ops.reshape_and_cache(key, value, kv_cache.key, kv_cache.value, slots)
        call = AttentionCall(
            layer_name=layer_name,
            query=query,
            key_cache=kv_cache.key,
            value_cache=kv_cache.value,
            block_table=metadata.block_table_for(len(metadata.query_start_loc)),
            actual_seq_lengths=list(metadata.query_start_loc),
            seq_lens=list(metadata.seq_lens),
            scale=scale,
            out=out,
        )
        device = context.device
        capturing_full = (
            context.runtime_mode is GraphMode.FULL
            and device is not None
            and device.is_current_stream_capturing()
        )
        if capturing_full:
            self.check_capture(context, layer_name)
            if context.graph_params is None:
                raise CaptureConstraintError(
                    f"FULL-graph capture of layer {layer_name} needs the engine's GraphParams in the forward "
                    "context (ForwardContext.graph_params); without them the frozen sequence lengths could "
                    "never be updated"
                )
            context.graph_params.capture_attention(context.batch_descriptor, call)
        else:
            call.launch()


ATTENTION_IMPLS: dict[str, type[AttentionImpl]] = {
    # All backends issue the same FIA-like kernel here; they differ in the support they declare.
    name: AttentionImpl
    for name in ("ascend", "mla", "sfa", "dsa", "gdn", "never")
}


def attention_impl_for(backend_name: str) -> AttentionImpl:
    """The implementation bound to a backend name (ConfigError for unknown names)."""
    info = attention_backend_info(backend_name)
    return ATTENTION_IMPLS[info.name](info)


# --------------------------------------------------------------------------- the op


def run_attention(query: Tensor, key: Tensor, value: Tensor, out: Tensor, layer_name: str) -> None:
    """The op's implementation (also registered as its wrapper-op implementation)."""
    context = get_forward_context()
    layer = context.attention_layers.get(layer_name)
    if layer is None:
        raise KeyError(
            f"attention layer {layer_name!r} is not in the forward context; pass the model's "
            "attention_layers in ForwardContext(attention_layers=model.attention_layers)"
        )
    if context.attn_metadata is None:
        raise RuntimeError(f"attention layer {layer_name} ran without attention metadata in the forward context")
    kv_cache = context.kv_caches[layer_name]
    layer.impl.forward(layer_name, query, key, value, out, layer.scale, kv_cache, context.attn_metadata, context)


@torch.library.custom_op(f"{ATTENTION_OP_NAMESPACE}::attention", mutates_args=("out",))
def attention_op(query: Tensor, key: Tensor, value: Tensor, out: Tensor, layer_name: str) -> None:
    """Paged attention of one layer into ``out`` (metadata and KV cache from the forward context)."""
    run_attention(query, key, value, out, layer_name)


@attention_op.register_fake
def _(query: Tensor, key: Tensor, value: Tensor, out: Tensor, layer_name: str) -> None:
    return None


defer_kernel_dynamo_guard(attention_op)
ops.register_wrapper_op(attention_op, run_attention)
