"""Models built from presets: seeded weights, paged KV cache, backends, chunked = whole prefill."""

from __future__ import annotations

import pytest
import torch

from ascendgraph.dispatch import BatchDescriptor
from ascendgraph.errors import CaptureConstraintError, ConfigError
from ascendgraph.forward_context import (
    AttentionMetadata,
    ForwardContext,
    NoForwardContext,
    current_forward_context,
    get_forward_context,
    set_forward_context,
)
from ascendgraph.models.attention import ATTENTION_IMPLS, attention_impl_for
from ascendgraph.models.backends import ATTENTION_BACKENDS
from ascendgraph.models.build import build_model, parse_dtype
from ascendgraph.models.presets import PRESETS
from ascendgraph.modes import AttentionGraphSupport, GraphMode

BLOCK = 128  # prefills (Q_S > 1) take a multiple of 128 (op docs :8219)


@pytest.fixture(autouse=True)
def _float32_declared_lenient():
    """These models are float32 (exact comparisons): the simulator's declared float32 leniency (docs/decisions.md)."""
    from sim import kernels as sim_kernels

    with sim_kernels.contract_policy(sim_kernels.ContractPolicy.from_options(allow_float32_attention=True,
                                                                            lazy_kernel_init=False)):
        yield


@pytest.fixture(scope="module", autouse=True)
def _kernels_and_one_thread():
    import sim  # noqa: F401

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _run(model, caches, token_ids, positions, ends, seq_lens, tables, slots) -> torch.Tensor:
    metadata = AttentionMetadata(
        num_reqs=len(ends), num_actual_tokens=len(token_ids), num_tokens=len(token_ids),
        query_start_loc=ends, seq_lens=seq_lens, block_table=torch.tensor(tables, dtype=torch.int32),
        slot_mapping=torch.tensor(slots),
    )
    context = ForwardContext(GraphMode.NONE, BatchDescriptor(len(token_ids)), metadata, caches, model.attention_layers)
    with torch.no_grad(), set_forward_context(context):
        return model(torch.tensor(token_ids), torch.tensor(positions))


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-mla", "tiny-moe"])
def test_weights_are_a_function_of_the_seed(preset):
    spec = PRESETS[preset].with_layers(1)
    a, b, c = build_model(spec, seed=1), build_model(spec, seed=1), build_model(spec, seed=2)
    for (name, pa), (_, pb), (_, pc) in zip(a.named_parameters(), b.named_parameters(), c.named_parameters()):
        assert torch.equal(pa, pb), name
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


@pytest.mark.parametrize("preset", ["tiny", "tiny-llama", "tiny-mla", "tiny-moe"])
def test_prefill_in_chunks_equals_prefill_at_once_through_the_paged_cache(preset):
    """Two requests packed in one batch, then the same prompts fed in two chunks: the KV cache
    carries the context between chunks, so the hidden states agree."""
    model = build_model(PRESETS[preset].with_layers(2), seed=0)
    prompt_a, prompt_b = list(range(3, 23)), list(range(40, 46))
    tables = [[0, 1], [2, 3]]
    slots_a = list(range(20))
    slots_b = [2 * BLOCK + i for i in range(6)]
    whole = _run(model, model.make_kv_caches(4, BLOCK), prompt_a + prompt_b, list(range(20)) + list(range(6)),
                 [20, 26], [20, 6], tables, slots_a + slots_b)
    caches = model.make_kv_caches(4, BLOCK)
    first = _run(model, caches, prompt_a[:12] + prompt_b[:2], list(range(12)) + [0, 1], [12, 14], [12, 2],
                 tables, slots_a[:12] + slots_b[:2])
    second = _run(model, caches, prompt_a[12:] + prompt_b[2:], list(range(12, 20)) + list(range(2, 6)), [8, 12],
                  [20, 6], tables, slots_a[12:] + slots_b[2:])
    chunked = torch.cat([first[:12], second[:8], first[12:], second[8:]])
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)


def test_mla_caches_one_latent_per_token_and_mha_caches_kv_heads():
    mha = build_model(PRESETS["tiny"].with_layers(1)).make_kv_caches(3, BLOCK)
    mla = build_model(PRESETS["tiny-mla"].with_layers(1)).make_kv_caches(3, BLOCK)
    spec = PRESETS["tiny-mla"]
    assert next(iter(mha.values())).key.shape == (3, BLOCK, 2, 128)
    assert next(iter(mla.values())).key.shape == (3, BLOCK, 1, spec.kv_lora_rank + spec.qk_rope_head_dim)


def test_every_backend_name_is_bound_to_an_implementation_with_its_declared_support():
    assert set(ATTENTION_IMPLS) == set(ATTENTION_BACKENDS)
    for name, info in ATTENTION_BACKENDS.items():
        assert attention_impl_for(name).support == info.support
    assert attention_impl_for("ascend").support == AttentionGraphSupport.ALWAYS
    assert attention_impl_for("mla").support == AttentionGraphSupport.UNIFORM_BATCH
    assert attention_impl_for("never").support == AttentionGraphSupport.NEVER
    with pytest.raises(ConfigError, match="unknown attention backend"):
        attention_impl_for("flash")


@pytest.mark.parametrize(
    "backend, descriptor, refused",
    [
        ("ascend", BatchDescriptor(8, 8, False), False),
        ("mla", BatchDescriptor(8, 8, True), False),
        ("mla", BatchDescriptor(8, 8, False), True),
        ("never", BatchDescriptor(8, 8, True), True),
    ],
)
def test_a_backend_refuses_full_captures_its_support_does_not_allow(backend, descriptor, refused):
    impl = attention_impl_for(backend)
    context = ForwardContext(GraphMode.FULL, descriptor, None, {})
    if refused:
        with pytest.raises(CaptureConstraintError, match="cannot be captured in a FULL graph"):
            impl.check_capture(context, "layer0")
    else:
        impl.check_capture(context, "layer0")


def test_bfloat16_models_keep_the_rope_cache_in_float32():
    model = build_model(PRESETS["tiny"].with_layers(1), dtype="bfloat16")
    assert model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.layers[0].self_attn.rotary.cos_sin_cache.dtype == torch.float32
    assert parse_dtype("float32") is torch.float32
    with pytest.raises(ConfigError, match="dtype"):
        parse_dtype("float16")


def test_the_forward_context_is_scoped_and_required():
    assert current_forward_context() is None
    with pytest.raises(NoForwardContext, match="set_forward_context"):
        get_forward_context()
    outer = ForwardContext(GraphMode.NONE, BatchDescriptor(1), None, {})
    inner = ForwardContext(GraphMode.FULL, BatchDescriptor(2), None, {})
    with set_forward_context(outer):
        with set_forward_context(inner):
            assert get_forward_context() is inner
        assert get_forward_context() is outer
    assert current_forward_context() is None


def test_attention_outside_a_forward_context_says_what_to_do():
    model = build_model(PRESETS["tiny"].with_layers(1))
    with pytest.raises(NoForwardContext, match="set_forward_context"), torch.no_grad():
        model(torch.tensor([1, 2]), torch.tensor([0, 1]))


# --------------------------------------------------------------------------- lazily zeroed KV caches


def test_zeros_on_first_touch_is_torch_zeros_on_every_path():
    from ascendgraph.models.build import LAZY_ZEROS_MIN_BYTES, zeros_on_first_touch

    large = (LAZY_ZEROS_MIN_BYTES // 2 + 3, 2)  # bfloat16: just over the threshold, not a page multiple
    for shape, device in [(large, "cpu"), ((4, 4), "cpu"), (large, "meta")]:
        made = zeros_on_first_touch(shape, torch.bfloat16, torch.device(device))
        want = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        assert (made.shape, made.dtype, made.device, made.stride()) == (want.shape, want.dtype, want.device, want.stride())
        if device == "cpu":
            assert torch.equal(made, want)
    cache = zeros_on_first_touch(large, torch.float32, torch.device("cpu"))
    cache[7].fill_(2.0)  # writable, and a slice outlives the name of its base
    row = cache[7]
    del cache
    assert row.tolist() == [2.0, 2.0]


def test_a_kv_cache_holds_no_resident_memory_until_written():
    import gc
    import os

    if not os.path.exists("/proc/self/statm"):
        pytest.skip("resident memory is read from /proc (Linux)")

    def resident_bytes() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    model = build_model(PRESETS["tiny"].with_layers(1), dtype=torch.bfloat16)
    gc.collect()
    before = resident_bytes()
    caches = model.make_kv_caches(num_blocks=256, block_size=128)  # 32 MiB of keys and values
    grown = resident_bytes() - before
    assert model.kv_cache_bytes(256, 128) == 32 * 2**20
    assert grown < 8 * 2**20
    (cache,) = caches.values()
    assert torch.count_nonzero(cache.key) == 0 and torch.count_nonzero(cache.value) == 0


def test_padding_tokens_never_reach_the_kv_write(monkeypatch) -> None:
    # vLLM Ascend slices key, value and slot_mapping to the real tokens before the KV write
    # (attention_v1.py reshape_and_cache: key[:num_actual_tokens]); the -1 slots of padding
    # tokens must not reach the ATB kernel (issue 24).
    import torch as _torch

    from ascendgraph import ops as ag_ops
    from ascendgraph.dispatch import BatchDescriptor
    from ascendgraph.models.attention import attention_impl_for
    from ascendgraph.modes import GraphMode as _Mode
    from ascendgraph.forward_context import AttentionMetadata, ForwardContext, KVCache

    written: list[_torch.Tensor] = []
    monkeypatch.setattr(ag_ops, "reshape_and_cache", lambda k, v, kc, vc, slots: written.append(slots.clone()))
    monkeypatch.setattr(ag_ops, "paged_attention", lambda *args: None)
    tokens, real = 4, 2
    metadata = AttentionMetadata(
        num_reqs=2, num_actual_tokens=real, num_tokens=tokens, query_start_loc=[1, 2], seq_lens=[3, 5],
        block_table=_torch.zeros(3, 1, dtype=_torch.int32), slot_mapping=_torch.tensor([5, 9, -1, -1]),
        uniform_decode=True, query_len=1,
    )
    cache = KVCache(_torch.zeros(2, 16, 1, 8), _torch.zeros(2, 16, 1, 8))
    q, k = _torch.zeros(tokens, 2, 8), _torch.zeros(tokens, 1, 8)
    context = ForwardContext(_Mode.NONE, BatchDescriptor(tokens), metadata, {"l": cache})
    attention_impl_for("ascend").forward("l", q, k, k.clone(), _torch.empty_like(q), 0.35, cache, metadata, context)
    assert [s.tolist() for s in written] == [[5, 9]]
