"""Bounds on every path, numbers for meaning, text from inputs
escaped, output in any encoding, the pasted line as vLLM reads it, the streams around a
command. Generated variants, in-process through `main`."""

from __future__ import annotations

import io
import json
import math
import os
import random

import pytest

from ascendgraph.cli.app import main
from ascendgraph.cli.vllm_flags import VLLM_SWITCHES
from ascendgraph.cli.vllm_serve import MODELLED_FLAGS, translate_vllm_command
from ascendgraph.errors import ConfigError

from .corpus import json_document
from .special_inputs import CONTROL_TEXTS, LOOK_ALIKE_ENV_NAMES, RAW_CONTROL, control_places


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (argv[:6], code, err[-300:])
    assert "Traceback" not in err and len(err.splitlines()) == 1, err[-600:]
    return out, err


# --------------------------------------------------------------------------- 4. escaped text

CONTROL_CASES = [(name, place) for name in CONTROL_TEXTS for place in control_places("", __import__("pathlib").Path("/"))]


@pytest.mark.parametrize("name, place", CONTROL_CASES, ids=[f"{n}:{p}" for n, p in CONTROL_CASES])
def test_text_from_inputs_reaches_stderr_escaped_on_one_line(name, place, tmp_path, capsys):
    argv = control_places(CONTROL_TEXTS[name], tmp_path)[place]
    _, err = _refused(argv, capsys)
    assert not any(char in err.rstrip("\n") for char in RAW_CONTROL), repr(err)
    assert err.count("\n") == 1 and not err.startswith("ERROR")


@pytest.mark.parametrize("name", sorted(CONTROL_TEXTS))
def test_the_json_error_document_holds_the_same_escaped_line(name, capsys):
    out, err = _refused(["explain", "--json", "--", "vllm", "serve", "tiny", f"--bogus{CONTROL_TEXTS[name]}"], capsys)
    assert json_document(out)["error"]["message"] == err.rstrip("\n")


def test_a_config_name_with_escapes_is_printed_escaped_in_the_result(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2,
                                "_name_or_path": "evil\x1b]0;owned\x07\nERROR ascendgraph: all good"}))
    assert main(["explain", "--model", str(path)]) == 0
    out, err = capsys.readouterr()
    assert not any(char in out.replace("\n", "").replace("\t", "") for char in RAW_CONTROL)
    assert not any(line.startswith("ERROR ascendgraph: all good") for line in out.splitlines() + err.splitlines())


# --------------------------------------------------------------------------- 4. any stdout encoding

ENCODINGS = ("ascii", "latin-1", "cp1252", "utf-8")
ENCODING_COMMANDS = (["explain"], ["explain", "--json"], ["explain", "--help"], ["--help"], ["doctor"],
                     ["doctor", "--json"])


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("argv", ENCODING_COMMANDS, ids=" ".join)
def test_output_survives_any_stdout_encoding(encoding, argv, monkeypatch):
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors="strict")
    monkeypatch.setattr("sys.stdout", stream)
    try:
        code = main(list(argv))
    except SystemExit as exc:  # --help
        code = exc.code
    stream.flush()
    assert code in (0, 1), code
    assert raw.getvalue().decode(encoding)


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_lone_surrogate_in_a_config_name_is_printed_escaped(encoding, tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_text('{"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 2, "_name_or_path": "x\\ud800y"}')
    raw = io.BytesIO()
    stream = io.TextIOWrapper(raw, encoding=encoding, errors="strict")
    monkeypatch.setattr("sys.stdout", stream)
    assert main(["explain", "--model", str(path)]) == 0
    stream.flush()
    assert "\\ud800" in raw.getvalue().decode(encoding) or "ud800" in raw.getvalue().decode(encoding)


# --------------------------------------------------------------------------- 5. the pasted line

SWITCHES = sorted(flag for flag in MODELLED_FLAGS if flag in VLLM_SWITCHES and flag.startswith("--"))
SEQUENCES = {"on": [True], "off": [False], "on-off": [True, False], "off-on": [False, True],
             "on-off-on": [True, False, True], "off-on-off": [False, True, False]}


@pytest.mark.parametrize("sequence", sorted(SEQUENCES))
@pytest.mark.parametrize("switch", SWITCHES)
def test_the_last_of_a_switch_and_its_negation_wins(switch, sequence):
    tokens = ["vllm", "serve", "tiny"] + [switch if on else "--no-" + switch[2:] for on in SEQUENCES[sequence]]
    argv = translate_vllm_command(tokens).argv
    target = MODELLED_FLAGS[switch]
    expected = target if SEQUENCES[sequence][-1] else "--no-" + target[2:]
    assert expected in argv and argv.count(target) + argv.count("--no-" + target[2:]) == 1, argv


def test_enforce_eager_then_its_negation_runs_graph_mode(capsys):
    assert main(["explain", "--json", "--", "vllm", "serve", "tiny", "--enforce-eager", "--no-enforce-eager"]) == 0
    assert json_document(capsys.readouterr().out)["effective_mode"] != "NONE"


@pytest.mark.parametrize("before, pasted", [
    ("--enforce-eager", "--no-enforce-eager"), ("--no-enforce-eager", "--enforce-eager"),
    ("--enable-expert-parallel", "--no-enable-expert-parallel"), ("-ep", "--no-enable-expert-parallel"),
])
def test_a_negation_across_the_double_dash_is_a_conflict(before, pasted, capsys):
    _, err = _refused(["explain", before, "--", "vllm", "serve", "tiny", pasted], capsys)
    assert "given both before -- and in the pasted" in err


@pytest.mark.parametrize("name", sorted(LOOK_ALIKE_ENV_NAMES))
def test_an_environment_name_a_shell_would_refuse_is_refused(name, capsys):
    _, err = _refused(["explain", "--", f"{LOOK_ALIKE_ENV_NAMES[name]}=AIV", "vllm", "serve", "tiny"], capsys)
    assert "not an environment assignment" in err and "U+" in err


@pytest.mark.parametrize("folder", ["Qwen3-0.6B", "qwen3-0.6b", "tiny", "tiny-moe"])
def test_a_model_folder_named_like_a_preset_is_read_as_a_folder(folder, tmp_path, capsys):
    path = tmp_path / folder
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 3,
                                                  "hidden_size": 256, "num_attention_heads": 2}))
    assert main(["explain", "--json", "--", "vllm", "serve", str(path)]) == 0
    document = json_document(capsys.readouterr().out)
    assert document["model"]["num_hidden_layers"] == 3, document["model"]


@pytest.mark.parametrize("shape", ["/models/Qwen3-0.6B", "./Qwen3-0.6B/", "~/no-such-dir/tiny", "../tiny-moe"])
def test_a_nonexistent_path_named_like_a_preset_is_refused(shape, capsys):
    _, err = _refused(["explain", "--", "vllm", "serve", shape], capsys)
    assert "does not exist" in err or "has no config.json" in err


# --------------------------------------------------------------------------- 2. bounds on every path

DOTTED_PREFIXES = ("-cc.", "--compilation-config.", "--compilation_config.", "-O.", "--additional-config.", "-sc.")


@pytest.mark.parametrize("depth", [65, 1000, 20000])
@pytest.mark.parametrize("prefix", DOTTED_PREFIXES)
@pytest.mark.parametrize("where", ["pasted", "own"])
def test_dotted_keys_deeper_than_the_bound_are_one_line_everywhere(depth, prefix, where, capsys):
    token = prefix + ".".join(["a"] * depth) + "=1"
    argv = ["explain", "--json", "--", "vllm", "serve", "tiny", token] if where == "pasted" else \
        ["explain", "--json", token]
    out, err = _refused(argv, capsys)
    # ascendgraph's own -O takes a level, so its "-O.key" is a bad level (one line as well)
    assert "levels deep" in err or (where == "own" and prefix == "-O.")
    assert json_document(out)["exit_code"] == 2


@pytest.mark.parametrize("requests", ["20001", "1000000"])
def test_plan_refuses_more_generated_requests_than_it_can_simulate_in_seconds(requests, capsys):
    _, err = _refused(["plan", "--measure", "off", "--requests", requests], capsys)
    assert "--workload FILE" in err


def test_the_fast_size_selection_finds_the_same_optimum_as_the_exact_one():
    from ascendgraph.size_selection import select_sizes_fast
    from ascendgraph.sizes import pad_sorted, select_sizes

    def cost(chosen: list[int], workload: list[int]) -> int:
        return sum(pad_sorted(t, chosen) or 0 for t in workload)

    rng = random.Random(7)
    for _ in range(200):
        candidates = sorted(rng.sample(range(1, 300), rng.randint(2, 40)))
        budget = rng.randint(1, len(candidates) - 1)
        workload = [rng.randint(1, candidates[-1]) for _ in range(rng.randint(1, 80))]
        counts: dict[int, int] = {}
        for t in workload:
            counts[t] = counts.get(t, 0) + 1
        fast = select_sizes_fast(candidates, budget, counts)
        exact = select_sizes(candidates, budget, workload)
        assert cost(fast, workload) == cost(exact, workload) and len(fast) <= budget and candidates[-1] in fast


def test_a_selection_beyond_its_work_bound_is_refused_up_front():
    from ascendgraph.sizes import select_sizes

    workload = list(range(1, 8193))
    with pytest.raises(ConfigError, match="lower the budget"):
        select_sizes(list(range(1, 8193)), 8000, workload)


# --------------------------------------------------------------------------- 3. numbers for meaning

def _cost_fields() -> list[str]:
    from sim.profiles import _COST_RULES

    return sorted(_COST_RULES)


ABSURD = {"1e308": 1e308, "1e-300": 1e-300, "1e12": 1e12, "-1": -1}


@pytest.mark.parametrize("value", sorted(ABSURD))
@pytest.mark.parametrize("field", _cost_fields())
def test_profile_costs_outside_a_physical_range_are_refused(field, value):
    from sim.profiles import profile_from_dict

    figure = ABSURD[value]
    if field in ("ai_cores", "elements_per_block"):
        figure = int(figure) if math.isfinite(figure) and abs(figure) >= 1 else -1
    if value == "1e-300" and field not in ("peak_tflops", "bandwidth_gbps"):
        return  # a tiny overhead is physical; only rates must not be near zero
    with pytest.raises(ConfigError, match=f"cost.{field} must be"):
        profile_from_dict({"base": "A2", "cost": {field: figure}})


@pytest.mark.parametrize("figure", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("where", ["graph", "eager"])
def test_no_ok_over_a_figure_that_is_not_finite(figure, where):
    from ascendgraph.runtime.report import Report

    report = Report("FULL", "FULL", [], [1, 2], steps=1, simulated_time_us={"graph": 1.0, "eager": 2.0})
    assert report.ok
    report.simulated_time_us[where] = float(figure)
    assert not report.ok and report.exit_code == 1
    text = report.format_text()
    assert "result     FAILED" in text and "not finite" in text and "result     OK" not in text


# --------------------------------------------------------------------------- 7. streams and machine

def test_diagnose_dash_with_stdin_closed_is_one_line(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", None)
    _, err = _refused(["diagnose", "-"], capsys)
    assert "standard input is closed" in err


class _FullStdout(io.StringIO):
    encoding = "utf-8"

    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


@pytest.mark.parametrize("argv", [["--help"], ["explain", "--help"], ["--version"], ["explain"]], ids=" ".join)
def test_output_to_a_full_device_is_exit_1_never_a_silent_0(argv, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdout", _FullStdout())
    assert main(argv) == 1
    assert "cannot write to stdout" in capsys.readouterr().err


def test_a_reader_that_left_with_the_output_unread_is_a_closed_pipe(monkeypatch):
    from ascendgraph.cli import streams

    read_end, write_end = os.pipe()
    stream = os.fdopen(write_end, "w")
    stream.write("x" * 1000)
    stream.flush()
    os.close(read_end)  # the reader went away; our 1000 bytes are still in the pipe
    monkeypatch.setattr("sys.stdout", stream)
    try:
        assert streams._reader_left_unread()
    finally:
        monkeypatch.undo()
        try:
            stream.close()
        except BrokenPipeError:
            pass


def test_a_deleted_working_directory_is_refused_in_one_line_with_a_document(tmp_path, capsys):
    here = os.getcwd()
    gone = tmp_path / "gone"
    gone.mkdir()
    os.chdir(gone)
    gone.rmdir()
    try:
        out, err = _refused(["run", "--json"], capsys)
    finally:
        os.chdir(here)
    assert "working directory no longer exists" in err and json_document(out)["exit_code"] == 2


@pytest.mark.parametrize("layers", [1025, 100_000, 10**15])
@pytest.mark.parametrize("argv", [["explain", "--model"], ["plan", "--measure", "off", "--model"]], ids=" ".join)
def test_a_config_json_beyond_the_layer_bound_is_refused_before_any_work(layers, argv, tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": layers}))
    _, err = _refused([*argv, str(path)], capsys)
    assert "at most 1024 layers" in err


def test_the_memory_pre_check_sees_the_address_space_limit(monkeypatch):
    import resource

    from ascendgraph.models import build

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 30, resource.RLIM_INFINITY))
    room = build._address_space_available()
    assert room is not None and room <= 1 << 30
    assert build.available_host_memory() <= 1 << 30


@pytest.mark.parametrize("requests", ["1001", "1000000"])
def test_run_refuses_more_requests_than_it_can_simulate_up_front(requests, capsys):
    # Legal for the parser (at most 1,000,000) but days of simulation: refused before any build.
    _, err = _refused(["run", "--requests", requests], capsys)
    assert f"requests {requests} is more than a run simulates" in err and "plan --workload FILE" in err


def test_the_api_refuses_more_requests_than_a_run_simulates():
    import ascendgraph
    from ascendgraph.errors import ConfigError

    with pytest.raises(ConfigError, match="more than a run simulates"):
        ascendgraph.run(requests=1001)
