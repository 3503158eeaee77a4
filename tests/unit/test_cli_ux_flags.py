"""Unknown flags name the subcommand and the closest flag; no abbreviations; help texts and --version."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Iterator

import pytest

import ascendgraph
from ascendgraph.cli.app import Parser, build_parser, main


def _error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    return err


@pytest.mark.parametrize("argv, fragments", [
    (["run", "--jsn"], ["ascendgraph run: error: unrecognized arguments: --jsn", "did you mean '--json'?",
                        "(see ascendgraph run --help)"]),
    (["explain", "--num-layer", "2"], ["ascendgraph explain: error:", "did you mean '--num-layers'?"]),
    (["plan", "--stream-limt", "4"], ["ascendgraph plan: error:", "did you mean '--stream-limit'?"]),
    (["scenario", "run", "--jsn", "x"], ["ascendgraph scenario run: error:", "did you mean '--json'?"]),
    (["explain", "--num_layer", "2"], ["ascendgraph explain: error:", "did you mean '--num-layers'?"]),
    (["explain", "--compilation-config.no_such_key=1"], ["ascendgraph explain: error:", "no_such_key"]),
    (["explain", "--gpu-memory-utilization", "0.9"],
     ["--gpu-memory-utilization is a vllm serve flag ascendgraph does not model", "paste the whole line after --"]),
    (["explain", "-q"], ["-q is an option of ascendgraph itself: put it before the command"]),
])
def test_unknown_flags_name_the_command_and_the_fix(capsys, argv, fragments):
    err = _error(capsys, argv)
    for fragment in fragments:
        assert fragment in err


@pytest.mark.parametrize("argv", [
    ["explain", "--num-layer", "2"],
    ["explain", "--max-num-seq", "8"],
    ["run", "--request", "2"],
    ["explain", "--compilation", "{}"],
])
def test_abbreviations_are_refused(capsys, argv):
    assert "unrecognized arguments" in _error(capsys, argv)


def _parsers(parser: Parser) -> Iterator[Parser]:
    yield parser
    for child in parser.subcommands.values():
        yield from _parsers(child)


def test_no_parser_allows_abbreviations():
    parsers = list(_parsers(build_parser()))
    assert len(parsers) > 8
    assert all(parser.allow_abbrev is False for parser in parsers)


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_profile_help_shows_its_own_requests_default(capsys):
    assert "number of generated requests (default 4," in _help(capsys, "profile")
    assert "number of generated requests (default 16," in _help(capsys, "run")


def test_run_help_shows_the_device_default(capsys):
    assert re.search(r"--device \{sim,npu,auto\} .*default auto\)", _help(capsys, "run"))


@pytest.mark.parametrize("flag", ["--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size",
                                  "--prefill-context-parallel-size", "--decode-context-parallel-size",
                                  "--max-loras", "--enable-expert-parallel"])
def test_parallelism_and_lora_flags_have_help(flag):
    parser = build_parser()
    action = parser.subcommands["explain"].flags[flag]
    assert action.help and len(action.help) > 10


def test_help_points_only_at_docs_that_exist(capsys):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for command in ("run", "explain", "plan", "profile", "doctor", "diagnose", "scenario"):
        text = _help(capsys, command)
        assert "INTERFACES.md" not in text and "SEMANTICS.md" not in text
        for page in re.findall(r"docs/[\w./-]+\.md", text):
            assert (root / page).is_file(), (command, page)


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"ascendgraph {ascendgraph.__version__}" == "ascendgraph 0.1.0"


def test_version_from_the_console_entry_point():
    done = subprocess.run([sys.executable, "-m", "ascendgraph", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "ascendgraph 0.1.0", done.stderr


@pytest.mark.parametrize("spelling, canonical", [
    (["--compilation_config", '{"cudagraph_mode": "PIECEWISE"}'], ["-cc", '{"cudagraph_mode": "PIECEWISE"}']),
    (["--optimization-level", "1"], ["-O", "1"]),
    (["--optimization_level=1"], ["-O1"]),
    (["-O=1"], ["-O", "1"]),
    (["-ep", "-tp", "2"], ["--enable-expert-parallel", "-tp", "2"]),
    (["--no-enforce-eager"], []),
    (["-cc.cudagraph_mode=PIECEWISE"], ["--compilation-config", '{"cudagraph_mode": "PIECEWISE"}']),
    (["-cc", '{"cudagraph_capture_sizes": [4]}', "--compilation-config.cudagraph_mode", "PIECEWISE"],
     ["-cc", '{"cudagraph_capture_sizes": [4], "cudagraph_mode": "PIECEWISE"}']),
])
def test_vllm_spellings_given_directly_resolve_like_the_canonical_one(capsys, spelling, canonical):
    assert main(["explain", "--json", *spelling]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["explain", "--json", *canonical]) == 0
    assert got == json.loads(capsys.readouterr().out)
