"""One ascendgraph CLI parser shared by the many cases of a test module.

`ascendgraph.cli.app.build_parser()` builds every subcommand (about 3 ms); a case that only
parses a command line spends most of its time there. Parsing does not change a parser (no custom
actions; defaults are set while building), and a module that shares one compares its
`fingerprint` after every case, so a case that changed the shared parser fails, named
(tests/hostile/test_cli_corpus.py, tests/unit/test_cli_flag_spellings.py).
"""

from __future__ import annotations

from ascendgraph.cli import app


def fingerprint(parser: app.Parser) -> list:
    """Everything parsing could change on a parser: its actions' settings and defaults, per subcommand."""
    own = [(a.dest, tuple(a.option_strings), repr(a.default), a.nargs, a.required) for a in parser.actions]
    own.append(repr(sorted(parser._defaults.items())))
    return [own, *(fingerprint(child) for _, child in sorted(parser.subcommands.items()))]
