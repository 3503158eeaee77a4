"""Pasted `vllm serve` command lines after `--` (explain / run / plan)."""

from __future__ import annotations

import json

import pytest

from ascendgraph.cli.app import main
from ascendgraph.errors import ConfigError
from ascendgraph.cli.vllm_serve import resolve_model_argument, translate_vllm_command
from ascendgraph.cli.vllm_flags import VLLM_FLAGS, VLLM_SWITCHES


def explain_json(capsys, *pasted: str, before: tuple[str, ...] = ()) -> dict:
    assert main(["explain", "--json", *before, "--", *pasted]) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    return {"doc": json.loads(captured.out), "err": captured.err}


def test_the_seed_example_resolves_like_the_flags_would(capsys):
    result = explain_json(capsys, "vllm", "serve", "Qwen/Qwen3-0.6B", "--compilation-config",
                          '{"cudagraph_mode": "PIECEWISE"}')
    doc = result["doc"]
    assert doc["requested_mode"] == "PIECEWISE" and doc["effective_mode"] == "PIECEWISE"
    assert doc["model"]["name"] == "qwen3-0.6b" and doc["model"]["num_hidden_layers"] == 28


def test_real_unmodelled_flags_are_listed_once_as_ignored(capsys):
    result = explain_json(capsys, "vllm", "serve", "Qwen/Qwen3-0.6B", "--gpu-memory-utilization", "0.9",
                          "--max-model-len=4096", "--enable-prefix-caching", "--trust-remote-code")
    lines = [line for line in result["err"].splitlines() if "ignoring vllm serve flags" in line]
    assert len(lines) == 1
    for flag in ("--gpu-memory-utilization", "--max-model-len", "--enable-prefix-caching", "--trust-remote-code"):
        assert flag in lines[0]


def test_a_typo_is_an_error_with_the_closest_real_flag(capsys):
    assert main(["explain", "--", "vllm", "serve", "m", "--max-num-seq", "8"]) == 2
    err = capsys.readouterr().err
    assert "unknown vllm serve flag '--max-num-seq'" in err and "did you mean '--max-num-seqs'?" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("pasted, key, expected", [
    (["-tp", "4", "--max-num-seqs=16"], "capture_sizes", [1, 2, 4, 8, 16]),
    (["-O0"], "effective_mode", "NONE"),
    (["-O", "1"], "effective_mode", "PIECEWISE"),
    (["--optimization-level", "1"], "effective_mode", "PIECEWISE"),
    (["-cc.cudagraph_mode=FULL_DECODE_ONLY"], "effective_mode", "FULL_DECODE_ONLY"),
    (["--compilation-config.cudagraph_capture_sizes", "[1, 2, 8]"], "capture_sizes", [1, 2, 8]),
    (["-O.cudagraph_mode=FULL"], "effective_mode", "FULL"),
    (["--compilation-config", '{"cudagraph_mode":"FULL"}', "-cc.cudagraph_capture_sizes=[4]"], "capture_sizes", [4]),
    (["--enforce-eager"], "effective_mode", "NONE"),
    (["--additional-config.ascend_compilation_config.enable_npugraph_ex=false", "-cc.cudagraph_mode=FULL"],
     "npugraph_ex", False),
    (["--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}', "-cc.cudagraph_mode=FULL",
      "-cc.cudagraph_capture_sizes=[1,3,8]"], "capture_sizes", [2, 4, 8]),
])
def test_vllm_spellings_translate(capsys, pasted, key, expected):
    doc = explain_json(capsys, "vllm", "serve", "Qwen/Qwen3-0.6B", *pasted)["doc"]
    assert doc[key] == expected


def test_environment_assignment_for_hccl_expansion_mode(capsys):
    doc = explain_json(capsys, "HCCL_OP_EXPANSION_MODE=AIV", "vllm", "serve", "Qwen/Qwen3-0.6B", "-O1")["doc"]
    assert doc["stream_plan"]["expansion_mode"] == "AIV"


def test_a_flag_given_twice_is_an_error(capsys):
    assert main(["explain", "-tp", "2", "--", "vllm", "serve", "m", "--tensor-parallel-size", "4"]) == 2
    assert "given both before -- and in the pasted vllm serve line" in capsys.readouterr().err


def test_only_explain_run_and_plan_accept_a_pasted_line(capsys):
    assert main(["doctor", "--", "vllm", "serve", "m"]) == 2
    assert "only explain, run, plan accept a pasted" in capsys.readouterr().err


def test_the_pasted_line_must_be_vllm_serve(capsys):
    assert main(["explain", "--", "python", "serve.py"]) == 2
    assert "expected a `vllm serve MODEL ...` command line" in capsys.readouterr().err


def test_run_only_flags_are_ignored_by_explain_but_used_by_run():
    explain = translate_vllm_command(["vllm", "serve", "m", "--seed", "3", "--dtype", "bfloat16"],
                                     accepts=lambda flag: flag not in ("--seed", "--dtype"))
    assert "--seed 3" in explain.ignored and "--dtype bfloat16" in explain.ignored
    run = translate_vllm_command(["vllm", "serve", "m", "--seed", "3", "--dtype", "bfloat16"])
    assert run.argv[:4] == ["--seed", "3", "--dtype", "bfloat16"]


def test_enable_lora_means_one_adapter_unless_max_loras_is_given():
    assert "--max-loras" in translate_vllm_command(["vllm", "serve", "m", "--enable-lora"]).argv
    argv = translate_vllm_command(["vllm", "serve", "m", "--enable-lora", "--max-loras", "4"]).argv
    assert argv[argv.index("--max-loras") + 1] == "4" and argv.count("--max-loras") == 1


@pytest.mark.parametrize("tokens, fragment", [
    (["vllm", "serve", "m", "--max-num-seqs"], "needs a value"),
    (["vllm", "serve", "m", "--enforce-eager=yes"], "takes no value"),
    (["vllm", "serve", "m", "other"], "unexpected argument 'other'"),
    (["vllm", "serve", "m", "--compilation-config", "[1]"], "must be a JSON object"),
    (["vllm", "serve", "m", "--max-model-len.x=1"], "only"),
])
def test_malformed_pasted_lines(tokens, fragment):
    with pytest.raises(ConfigError, match=fragment):
        translate_vllm_command(tokens)


def test_model_argument_resolution(tmp_path):
    assert resolve_model_argument("Qwen/Qwen3-0.6B") == ("qwen3-0.6b", None)
    assert resolve_model_argument("DeepseekV3ForCausalLM") == ("tiny-mla", None)
    (tmp_path / "config.json").write_text("{}")
    assert resolve_model_argument(str(tmp_path)) == (str(tmp_path), None)
    model, note = resolve_model_argument("meta-llama/Llama-3-70B")
    assert model == "tiny" and "using the tiny preset" in note


def test_the_flag_table_is_vllm_032s():
    assert len(VLLM_FLAGS) > 400
    for flag in ("--compilation-config", "--additional-config", "-tp", "--max-num-seqs", "--speculative-config"):
        assert flag in VLLM_FLAGS
    assert "--enforce-eager" in VLLM_SWITCHES and "--max-num-seqs" not in VLLM_SWITCHES
