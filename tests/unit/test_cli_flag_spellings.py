"""Every spelling vLLM 0.32's parser accepts for a flag ascendgraph models is accepted by
ascendgraph too, given directly or in a pasted `vllm serve` line, with the same meaning as
the canonical spelling.

The spellings are data read off vLLM's own parser in the parity environment
(tests/parity/vllm_flag_spellings.py writes tests/data/vllm_flag_spellings.json; the parity
run regenerates it and fails when this file is stale), so they cannot drift from vLLM.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from ascendgraph.cli.app import build_parser, parse_command_line
from ascendgraph.cli.args import config_from_args

DATA = json.loads((Path(__file__).resolve().parents[1] / "data" / "vllm_flag_spellings.json").read_text())
SPELLINGS = DATA["spellings"]
PASTE = ["--", "vllm", "serve", "Qwen/Qwen3-0.6B"]
# How a flag's effect is read back: the configuration it builds, and the run flags beside it.
RUN_ONLY = ("seed",)


def _meaning(args: argparse.Namespace) -> dict[str, Any]:
    config = config_from_args(args, warn=False)
    meaning: dict[str, Any] = {"config": repr(config)}
    for dest in RUN_ONLY:
        meaning[dest] = getattr(args, dest, None)
    return meaning


def _parse(tokens: list[str]) -> dict[str, Any]:
    return _meaning(parse_command_line(build_parser(), ["run", *tokens]).args)


def _id(entry: dict[str, Any]) -> str:
    return " ".join(entry["tokens"])


def test_the_data_comes_from_vllm_0_32_and_covers_every_spelling_family():
    assert DATA["vllm_version"].startswith("0.32")
    shapes = {_id(e) for e in SPELLINGS}
    for expected in ("-O3", "-O 3", "-O=3", "--optimization-level 3", "--optimization_level=3",
                     "--max_num_seqs 8", "--max-num-seqs=8", "-tp 2", "-tp=2", "--no-enforce-eager",
                     "--compilation-config.cudagraph_mode=FULL_DECODE_ONLY", "-cc.cudagraph_mode FULL_DECODE_ONLY"):
        assert expected in shapes, expected
    assert len(SPELLINGS) >= 90


@pytest.mark.parametrize("entry", SPELLINGS, ids=_id)
def test_a_vllm_spelling_given_directly_means_what_its_canonical_spelling_means(entry):
    got, canonical, default = _parse(entry["tokens"]), _parse(entry["canonical"]), _parse([])
    assert got == canonical
    if not entry["canonical"][0].startswith("--no-"):  # a negation is the default
        assert got != default, "the spelling was accepted but changed nothing"


@pytest.mark.parametrize("entry", SPELLINGS, ids=_id)
def test_a_vllm_spelling_in_a_pasted_line_means_what_its_canonical_spelling_means(entry):
    assert _parse([*PASTE, *entry["tokens"]]) == _parse([*PASTE, *entry["canonical"]])
