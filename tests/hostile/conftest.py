"""The hostile corpus's modules call `ascendgraph.cli.app.main` thousands of times in-process."""

from __future__ import annotations

from typing import Iterator

import pytest

from ascendgraph.cli import app
from tests.shared_parser import fingerprint


@pytest.fixture(scope="module")
def built_parser() -> tuple[app.Parser, list]:
    parser = app.build_parser()
    return parser, fingerprint(parser)


@pytest.fixture(autouse=True)
def _one_parser_per_module(built_parser: tuple[app.Parser, list], monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """`main` builds the whole parser (every subcommand) on each call, ~80 % of a refused case's
    time; here a module's cases share one. Parsing does not change a parser (no custom actions,
    defaults are set while building), and the fingerprint checked after every case keeps it that
    way: a case that changed the shared parser fails, named (tests/shared_parser.py)."""
    parser, before = built_parser
    monkeypatch.setattr(app, "build_parser", lambda: parser)
    yield
    assert fingerprint(parser) == before, "parsing this case changed the parser"
