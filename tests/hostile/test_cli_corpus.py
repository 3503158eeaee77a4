"""The hostile command-line corpus (corpus.py) through `main(argv)`, in-process.

The contract of every case: exit 2, exactly one line on stderr, no traceback, nothing on
stdout; with ``--json``, stdout is one strict JSON document (no NaN/Infinity) saying exit 2.
The default profile runs the tables' default selection; ``-m slow`` runs every value at
every place.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ascendgraph.cli.app import main

from .corpus import Case, CorpusFiles, cli_cases, json_document

PLACEHOLDER = Path("/@hostile-corpus@")
DEFAULT = cli_cases(CorpusFiles(PLACEHOLDER, write=False))
_default_ids = {case.id for case in DEFAULT}
EXTRA = [case for case in cli_cases(CorpusFiles(PLACEHOLDER, write=False), full=True) if case.id not in _default_ids]
JSON_EVERY = 7  # one case in JSON_EVERY also runs with --json (every diagnose / scenario case does)


@pytest.fixture(scope="module")
def corpus_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    files = CorpusFiles(root)
    files.json_files(), files.toml_scenarios(), files.logs(), files.workloads()
    return root


def _argv(case: Case, root: Path) -> list[str]:
    return [arg.replace(str(PLACEHOLDER), str(root)) for arg in case.argv]


def _with_json(argv: list[str]) -> list[str]:
    if "--" in argv:
        split = argv.index("--")
        return argv[:split] + ["--json"] + argv[split:]
    return argv + ["--json"]


def assert_refused(argv: list[str], capsys: pytest.CaptureFixture[str], *, as_json: bool) -> None:
    code = main(argv)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert code == 2, (argv[:4], code, err[-500:])
    assert "Traceback" not in err, err[-2000:]
    assert len(lines) == 1 and lines[0].strip(), (argv[:4], err[-1000:])
    if not as_json:
        assert out == "", out[:200]
        return
    document = json_document(out)
    assert document["exit_code"] == 2 and document["error"]["message"] == lines[0], document


def _check(case: Case, index: int, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _argv(case, root)
    assert_refused(argv, capsys, as_json=False)
    if case.json_flag and (index % JSON_EVERY == 0 or argv[0] in ("diagnose", "scenario")):
        assert_refused(_with_json(argv), capsys, as_json=True)


@pytest.mark.parametrize("index, case", list(enumerate(DEFAULT)), ids=[case.id for case in DEFAULT])
def test_hostile_command_line_is_refused_in_one_line(index, case, corpus_root, capsys):
    _check(case, index, corpus_root, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("index, case", list(enumerate(EXTRA)), ids=[case.id for case in EXTRA])
def test_hostile_command_line_full_profile(index, case, corpus_root, capsys):
    _check(case, index, corpus_root, capsys)


def test_the_corpus_covers_every_subcommand_and_every_file_reader():
    from .corpus import _commands

    covered = {case.argv[:2] if case.argv[0] == "scenario" else case.argv[:1] for case in DEFAULT}
    for path in _commands():
        assert tuple(path) in covered or path == ("scenario",), path  # scenario: its subcommands are
    flags = {arg for case in DEFAULT for arg in case.argv if arg.startswith("--")}
    assert {"--model", "--sim-profile", "--workload", "--faults", "--compilation-config", "--additional-config",
            "--speculative-config"} <= flags
    assert any(case.argv[:1] == ("diagnose",) for case in DEFAULT)
    assert len(DEFAULT) >= 500
