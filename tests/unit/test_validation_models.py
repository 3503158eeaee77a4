"""Model specs the builder cannot build are ConfigErrors when the spec is loaded (so explain,
plan and run all refuse them, exit 2), and a model too large for host memory is refused before
its weights are allocated — except on meta tensors (`ascendgraph plan`)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

import ascendgraph.models.build as build
from ascendgraph.config import GraphConfig
from ascendgraph.errors import ConfigError
from ascendgraph.models.build import ModelOptions, build_model, estimate_build_bytes
from ascendgraph.models.presets import PRESETS, model_spec_from

_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "hidden_size": 512,
          "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 1024, "vocab_size": 2048}
_MLA = {**_QWEN3, "architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 256, "qk_rope_head_dim": 64}
_HUGE = {**_QWEN3, "hidden_size": 1_000_000, "intermediate_size": 1_000_000, "vocab_size": 1_000_000}


def _write(tmp_path, raw) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    return str(path)


# --------------------------------------------------------------------------- dimensions


@pytest.mark.parametrize("raw, key, fragments", [
    ({**_QWEN3, "num_key_value_heads": 3}, "num_key_value_heads",
     ["num_attention_heads (4) must be a multiple of num_key_value_heads (3)", "divides 4 (1, 2, 4)"]),
    ({**_QWEN3, "num_key_value_heads": 8}, "num_key_value_heads", ["(4) must be a multiple of num_key_value_heads (8)"]),
    ({**_QWEN3, "head_dim": 63}, "head_dim", ["head_dim must be even", "got 63"]),
    ({**_QWEN3, "hidden_size": 60}, "head_dim", ["got 15 (= hidden_size // num_attention_heads = 60 // 4)"]),
    ({**_QWEN3, "attention": "mla"}, "kv_lora_rank", ["attention 'mla' needs kv_lora_rank >= 1", "got 0"]),
    ({**_MLA, "qk_rope_head_dim": 0}, "qk_rope_head_dim", ["even qk_rope_head_dim >= 2", "got 0"]),
    ({**_MLA, "qk_rope_head_dim": 63}, "qk_rope_head_dim", ["got 63"]),
])
def test_a_model_the_builder_cannot_build_is_a_config_error_naming_the_field(raw, key, fragments):
    for load in (lambda: model_spec_from(raw), lambda: GraphConfig.from_vllm_args(model=raw)):
        with pytest.raises(ConfigError) as info:
            load()
        assert info.value.key == key
        message = str(info.value)
        assert "\n" not in message
        for fragment in fragments:
            assert fragment in message, message


def test_mla_ignores_the_kv_head_ratio_and_mha_head_dim_parity():
    # MLA attends over one latent "kv head"; its rope runs on qk_rope_head_dim, not head_dim.
    spec = model_spec_from({**_MLA, "num_key_value_heads": 3, "head_dim": 63})
    assert spec.attention == "mla"


def test_every_preset_passes_the_dimension_checks():
    for spec in PRESETS.values():
        assert replace(spec, num_hidden_layers=1).num_hidden_layers == 1


def test_a_directly_made_spec_is_checked_too():
    with pytest.raises(ConfigError, match=r"model 'tiny': num_attention_heads \(4\) must be a multiple") as info:
        replace(PRESETS["tiny"], num_key_value_heads=3)
    assert info.value.key == "num_key_value_heads"
    with pytest.raises(ConfigError, match="hidden_size must be an integer >= 1, got '512'"):
        replace(PRESETS["tiny"], hidden_size="512")


def test_explain_plan_and_run_refuse_an_uneven_head_ratio_with_exit_2(tmp_path, capsys):
    from ascendgraph.cli.app import main

    path = _write(tmp_path, {**_QWEN3, "num_key_value_heads": 3})
    for command in (["explain"], ["plan"], ["run", "--requests", "1"]):
        assert main([*command, "--model", path]) == 2, command
        out, err = capsys.readouterr()
        assert "Traceback" not in err and "paged_attention" not in err
        assert "must be a multiple of num_key_value_heads (3)" in err and path in err


# --------------------------------------------------------------------------- host memory


def test_the_estimate_covers_what_a_build_allocates():
    spec = PRESETS["tiny"]
    model = build_model(spec)
    allocated = sum(t.numel() * t.element_size() for t in (*model.parameters(), *model.buffers()))
    assert allocated <= estimate_build_bytes(spec, ModelOptions()) <= 3 * allocated


def test_a_model_larger_than_host_memory_is_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(build, "available_host_memory", lambda: 16 << 30)
    spec = model_spec_from(_HUGE)
    with pytest.raises(ConfigError) as info:
        build_model(spec)
    message = str(info.value)
    assert "\n" not in message and info.value.key == "model"
    assert "hidden_size 1000000" in message and "16.0 GiB is available" in message
    assert "use --num-layers N to shorten it" in message and "`ascendgraph plan`" in message


def test_unknown_host_memory_skips_the_check(monkeypatch):
    monkeypatch.setattr(build, "available_host_memory", lambda: None)
    assert build_model(replace(PRESETS["tiny"], num_hidden_layers=1)).num_layers == 1


def test_meta_builds_are_not_checked(monkeypatch):
    monkeypatch.setattr(build, "available_host_memory", lambda: 0)
    spec = model_spec_from(_HUGE)
    with torch.device("meta"):  # how the engine builds for `ascendgraph plan`
        model = build_model(spec, device="meta")
    assert model.embed_tokens.weight.is_meta
    assert model.make_kv_caches(4, 16)  # and the KV cache of a meta model costs nothing either


def test_a_kv_cache_larger_than_host_memory_is_refused(monkeypatch):
    model = build_model(replace(PRESETS["tiny"], num_hidden_layers=1))
    needed = model.kv_cache_bytes(1000, 128)
    monkeypatch.setattr(build, "available_host_memory", lambda: needed - 1)
    expected = r"the KV cache of model 'tiny' \(1000 blocks of 128 tokens, 1 layer\)"
    with pytest.raises(ConfigError, match=expected):
        model.make_kv_caches(1000, 128)
    monkeypatch.setattr(build, "available_host_memory", lambda: needed)
    assert len(model.make_kv_caches(1000, 128)) == 1


def test_run_refuses_a_huge_model_with_exit_2_and_one_line(tmp_path, capsys, monkeypatch):
    from ascendgraph.cli.app import main

    monkeypatch.setattr(build, "available_host_memory", lambda: 64 << 30)
    assert main(["run", "--model", _write(tmp_path, _HUGE), "--requests", "1"]) == 2
    _, err = capsys.readouterr()
    assert "Traceback" not in err and "DefaultCPUAllocator" not in err
    assert "of host memory but only 64.0 GiB is available" in err
