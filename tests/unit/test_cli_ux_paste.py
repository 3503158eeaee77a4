"""Pasted `vllm serve` lines: ascendgraph's own flags, values that are flags, unquoted JSON,
environment assignments, model paths; --speculative-config and empty JSON flags."""

from __future__ import annotations

import json
import os

import pytest

from ascendgraph.cli.app import main
from ascendgraph.errors import ConfigError
from ascendgraph.cli.vllm_serve import resolve_model_argument, translate_vllm_command


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    return err.strip().splitlines()[-1]


@pytest.mark.parametrize("flag, value", [("--num-layers", "2"), ("--json", None), ("--soc", "A3"),
                                         ("--stream-limit", "40")])
def test_an_ascendgraph_flag_after_the_dashes_says_put_it_before(capsys, flag, value):
    pasted = ["vllm", "serve", "Qwen/Qwen3-0.6B", flag, *([value] if value else [])]
    err = _error(capsys, ["explain", "--", *pasted])
    assert f"{flag} is an ascendgraph flag, not a vllm serve flag: put it before --" in err
    assert "did you mean" not in err


def test_a_flag_needing_a_value_does_not_swallow_the_next_flag(capsys):
    err = _error(capsys, ["explain", "--", "vllm", "serve", "m", "--gpu-memory-utilization", "--max-num-seqs", "8"])
    assert "--gpu-memory-utilization needs a value" in err and "unexpected argument" not in err


@pytest.mark.parametrize("tokens", [["-O", "--enforce-eager"], ["-cc.cudagraph_mode", "-tp", "2"],
                                    ["--max-num-seqs", "--enforce-eager"]])
def test_flags_are_not_values(tokens):
    with pytest.raises(ConfigError, match="needs a"):
        translate_vllm_command(["vllm", "serve", "m", *tokens])


def test_a_negative_number_is_still_a_value():
    argv = translate_vllm_command(["vllm", "serve", "m", "--seed", "-1"]).argv
    assert argv[argv.index("--seed") + 1] == "-1"


def test_unquoted_json_after_cc_gets_the_quoting_hint(capsys):
    err = _error(capsys, ["explain", "--", "vllm", "serve", "m", "-cc", "{cudagraph_mode:FULL}"])
    assert "invalid JSON" in err and "Quote keys and strings with double quotes" in err


def test_empty_json_in_a_pasted_line_is_an_error(capsys):
    assert "-cc is empty; pass a JSON object such as '{}'" in _error(
        capsys, ["explain", "--", "vllm", "serve", "m", "-cc", ""])


# ---------------------------------------------------------------- environment of the pasted line


@pytest.mark.parametrize("command", ["explain", "plan"])
def test_launch_blocking_in_the_pasted_line_is_refused_like_an_exported_one(capsys, monkeypatch, command):
    monkeypatch.delenv("ASCEND_LAUNCH_BLOCKING", raising=False)
    err = _error(capsys, [command, "--", "ASCEND_LAUNCH_BLOCKING=1", "vllm", "serve", "Qwen/Qwen3-0.6B"])
    assert "ACL graph is incompatible with ASCEND_LAUNCH_BLOCKING=1" in err
    assert "ASCEND_LAUNCH_BLOCKING" not in os.environ  # the process environment is left alone


def test_run_uses_the_pasted_environment(capsys, monkeypatch):
    monkeypatch.delenv("ASCEND_LAUNCH_BLOCKING", raising=False)
    err = _error(capsys, ["run", "--num-layers", "1", "--requests", "1", "--",
                          "ASCEND_LAUNCH_BLOCKING=1", "vllm", "serve", "m"])
    assert "ASCEND_LAUNCH_BLOCKING" in err


def test_a_harmless_assignment_is_applied_silently(capsys, monkeypatch):
    monkeypatch.delenv("ASCEND_LAUNCH_BLOCKING", raising=False)
    assert main(["explain", "--json", "--", "ASCEND_LAUNCH_BLOCKING=0", "vllm", "serve", "Qwen/Qwen3-0.6B"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["effective_mode"] and "not applied" not in captured.err


def test_the_translation_carries_the_assignments():
    pasted = translate_vllm_command(["A=1", "HCCL_OP_EXPANSION_MODE=AIV", "vllm", "serve", "m"])
    assert pasted.env == {"A": "1", "HCCL_OP_EXPANSION_MODE": "AIV"}
    assert pasted.argv[:2] == ["--hccl-op-expansion-mode", "AIV"]


# ---------------------------------------------------------------- model argument


@pytest.mark.parametrize("model", ["/nonexistent/path", "./no/such/model", "../nope", "~/no-such-model-dir",
                                   "missing-config.json"])
def test_a_missing_model_path_is_bad_input(capsys, model):
    err = _error(capsys, ["explain", "--", "vllm", "serve", model])
    assert f"model path {model!r}" in err and "does not exist" in err


def test_a_folder_without_config_json_is_bad_input(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        resolve_model_argument(str(tmp_path))


def test_hugging_face_ids_still_fall_back_to_tiny():
    model, note = resolve_model_argument("Qwen/Foo")
    assert model == "tiny" and "using the tiny preset" in note


def test_a_hugging_face_id_named_like_a_preset_selects_the_preset():
    assert resolve_model_argument("Qwen/Qwen3-0.6B") == ("qwen3-0.6b", None)


def test_a_path_is_a_path_even_when_its_folder_is_named_like_a_preset(tmp_path):
    """vLLM reads a local folder as the model: its config.json, never the preset of the same name;
    a path of that shape that does not exist is refused (README: paths must exist)."""
    import json

    folder = tmp_path / "Qwen3-0.6B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 2}))
    assert resolve_model_argument(str(folder)) == (str(folder), None)
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_model_argument("/models/Qwen/Qwen3-0.6B-not-here/Qwen3-0.6B")


# ---------------------------------------------------------------- --speculative-config


def test_conflicting_speculative_token_counts_are_bad_input(capsys):
    err = _error(capsys, ["explain", "--speculative-config", '{"num_speculative_tokens":1}',
                          "--num-speculative-tokens", "3"])
    assert "--num-speculative-tokens 3 conflicts with --speculative-config num_speculative_tokens 1" in err


def test_agreeing_speculative_token_counts_are_fine(capsys):
    assert main(["explain", "--json", "--speculative-config", '{"num_speculative_tokens":2}',
                 "--num-speculative-tokens", "2"]) == 0


def test_unknown_speculative_keys_are_errors_with_the_closest(capsys):
    err = _error(capsys, ["explain", "--speculative-config", '{"num_speculative_token":1}'])
    assert "unknown --speculative-config key 'num_speculative_token'" in err
    assert "did you mean 'num_speculative_tokens'?" in err
    assert "unknown --speculative-config key 'bogus'" in _error(capsys, ["explain", "--speculative-config",
                                                                         '{"bogus":1}'])


def test_real_unmodelled_speculative_keys_are_warned_about_once(capsys):
    assert main(["explain", "--json", "--", "vllm", "serve", "Qwen/Qwen3-0.6B", "--speculative-config",
                 '{"method": "mtp", "model": "x", "num_speculative_tokens": 1, "draft_tensor_parallel_size": 1}']) == 0
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if "--speculative-config keys ignored" in line]
    assert len(lines) == 1 and "method, model, draft_tensor_parallel_size" in lines[0]
    assert json.loads(captured.out)["effective_mode"]


# ---------------------------------------------------------------- empty values


@pytest.mark.parametrize("argv, flag", [
    (["explain", "-cc", ""], "--compilation-config/-cc"),
    (["explain", "--additional-config", " "], "--additional-config"),
    (["explain", "--speculative-config", ""], "--speculative-config/-sc"),
])
def test_empty_json_flags_are_bad_input(capsys, argv, flag):
    err = _error(capsys, argv)
    assert f"argument {flag}: empty; pass a JSON object such as '{{}}'" in err


@pytest.mark.parametrize("command", ["run", "profile"])
def test_an_empty_profile_dir_is_bad_input(capsys, command):
    assert "argument --profile-dir: empty; pass a directory" in _error(capsys, [command, "--profile-dir", ""])


def test_plan_resolves_with_the_given_environment_not_only_the_process_one(monkeypatch):
    from ascendgraph.config import GraphConfig
    from ascendgraph.tools.plan import make_plan

    monkeypatch.delenv("HCCL_OP_EXPANSION_MODE", raising=False)
    config = GraphConfig.from_vllm_args(model="tiny", num_layers=2)
    plain = make_plan(config, measure="off", requests=2)
    pasted = make_plan(config, measure="off", requests=2, env={"HCCL_OP_EXPANSION_MODE": "bogus"})
    assert not any("HCCL_OP_EXPANSION_MODE='bogus'" in w for w in plain.warnings)
    assert any("HCCL_OP_EXPANSION_MODE='bogus'" in w for w in pasted.warnings)


def test_max_loras_follows_vllm_only_with_enable_lora():
    assert "--max-loras" not in translate_vllm_command(["vllm", "serve", "m", "--max-loras", "2"]).argv
    assert any("no effect without --enable-lora" in n
               for n in translate_vllm_command(["vllm", "serve", "m", "--max-loras", "2"]).notes)
    argv = translate_vllm_command(["vllm", "serve", "m", "--max-loras", "3", "--enable-lora"]).argv
    assert argv[argv.index("--max-loras") + 1] == "3"
    argv = translate_vllm_command(["vllm", "serve", "m", "--enable-lora"]).argv
    assert argv[argv.index("--max-loras") + 1] == "1"
    with pytest.raises(ConfigError, match="requires max_loras >= 1"):
        translate_vllm_command(["vllm", "serve", "m", "--enable-lora", "--max-loras", "0"])
