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
from typing import Any, Iterator

import pytest

from ascendgraph.cli.app import Parser, build_parser, parse_command_line
from ascendgraph.cli.args import config_from_args
from tests.shared_parser import fingerprint

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


@pytest.fixture(scope="module")
def _built_parser() -> tuple[Parser, list]:
    parser = build_parser()
    return parser, fingerprint(parser)


@pytest.fixture
def parser(_built_parser: tuple[Parser, list]) -> Iterator[Parser]:
    """The module's one parser (tests/shared_parser.py): a case parses up to three command lines,
    and building the parser for each was most of its time. A case that changed it fails, named."""
    shared, before = _built_parser
    yield shared
    assert fingerprint(shared) == before, "parsing this case changed the shared parser"


def _parse(parser: Parser, tokens: list[str]) -> dict[str, Any]:
    return _meaning(parse_command_line(parser, ["run", *tokens]).args)


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
def test_a_vllm_spelling_given_directly_means_what_its_canonical_spelling_means(parser, entry):
    got, canonical, default = _parse(parser, entry["tokens"]), _parse(parser, entry["canonical"]), _parse(parser, [])
    assert got == canonical
    if not entry["canonical"][0].startswith("--no-"):  # a negation is the default
        assert got != default, "the spelling was accepted but changed nothing"


@pytest.mark.parametrize("entry", SPELLINGS, ids=_id)
def test_a_vllm_spelling_in_a_pasted_line_means_what_its_canonical_spelling_means(parser, entry):
    assert _parse(parser, [*PASTE, *entry["tokens"]]) == _parse(parser, [*PASTE, *entry["canonical"]])


# ------------------------------------------------------------------ integer values
# What vLLM's parser makes of each value form of an integer flag (tests/data, "int_values").
# ascendgraph reads the same number, or refuses the form for a reason listed here.
INT_VALUES: dict[str, dict[str, Any]] = DATA["int_values"]
STRICTER_FORMS = {
    "1_000": "ascendgraph's bounded reader takes ASCII digits only (the hostile-input corpus refuses "
             "underscores for every count flag); write 1000",
}
# Below these, a value vLLM's parser takes is refused by ascendgraph's bounds (vLLM fails later or
# reads -1 as "unset"; ascendgraph says so at the flag).
MINIMUM = {"seed": 0, "max_loras": 0}


def _read_int_flag(parser: Parser, dest: str, form: str) -> Any:
    from ascendgraph.cli.app import CliUsageError

    option = DATA["option_strings"][dest][0]
    try:
        return getattr(parse_command_line(parser, ["run", option, form]).args, dest)
    except CliUsageError:
        return None


INT_CASES = [(dest, form) for dest, forms in sorted(INT_VALUES.items()) for form in forms]


def test_the_value_forms_cover_vllms_human_readable_counts():
    tokens = INT_VALUES["max_num_batched_tokens"]
    assert (tokens["8k"], tokens["8K"], tokens["1.5k"], tokens["1.5K"]) == (8000, 8192, 1500, None)
    assert INT_VALUES["max_num_seqs"]["8k"] is None  # the suffixes belong to a few flags only
    assert len(INT_CASES) >= 200


@pytest.mark.parametrize("dest,form", INT_CASES, ids=[f"{d}={f}" for d, f in INT_CASES])
def test_an_integer_flag_reads_what_vllm_reads_or_refuses_for_a_listed_reason(parser, dest, form):
    expected, got = INT_VALUES[dest][form], _read_int_flag(parser, dest, form)
    if expected is None:
        assert got is None, f"vLLM refuses {form!r} for {dest}; ascendgraph read {got!r}"
    elif form in STRICTER_FORMS or expected < MINIMUM.get(dest, 1):
        assert got is None, f"{form!r} is listed as refused by ascendgraph, which read {got!r}"
    else:
        assert got == expected
