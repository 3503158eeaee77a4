"""`ascendgraph explain`: text and JSON output, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from ascendgraph.cli.app import main

EXPLAIN_KEYS = {"schema_version", "requested_mode", "effective_mode", "decisions", "compilation_mode", "capture_sizes",
                "max_capture_size", "npugraph_ex", "static_kernel", "super_kernel", "stream_plan", "warnings"}


def test_full_with_mla_is_explained_as_narrowed_to_full_decode_only(capsys):
    assert main(["explain", "--compilation-config", '{"cudagraph_mode":"FULL"}', "--attention-backend", "mla"]) == 0
    out, err = capsys.readouterr()
    assert "requested mode" not in err  # the explanation is the result: stdout
    assert "requested mode   FULL" in out
    assert "effective mode   FULL_DECODE_ONLY" in out
    assert "CUDAGraphMode.FULL is not supported with AscendMLABackend backend" in out
    assert "stream plan:" in out


def test_json_has_the_interface_keys_and_nothing_on_stderr_but_logs(capsys):
    assert main(["explain", "--json", "--compilation-config", '{"cudagraph_mode":"FULL"}', "--attention-backend", "mla"]) == 0
    out, _ = capsys.readouterr()
    doc = json.loads(out)
    assert EXPLAIN_KEYS <= set(doc)
    assert doc["schema_version"] == 1
    assert (doc["requested_mode"], doc["effective_mode"]) == ("FULL", "FULL_DECODE_ONLY")
    assert {"max_num_sizes", "streams_per_size", "fits"} <= set(doc["stream_plan"])
    assert all(set(d) == {"rule", "before", "after", "reason"} for d in doc["decisions"])
    assert any(d["rule"] == "attention_narrowing" for d in doc["decisions"])


def test_eager_json_has_an_empty_stream_plan(capsys):
    assert main(["explain", "--json", "--enforce-eager"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["effective_mode"] == "NONE" and doc["capture_sizes"] == [] and doc["stream_plan"]["fits"] is True


@pytest.mark.parametrize("argv, fragment", [
    (["explain", "--compilation-config", "{bad json"], "invalid JSON at line 1"),
    (["explain", "--max-num-seqs", "0"], "expected a positive integer"),
    (["explain", "--soc", "Z1"], "invalid choice"),
    (["explain", "--model", "nope"], "unknown model 'nope'"),
    (["explain", "--compilation-config", '{"cudagraph_mode":"FULL"}', "--attention-backend", "never"],
     "please try cudagraph_mode=PIECEWISE"),
    (["explain", "--additional-config", '{"ascend_compilation_config":{"enable_super_kernel":true}}'],
     "Super kernel generation requires static kernel to be enabled"),
    (["explin"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(argv, fragment, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert fragment in err
    assert len(err.strip().splitlines()) == 1
    assert "Traceback" not in err


def test_stream_limit_and_expansion_mode_reach_the_plan(capsys):
    argv = ["explain", "--json", "-O1", "--stream-limit", "20", "--hccl-op-expansion-mode", "AIV",
            "--compilation-config", '{"cudagraph_capture_sizes":[1,2,4,8]}']
    assert main(argv) == 0
    plan = json.loads(capsys.readouterr().out)["stream_plan"]
    assert plan["expansion_mode"] == "AIV" and plan["fits"] is False and plan["max_num_sizes"] == 3


def test_launch_blocking_from_the_environment_is_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("ASCEND_LAUNCH_BLOCKING", "1")
    assert main(["explain"]) == 2
    assert "ASCEND_LAUNCH_BLOCKING=1" in capsys.readouterr().err


def test_console_script_and_module_entry_point_work():
    done = subprocess.run([sys.executable, "-m", "ascendgraph", "explain", "--json"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["effective_mode"] == "FULL_AND_PIECEWISE"


def test_help_teaches_with_an_example(capsys):
    with pytest.raises(SystemExit) as info:
        main(["explain", "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--compilation-config" in out and "example:" in out


def test_float32_is_listed_under_lenient_on_sim_and_refused_on_npu(capsys):
    """docs/decisions.md "float32 on the simulator": explain lists the declared float32 leniency as the run's report does."""
    from ascendgraph.leniency import FLOAT32_ON_NPU, LENIENT_FLOAT32

    assert main(["explain"]) == 0
    out, _ = capsys.readouterr()
    assert "lenient" not in out  # bfloat16, the default, needs no leniency
    assert main(["explain", "--dtype", "float32"]) == 0
    out, _ = capsys.readouterr()
    assert "lenient (the simulator runs it; an NPU would refuse it):" in out
    assert LENIENT_FLOAT32 in out
    assert main(["explain", "--json", "--dtype", "float32"]) == 0
    assert json.loads(capsys.readouterr().out)["lenient"] == [LENIENT_FLOAT32]
    assert main(["explain", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["lenient"] == []
    assert main(["explain", "--dtype", "float32", "--device", "npu"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert FLOAT32_ON_NPU in err


def test_explain_refuses_an_illegal_block_size_without_importing_torch():
    """explain runs nothing, so it needs no torch: the block-size rule it checks is the contract
    table's, kept torch-free in ascendgraph.block_sizes (explain went from ~5 s to ~0.5 s)."""
    script = (
        "import sys\n"
        "from ascendgraph.cli.app import main\n"
        "assert main(['explain', '--block-size', '8']) == 2\n"
        "assert main(['explain']) == 0\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "False"
    assert "paged_block_size" in result.stderr
