"""GraphConfig parsing from vLLM-style arguments: accepted keys, warnings, and bad input."""

from __future__ import annotations

import json

import pytest

from ascendgraph import CompilationMode, ConfigError, GraphConfig, GraphMode
from ascendgraph.models.presets import PRESETS, model_spec_from


def test_defaults_match_vllm():
    c = GraphConfig()
    assert (c.max_num_seqs, c.max_num_batched_tokens, c.block_size, c.soc, c.optimization_level) == (256, 8192, 128, "A2", 2)
    assert c.cudagraph_mode is None and c.model.name == "tiny"
    assert c.ascend_compilation_config.enable_npugraph_ex and not c.ascend_compilation_config.enable_static_kernel
    assert c.ascend_compilation_config.super_kernel is False


def test_json_strings_and_dicts_are_equivalent():
    a = GraphConfig.from_vllm_args(compilation_config='{"cudagraph_mode": "full_decode_only", "cudagraph_capture_sizes": [4, 1]}')
    b = GraphConfig.from_vllm_args(compilation_config={"cudagraph_mode": "FULL_DECODE_ONLY", "cudagraph_capture_sizes": [4, 1]})
    assert a == b
    assert a.cudagraph_mode is GraphMode.FULL_DECODE_ONLY and a.cudagraph_capture_sizes == (4, 1)


@pytest.mark.parametrize("key, value, expected", [
    ("mode", 3, CompilationMode.VLLM_COMPILE), ("level", "NONE", CompilationMode.NONE),
    ("mode", "stock_torch_compile", CompilationMode.STOCK_TORCH_COMPILE)])
def test_compilation_mode_and_legacy_level(key, value, expected):
    assert GraphConfig.from_vllm_args(compilation_config={key: value}).compilation_mode is expected


def test_invalid_json_names_the_flag_and_the_position():
    with pytest.raises(ConfigError) as info:
        GraphConfig.from_vllm_args(compilation_config='{"cudagraph_mode": FULL}')
    message = str(info.value)
    assert "--compilation-config" in message and "line 1 column 20" in message


def test_json_that_is_not_an_object_is_rejected():
    with pytest.raises(ConfigError, match="must be a JSON object"):
        GraphConfig.from_vllm_args(additional_config="[1, 2]")


def test_unknown_compilation_key_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown --compilation-config key 'cudagraph_modes'; did you mean 'cudagraph_mode'\?"):
        GraphConfig.from_vllm_args(compilation_config={"cudagraph_modes": "FULL"})


def test_real_but_unmodelled_compilation_keys_warn():
    c = GraphConfig.from_vllm_args(compilation_config={"compile_sizes": [1], "pass_config": {}})
    assert len(c.parse_warnings) == 2
    assert all("ascendgraph ignores it" in w for w in c.parse_warnings)


def test_unknown_engine_argument_suggests_the_closest():
    with pytest.raises(ConfigError, match="did you mean 'max_num_seqs'"):
        GraphConfig.from_vllm_args(max_num_seq=4)


def test_additional_config_accepts_any_top_level_key_with_a_warning():
    c = GraphConfig.from_vllm_args(additional_config={"refresh": True, "enable_shared_expert_dp": True})
    assert c.enable_shared_expert_dp
    assert any("'refresh' is not modelled" in w for w in c.parse_warnings)


def test_unknown_keys_inside_ascend_compilation_config_warn():
    c = GraphConfig.from_vllm_args(additional_config={"ascend_compilation_config": {"enable_npugraph": False}})
    assert any("unknown key 'enable_npugraph'" in w and "enable_npugraph_ex" in w for w in c.parse_warnings)
    assert c.ascend_compilation_config.enable_npugraph_ex


def test_sub_config_values_must_be_booleans():
    with pytest.raises(ConfigError, match="enable_static_kernel must be true or false"):
        GraphConfig.from_vllm_args(additional_config={"ascend_compilation_config": {"enable_static_kernel": "yes"}})


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(max_num_seqs=-1), "max_num_seqs must be an integer >= 1, got -1"),
    (dict(max_num_seqs=True), "max_num_seqs must be an integer"),
    (dict(max_num_batched_tokens="8192"), "max_num_batched_tokens must be an integer"),
    (dict(tensor_parallel_size=0), "tensor_parallel_size must be an integer >= 1, got 0"),
    (dict(num_speculative_tokens=-2), "num_speculative_tokens must be an integer >= 0"),
    (dict(enforce_eager="yes"), "enforce_eager must be true or false"),
    (dict(soc="B9"), "soc must be one of A2, A3, 310P, A5"),
    (dict(attention_backend="flash"), "unknown attention backend 'flash'"),
    (dict(compilation_config={"cudagraph_capture_sizes": [4, -8]}), "entries must be integers >= 1, got -8"),
    (dict(compilation_config={"cudagraph_capture_sizes": 8}), "must be a list of integers"),
    (dict(compilation_config={"max_cudagraph_capture_size": 0}), "max_cudagraph_capture_size must be an integer >= 1"),
    (dict(compilation_config={"cudagraph_mode": "FAST"}), "invalid cudagraph_mode 'FAST'"),
    (dict(max_num_seqs=10**9), "larger than ascendgraph supports"),
    (dict(optimization_level=7), "optimization_level must be 0, 1, 2 or 3"),
    (dict(optimization_level="\u00b9"), "optimization_level must be 0, 1, 2 or 3"),  # '¹'.isdigit() is True
    (dict(model="no-such-model"), "unknown model 'no-such-model'"),
    (dict(num_layers=0), "num_layers must be an integer >= 1"),
])
def test_bad_values_are_config_errors_naming_the_key(kwargs, fragment):
    with pytest.raises(ConfigError) as info:
        GraphConfig.from_vllm_args(**kwargs)
    assert fragment in str(info.value)


@pytest.mark.parametrize("level, expected", [("O3", 3), ("0", 0), (1, 1), ("o2", 2)])
def test_optimization_level_spellings(level, expected):
    assert GraphConfig.from_vllm_args(optimization_level=level).optimization_level == expected


def test_speculative_config_json():
    c = GraphConfig.from_vllm_args(speculative_config='{"method": "mtp", "num_speculative_tokens": 2}')
    assert c.num_speculative_tokens == 2 and c.uniform_decode_query_len == 3


def test_model_from_preset_dict_and_config_json(tmp_path):
    assert model_spec_from("tiny-mla").attention == "mla"
    raw = {"architectures": ["Qwen3MoeForCausalLM"], "num_hidden_layers": 48, "hidden_size": 2048,
           "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
           "vocab_size": 151936, "num_experts": 128, "num_experts_per_tok": 8, "rms_norm_eps": 1e-6}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    for source in (raw, str(path), str(tmp_path)):
        c = GraphConfig.from_vllm_args(model=source, num_layers=3)
        assert c.model.architecture == "Qwen3MoeForCausalLM" and c.model.is_moe and c.num_hidden_layers == 3


def test_bad_config_json_file_names_the_file(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["X"],')
    with pytest.raises(ConfigError, match="invalid JSON at line 1"):
        GraphConfig.from_vllm_args(model=str(path))
    path.write_text('{"architectures": ["X"]}')
    with pytest.raises(ConfigError, match="missing 'num_hidden_layers'"):
        GraphConfig.from_vllm_args(model=str(path))


def test_presets_match_the_interfaces_table():
    tiny = PRESETS["tiny"]
    assert (tiny.architecture, tiny.num_hidden_layers, tiny.hidden_size, tiny.num_attention_heads, tiny.head_dim,
            tiny.num_key_value_heads, tiny.intermediate_size, tiny.vocab_size, tiny.qk_norm) == (
        "Qwen3ForCausalLM", 4, 512, 4, 128, 2, 1024, 2048, True)
    assert PRESETS["tiny-llama"].architecture == "LlamaForCausalLM" and not PRESETS["tiny-llama"].qk_norm
    assert PRESETS["tiny-moe"].num_experts == 8 and PRESETS["tiny-moe"].num_experts_per_tok == 2
    q = PRESETS["qwen3-0.6b"]
    assert (q.num_hidden_layers, q.hidden_size, q.num_attention_heads, q.num_key_value_heads, q.intermediate_size,
            q.vocab_size) == (28, 1024, 16, 8, 3072, 151936)


def test_the_natural_backend_follows_the_model():
    assert GraphConfig.from_vllm_args(model="tiny-mla").effective_attention_backend == "mla"
    assert GraphConfig.from_vllm_args(model="tiny").effective_attention_backend == "ascend"
    assert GraphConfig.from_vllm_args(model="tiny-mla", attention_backend="ascend").effective_attention_backend == "ascend"


# --------------------------------------------------------------------------- config.json numeric fields

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 512,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 2048}
_MOE = {**_QWEN3, "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2}
_MLA = {**_QWEN3, "architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 256, "qk_rope_head_dim": 64}


@pytest.mark.parametrize(
    "base, field, value",
    [
        (_QWEN3, "head_dim", 0),
        (_QWEN3, "head_dim", -64),
        (_QWEN3, "head_dim", 64.0),
        (_QWEN3, "head_dim", "128"),
        (_QWEN3, "head_dim", True),
        (_QWEN3, "rope_theta", 0),
        (_QWEN3, "rope_theta", -1.0),
        (_QWEN3, "rope_theta", float("nan")),
        (_QWEN3, "rope_theta", float("inf")),
        (_QWEN3, "rope_theta", 10**400),
        (_QWEN3, "rope_theta", "1e6"),
        (_QWEN3, "rope_theta", [1e6]),
        (_QWEN3, "max_position_embeddings", 0),
        (_QWEN3, "max_position_embeddings", 4096.5),
        (_QWEN3, "max_position_embeddings", "4096"),
        (_MOE, "num_experts", -1),
        (_MOE, "num_experts", 8.0),
        (_QWEN3, "n_routed_experts", "64"),
        (_QWEN3, "num_local_experts", -8),
        (_MOE, "num_experts_per_tok", -1),
        (_MOE, "num_experts_per_tok", {"k": 2}),
        (_MOE, "num_experts_per_tok", 9),  # more experts per token than the model has
        (_MLA, "kv_lora_rank", -1),
        (_MLA, "kv_lora_rank", "256"),
        (_MLA, "qk_rope_head_dim", -64),
        (_MLA, "qk_rope_head_dim", 64.0),
        (_QWEN3, "rms_norm_eps", 0),
        (_QWEN3, "rms_norm_eps", -1e-6),
        (_QWEN3, "rms_norm_eps", float("nan")),
        (_QWEN3, "rms_norm_eps", float("inf")),
        (_QWEN3, "rms_norm_eps", 10**400),
        (_QWEN3, "rms_norm_eps", "1e-6"),
        (_QWEN3, "rms_norm_eps", False),
        (_QWEN3, "layer_norm_epsilon", 0.0),
    ],
)
def test_a_bad_numeric_model_field_is_a_config_error_naming_the_field_and_the_value(base, field, value):
    raw = {**base, field: value}
    for build in (lambda: model_spec_from(raw), lambda: GraphConfig.from_vllm_args(model=raw)):
        with pytest.raises(ConfigError) as info:
            build()
        assert info.value.key == field
        message = str(info.value)
        assert f"{field} must be" in message and f"got {value!r}" in message, message


@pytest.mark.parametrize(
    "base, extra, expected",
    [
        (_QWEN3, {}, {"head_dim": 128, "rope_theta": 1e6, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6}),
        (_QWEN3, {"head_dim": None, "rope_theta": None}, {"head_dim": 128, "rope_theta": 1e6}),  # null: the default
        (_QWEN3, {"head_dim": 64, "rope_theta": 10000, "max_position_embeddings": 32768, "layer_norm_epsilon": 1e-5},
         {"head_dim": 64, "rope_theta": 10000.0, "max_position_embeddings": 32768, "rms_norm_eps": 1e-5}),
        (_MOE, {}, {"is_moe": True, "num_experts": 8, "num_experts_per_tok": 2}),
        ({**_QWEN3, "n_routed_experts": 64, "num_experts_per_tok": 8}, {}, {"num_experts": 64, "num_experts_per_tok": 8}),
        (_MLA, {}, {"attention": "mla", "kv_lora_rank": 256, "qk_rope_head_dim": 64}),
        (_QWEN3, {"kv_lora_rank": 0, "num_experts": 0}, {"attention": "mha", "is_moe": False}),
    ],
)
def test_numeric_model_fields_take_their_value_or_the_default(base, extra, expected):
    spec = model_spec_from({**base, **extra})
    assert {name: getattr(spec, name) for name in expected} == expected


def test_a_head_dim_derived_as_zero_names_head_dim_and_the_fix():
    with pytest.raises(ConfigError, match=r"head_dim = hidden_size // num_attention_heads = 2 // 4 = 0") as info:
        model_spec_from({**_QWEN3, "hidden_size": 2})
    assert info.value.key == "head_dim"
