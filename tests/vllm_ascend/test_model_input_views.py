"""vLLM Ascend's attention kernels called with the tensors vLLM's models hand them: views, not
fresh buffers.

A model's attention projects q, k and v in one matmul and splits the result by columns
(vLLM 0.27.1 ``model_executor/models/gpt_oss.py:174-177``, ``OAIAttention.forward``:
``qkv.split([q_size, kv_size, kv_size], dim=-1)``), so each part is a column slice of one
``[T, q_size + 2 * kv_size]`` tensor. The rotary embedding returns fresh query and key
tensors (vLLM Ascend ``ops/rotary_embedding.py:183-186`` at 182b75ea: ``npu_mrope`` on
``.contiguous()`` inputs; with Triton ``ops/triton/rope.py:266-269`` copies them first); the
value goes on as the slice. vLLM's ``Attention.forward`` then views each as
``[T, heads, head_size]`` (``model_executor/layers/attention/attention.py:536-541``), which
keeps the value's row stride of the whole qkv row: a non-contiguous view. The fused-attention
op docs refuse non-contiguous query/key/value (torch-npu 2.13.0 ``_op_plugin_docs.py``
8589-8593 for v2), so vLLM Ascend must copy them before the kernel.

Here vLLM Ascend's own ``AscendAttentionBackendImpl.forward`` runs eagerly on a prefill of
fresh requests (``PrefillNoCache``, where ``forward_fused_infer_attention`` hands the step's
own key and value to the kernel: attention_v1.py:1363-1373 at 182b75ea) with those views. A
layer with learnable sinks (GPT-OSS: ``gpt_oss.py:111-113``, every other layer sliding,
157) takes ``npu_fused_infer_attention_score_v2`` (attention_v1.py:1375-1400), whose
``key.contiguous(), value.contiguous()`` are vllm-project/vllm-ascend#13456's fix; without
them ``v2_contiguous`` refuses the call.

An MLA layer builds its key and value the same way, as the two column parts of ``kv_b_proj``'s
output, and broadcasts its one-head ``k_pe`` over the heads: ``AscendMLAImpl._forward_prefill``
copies key, value and key_rope before ``npu_fused_infer_attention_score``
(vllm-project/vllm-ascend#11790); without the copies ``kv_contiguous`` and ``rope_contiguous``
refuse the call.
"""

from __future__ import annotations

import math

import harness

harness.require()

import pytest  # noqa: E402
import torch  # noqa: E402

import vllm_ascend.ops  # noqa: E402,F401  (before attention_v1, as the model runner imports it)
from sim import facade  # noqa: E402

Q_SIZE, KV_SIZE = harness.HEADS * harness.HEAD_DIM, harness.KV_HEADS * harness.HEAD_DIM
LAYER = harness.LAYER_NAMES[0]
# Two fresh prompts: nothing computed, nothing cached (the builder's state PrefillNoCache).
PROMPTS = [5, 9]
GPT_OSS_SLIDING_WINDOW = 128  # gpt-oss's config.json "sliding_window"; the prompts are shorter


@pytest.fixture(autouse=True)
def fresh() -> None:
    facade.configure()
    harness.reset_vllm_ascend_state()


def model_inputs(tokens: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(query, key, value) as vLLM's Attention.forward hands them to the backend, and the qkv
    projection they come from: query and key the rotary embedding's fresh tensors, value a
    column slice of qkv (the module docstring cites the lines)."""
    generator = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(tokens, Q_SIZE + 2 * KV_SIZE, generator=generator) / 2).to(torch.bfloat16).to(harness.DEVICE)
    q, k, v = qkv.split([Q_SIZE, KV_SIZE, KV_SIZE], dim=-1)
    q, k = q.contiguous(), k.contiguous()  # what the rotary embedding returns (no rotation: positions play no part here)
    query = q.view(-1, harness.HEADS, harness.HEAD_DIM)
    key = k.view(-1, harness.KV_HEADS, harness.HEAD_DIM)
    value = v.view(-1, harness.KV_HEADS, harness.HEAD_DIM)
    return query, key, value, qkv


def reference(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Causal GQA attention per prompt with one learnable sink logit per query head (the v2 op
    doc's learnable_sink: an extra softmax column that adds no value), in float32."""
    q, k, v, s = (t.cpu().float() for t in (query, key, value, sinks))
    per_kv = harness.HEADS // harness.KV_HEADS
    out = torch.empty_like(q)
    start = 0
    for length in PROMPTS:
        rows = slice(start, start + length)
        kh = k[rows].repeat_interleave(per_kv, dim=1).transpose(0, 1)  # [N, S, D]
        vh = v[rows].repeat_interleave(per_kv, dim=1).transpose(0, 1)
        scores = q[rows].transpose(0, 1) @ kh.transpose(1, 2) / math.sqrt(harness.HEAD_DIM)  # [N, S, S]
        scores = scores.masked_fill(torch.ones(length, length, dtype=torch.bool).triu(1), float("-inf"))
        logits = torch.cat([scores, s.view(-1, 1, 1).expand(-1, length, 1)], dim=-1)
        weights = logits.softmax(dim=-1)[..., :length]
        out[rows] = (weights @ vh).transpose(0, 1)
        start += length
    return out


@pytest.mark.parametrize("sliding_window", [None, GPT_OSS_SLIDING_WINDOW], ids=["full", "sliding"])
def test_a_sinks_prefill_takes_the_models_qkv_column_slices_to_fia_v2(sliding_window: object) -> None:
    config = harness.vllm_config("FULL_DECODE_ONLY")  # its graphs hold decodes only: a prefill runs eagerly
    builder = harness.metadata_builder(harness.builder_config("FULL_DECODE_ONLY"))
    sinks = torch.linspace(-1, 1, harness.HEADS).to(torch.bfloat16).to(harness.DEVICE)
    layer = harness.Layer(LAYER, config, seed=3, sinks=sinks, sliding_window=sliding_window)
    tokens = sum(PROMPTS)
    query, key, value, qkv = model_inputs(tokens, seed=5)
    assert query.is_contiguous() and key.is_contiguous()
    assert not value.is_contiguous() and value.stride(0) == qkv.shape[1]  # the model's view, as passed
    slot_buffer = torch.full((tokens,), harness.PAD_SLOT_ID, dtype=torch.int32, device=harness.DEVICE)
    step = harness.Step(PROMPTS, PROMPTS, state="PrefillNoCache")
    metadata = step.metadata(builder, slot_buffer)
    assert metadata.attn_state.name == "PrefillNoCache"
    output = torch.zeros(tokens, harness.HEADS, harness.HEAD_DIM, dtype=torch.bfloat16, device=harness.DEVICE)

    log = harness.KernelLog()
    with log.recording(), harness.forward_context(config, {LAYER: metadata}, "NONE", tokens, sinks=True):
        layer.impl.forward(layer.module, query, key, value, layer.kv_cache, metadata, output=output)
        torch.npu.synchronize()  # the queued kernels have run (and been checked) before the log closes

    assert set(log.kernels()) == {"npu_scatter_pa_kv_cache", "npu_fused_infer_attention_score_v2"}
    assert log.violations() == []
    attention = dict(log.calls)["npu_fused_infer_attention_score_v2"]
    assert attention["block_table"] is None and attention["sparse_mode"] == (3 if sliding_window is None else 4)
    expected = reference(query, key, value, sinks)
    torch.testing.assert_close(output.cpu().float(), expected, atol=2e-2, rtol=2e-2)
    # The KV write took the same views: the cache holds the step's key and value at its slots.
    slots = torch.tensor(step.slots())
    blocks, offsets = slots // harness.BLOCK_SIZE, slots % harness.BLOCK_SIZE
    cache = layer.kv_cache.cpu()
    assert torch.equal(cache[0, blocks, offsets], key.cpu()) and torch.equal(cache[1, blocks, offsets], value.cpu())


# --------------------------------------------------------------------------- MLA prefill
# A DeepSeek-V2-Lite-like MLA layer: 16 heads (a power of two: no head padding, so the rope parts
# go to the kernel as query_rope / key_rope, mla_v1.py:1272-1278), nope and value D 128, rope D 64.
MLA_HEADS, NOPE, ROPE, V_DIM, KV_LORA = 16, 128, 64, 128, 512
MLA_LAYER = "model.layers.0.self_attn.attn"


def mla_impl() -> object:
    """vLLM Ascend's AscendMLAImpl as vLLM's MLAAttention builds it (vLLM 0.27.1
    model_executor/layers/attention/mla_attention.py:487-507: head_size kv_lora_rank +
    qk_rope_head_dim, one KV head); the projections it owns are not called by _forward_prefill."""
    from vllm.config import set_current_vllm_config
    from vllm_ascend.attention.mla_v1 import AscendMLAImpl

    with set_current_vllm_config(harness.builder_config("FULL_DECODE_ONLY")):
        return AscendMLAImpl(MLA_HEADS, KV_LORA + ROPE, (NOPE + ROPE) ** -0.5, 1, None, None, "auto", None, "decoder",
                             None, q_lora_rank=None, kv_lora_rank=KV_LORA, qk_nope_head_dim=NOPE,
                             qk_rope_head_dim=ROPE, qk_head_dim=NOPE + ROPE, v_head_dim=V_DIM, rotary_emb=None,
                             q_proj=None, kv_b_proj=None, o_proj=None, layer_name=MLA_LAYER)


def mla_prefill_inputs(tokens: int, seed: int) -> dict[str, torch.Tensor]:
    """What AscendMLAImpl.mla_preprocess_prefill hands _forward_prefill (mla_v1.py:1582-1602 at
    182b75ea): q_nope a column slice of the query projection viewed per head (1585-1587); q_pe
    npu_interleave_rope's fresh output (rope_single, 1361-1371); k_nope and value the two column
    parts of kv_b_proj's output viewed per head (1596-1599); k_pe npu_kv_rmsnorm_rope_cache's
    one-head output broadcast over the heads (1600-1601: a stride-0 view)."""
    generator = torch.Generator().manual_seed(seed)

    def device(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) / 2).to(torch.bfloat16).to(harness.DEVICE)

    prefill_q = device(tokens, MLA_HEADS * (NOPE + ROPE)).view(-1, MLA_HEADS, NOPE + ROPE)
    kv_nope = device(tokens, MLA_HEADS * (NOPE + V_DIM)).view(-1, MLA_HEADS, NOPE + V_DIM)
    k_nope, value = kv_nope.split([NOPE, V_DIM], dim=-1)
    k_pe = device(tokens, 1, ROPE).expand(tokens, MLA_HEADS, ROPE)
    return dict(q_nope=prefill_q[..., :NOPE], q_pe=device(tokens, MLA_HEADS, ROPE), k_nope=k_nope, k_pe=k_pe,
                value=value)


def test_an_mla_prefill_hands_the_fused_attention_contiguous_key_value_and_key_rope() -> None:
    # AscendMLAImpl._forward_prefill (mla_v1.py:1224-1300) copies key, value and key_rope before
    # npu_fused_infer_attention_score (1277-1282: vllm-project/vllm-ascend#11790's fix; the op doc
    # refuses them non-contiguous, :8066-8071 and :8105-8106). Its query, q_nope, goes as the
    # model's column slice: the op doc refuses that too (:8065), which is all the simulator
    # refuses here — an open finding (docs/vllm-ascend.md), pinned below.
    from ascendgraph.errors import KernelContractError
    from vllm_ascend.attention.attention_mask import AttentionMaskBuilder
    from vllm_ascend.attention.mla_v1 import AscendMLAMetadata, AscendMLAPrefillMetadata

    impl = mla_impl()
    tokens = sum(PROMPTS)
    inputs = mla_prefill_inputs(tokens, seed=7)
    assert not any(inputs[name].is_contiguous() for name in ("q_nope", "k_nope", "value", "k_pe"))
    # The prefill metadata as AscendMLAMetadataBuilder.build_prefill_metadata makes it
    # (mla_v1.py:538-573): the split-fuse mask and the cumulative query lengths are what
    # _forward_prefill reads; no chunked context (fresh prompts: _compute_prefill_context returns).
    ends = torch.tensor(PROMPTS).cumsum(0).tolist()
    prefill = AscendMLAPrefillMetadata(
        attn_mask=AttentionMaskBuilder(torch.device(harness.DEVICE)).get_splitfuse_attn_mask(),
        query_lens=torch.tensor(PROMPTS, dtype=torch.int32), seq_lens=list(PROMPTS), context_lens=None,
        input_positions=None, query_start_loc=torch.tensor([0, *ends]), block_table=None,
        max_query_len=max(PROMPTS), max_seq_lens=max(PROMPTS), chunked_context=None, actual_seq_lengths_q=ends)
    metadata = AscendMLAMetadata.__new__(AscendMLAMetadata)
    metadata.prefill = prefill
    log = harness.KernelLog()
    with log.recording(), pytest.raises(KernelContractError) as refused:
        impl._forward_prefill(inputs["q_nope"], inputs["q_pe"], inputs["k_nope"], inputs["k_pe"], inputs["value"],
                              (None, None), metadata)

    assert refused.value.rules == ("query_contiguous",), str(refused.value)
    (name, call), = log.calls  # the refusal comes from the call's shape-and-stride check, before it runs
    assert name == "npu_fused_infer_attention_score" and call["input_layout"] == "TND"
    assert call["query"].stride() == inputs["q_nope"].stride()  # the model's slice, as passed
    for argument, source in (("key", "k_nope"), ("value", "value"), ("key_rope", "k_pe"), ("query_rope", "q_pe")):
        assert call[argument].shape == inputs[source].shape and call[argument].is_contiguous(), argument
