"""docs/semantics.md §11: xlite validation, architecture registry, token budget and per-batch routing."""

from __future__ import annotations

import pytest

from ascendgraph import GraphConfig, XliteConfigError
from ascendgraph.xlite import (
    XLITE_ARCHITECTURES,
    XliteRouter,
    validate_xlite,
    xlite_token_budget,
)


@pytest.mark.parametrize("kwargs, budget", [
    (dict(full_mode=False, max_num_seqs=16), 16),
    (dict(full_mode=False, max_num_seqs=16, num_speculative_tokens=1), 32),
    (dict(full_mode=True, max_num_seqs=16, max_num_batched_tokens=8192, tensor_parallel_size=4), 8192),
    (dict(full_mode=True, max_num_seqs=16, max_num_batched_tokens=1001, tensor_parallel_size=4), 1004),
    (dict(full_mode=True, max_num_seqs=16, max_num_batched_tokens=1001, tensor_parallel_size=1), 1001),
])
def test_token_budget(kwargs, budget):
    assert xlite_token_budget(**kwargs) == budget


DECODE_ONLY = dict(full_mode=False, budget=32)
FULL = dict(full_mode=True, budget=1024)

# id, router kwargs, route kwargs, expected route, reason fragment
ROUTING_TABLE = [
    ("decode-only dp1 decode", dict(DECODE_ONLY), dict(num_tokens=16, num_reqs=16), "xlite", "decode batch"),
    ("decode-only dp1 small prefill", dict(DECODE_ONLY), dict(num_tokens=20, num_reqs=2, has_prefill=True), "xlite", "prefill"),
    ("decode-only dp1 mixed within budget", dict(DECODE_ONLY), dict(num_tokens=30, num_reqs=5, has_prefill=True), "xlite", "fits"),
    ("decode-only dp1 over budget", dict(DECODE_ONLY), dict(num_tokens=33, num_reqs=33), "native", "exceed"),
    ("decode-only dp1 profile run", dict(DECODE_ONLY), dict(num_tokens=8192, num_reqs=256, is_profile_run=True), "native", "exceed"),
    ("decode-only dp2 decode", dict(DECODE_ONLY, data_parallel_size=2), dict(num_tokens=[8, 16], num_reqs=16), "xlite", "max over 2 DP ranks"),
    ("decode-only dp2 prefill", dict(DECODE_ONLY, data_parallel_size=2), dict(num_tokens=[20, 3], num_reqs=2, has_prefill=True),
     "native", "at most one token per request"),
    ("decode-only dp2 mixed", dict(DECODE_ONLY, data_parallel_size=2), dict(num_tokens=[12, 12], num_reqs=10, has_prefill=True),
     "native", "at most one token per request"),
    ("decode-only dp2 over budget", dict(DECODE_ONLY, data_parallel_size=2), dict(num_tokens=[40, 1], num_reqs=40), "native", "exceed"),
    ("decode-only dp2 profile run", dict(DECODE_ONLY, data_parallel_size=2), dict(num_tokens=[8192, 8192], num_reqs=256,
                                                                                is_profile_run=True), "native", "exceed"),
    ("full dp1 decode", dict(FULL), dict(num_tokens=64, num_reqs=64), "xlite", "decode"),
    ("full dp1 prefill", dict(FULL), dict(num_tokens=900, num_reqs=3, has_prefill=True), "xlite", "prefill"),
    ("full dp1 mixed", dict(FULL), dict(num_tokens=500, num_reqs=40, has_prefill=True), "xlite", "fits"),
    ("full dp1 over budget", dict(FULL), dict(num_tokens=1025, num_reqs=3), "native", "exceed"),
    ("full dp1 profile run", dict(FULL), dict(num_tokens=4096, num_reqs=256, is_profile_run=True), "xlite", "preallocated"),
    ("full dp2 decode", dict(FULL, data_parallel_size=2), dict(num_tokens=[64, 30], num_reqs=64), "xlite", "max over 2"),
    ("full dp2 prefill", dict(FULL, data_parallel_size=2), dict(num_tokens=[900, 4], num_reqs=3, has_prefill=True), "xlite", "prefill"),
    ("full dp2 mixed", dict(FULL, data_parallel_size=2), dict(num_tokens=[10, 500], num_reqs=40, has_prefill=True), "xlite", "fits"),
    ("full dp2 over budget (another rank is big)", dict(FULL, data_parallel_size=2), dict(num_tokens=[10, 2000], num_reqs=3),
     "native", "exceed"),
    ("full dp2 profile run", dict(FULL, data_parallel_size=2), dict(num_tokens=[8192, 8192], num_reqs=256, is_profile_run=True),
     "xlite", "preallocated"),
]


@pytest.mark.parametrize("router, batch, route, fragment", [c[1:] for c in ROUTING_TABLE], ids=[c[0] for c in ROUTING_TABLE])
def test_routing_table(router, batch, route, fragment):
    decided = XliteRouter(**router).route(batch.pop("num_tokens"), **batch)
    assert decided.route == route
    assert fragment in decided.reason


def test_routing_uses_the_maximum_over_dp_ranks():
    router = XliteRouter(full_mode=False, budget=32, data_parallel_size=2)
    assert router.route([1, 33], num_reqs=1).num_tokens == 33


@pytest.mark.parametrize("bad", [[], -1, [3, -2], [True], 2.5])
def test_routing_rejects_bad_token_counts(bad):
    with pytest.raises(ValueError):
        XliteRouter(full_mode=False, budget=8).route(bad, num_reqs=1)


def test_router_from_config_uses_the_budget_rule():
    config = GraphConfig.from_vllm_args(max_num_seqs=8, num_speculative_tokens=1,
                                        additional_config={"xlite_graph_config": {"enabled": True}})
    router = XliteRouter.from_config(config)
    assert (router.full_mode, router.budget) == (False, 16)
    config = GraphConfig.from_vllm_args(max_num_batched_tokens=1001, tensor_parallel_size=4,
                                        additional_config={"xlite_graph_config": {"enabled": True, "full_mode": True}})
    assert XliteRouter.from_config(config).budget == 1004


@pytest.mark.parametrize("architecture", sorted(XLITE_ARCHITECTURES))
def test_every_registered_architecture_validates(architecture):
    model = {"architectures": [architecture], "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
             "vocab_size": 100}
    config = GraphConfig.from_vllm_args(model=model, additional_config={"xlite_graph_config": {"enabled": True}})
    assert validate_xlite(config) == []


def test_registry_is_the_semantics_list():
    assert set(XLITE_ARCHITECTURES) == {
        "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Qwen3VLForConditionalGeneration",
        "Qwen3MoeForCausalLM", "Qwen3VLMoeForConditionalGeneration", "Glm4MoeForCausalLM", "DeepseekV3ForCausalLM",
        "DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "MiniMaxM2ForCausalLM"}


@pytest.mark.parametrize("architecture", ["MistralForCausalLM", "Gemma3ForCausalLM"])
def test_unregistered_architectures_are_rejected_verbatim(architecture):
    model = {"architectures": [architecture], "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2,
             "vocab_size": 100}
    config = GraphConfig.from_vllm_args(model=model, additional_config={"xlite_graph_config": {"enabled": True}})
    with pytest.raises(XliteConfigError) as info:
        validate_xlite(config)
    assert str(info.value) == f"{architecture} not supported!"


def test_validation_is_silent_when_xlite_is_off():
    config = GraphConfig.from_vllm_args(num_speculative_tokens=3, pipeline_parallel_size=2, block_size=256)
    assert validate_xlite(config) == []


def test_speculative_k1_is_allowed_and_block_size_warns():
    config = GraphConfig.from_vllm_args(num_speculative_tokens=1, block_size=256,
                                        additional_config={"xlite_graph_config": {"enabled": True}})
    warnings = validate_xlite(config)
    assert len(warnings) == 1 and "block_size" in warnings[0] and "128" in warnings[0]
