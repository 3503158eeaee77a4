"""The project explains itself: no tracked file cites a design document it does not contain.

The decisions the code relies on are written down in docs/decisions.md, the rules in
docs/semantics.md. Citations of documents a user does not have (the design notes the project
was planned from: their decision numbers, interface, semantics, simulator-notes and style
files, or a path into a shared directory beside the checkout) are refused here, so they
cannot come back.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_DESIGN_NAMES = ("DECISIONS", "INTERFACES" + ".md", "SEMANTICS" + ".md", "SIMULATOR" + "-NOTES", "STYLE" + ".md")
FOREIGN_CITATION = re.compile(
    "|".join(
        [
            *(re.escape(name) for name in _DESIGN_NAMES),  # case-sensitive: docs/semantics.md is ours
            r"\bD(?:[1-9]|1[0-3])\b",  # a bare decision number ("D3")
            re.escape("../" + "shared/"),
        ]
    )
)
# Files allowed to contain such a name, each with the reason.
ALLOWED: dict[str, str] = {
    "tests/unit/test_cli_ux_flags.py": "asserts that the command line's help text does not cite them",
    "tests/unit/test_self_contained.py": "this test: it spells out what it refuses",
}


def _tracked_files() -> list[Path]:
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split("\0")
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    return [REPO / name for name in listed if name]


def _citations(text: str) -> list[str]:
    return [
        f"line {text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
        for match in FOREIGN_CITATION.finditer(text)
    ]


def test_no_tracked_file_cites_a_design_document_the_project_does_not_contain():
    files = _tracked_files()
    assert len(files) > 100
    found = {}
    for path in files:
        name = str(path.relative_to(REPO))
        if name in ALLOWED or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:  # binary data (images, archives)
            continue
        citations = _citations(text)
        if citations:
            found[name] = citations
    assert found == {}, "cite docs/decisions.md or docs/semantics.md instead"
    assert all(reason.strip() for reason in ALLOWED.values())


def test_the_checker_sees_each_kind_of_foreign_citation():
    assert all(_citations(name) for name in _DESIGN_NAMES)
    assert _citations("see DECISIONS D3\nand INTERFACES" + ".md") == ["line 1: DECISIONS", "line 1: D3", "line 2: INTERFACES.md"]
    assert _citations("the D5 grid") == ["line 1: D5"]
    assert _citations("../" + "shared/design") == ["line 1: ../shared/"]
    # the project's own docs and names that merely contain the letters are fine
    assert _citations("docs/semantics.md §9, docs/decisions.md, PD1, D2H, 3D14, D14") == []


def test_every_decision_the_code_cites_is_an_entry_of_docs_decisions_md():
    decisions = (REPO / "docs" / "decisions.md").read_text(encoding="utf-8")
    titles = set(re.findall(r"^## (.+)$", decisions, flags=re.MULTILINE))
    assert len(titles) >= 15
    cited = set()
    for path in _tracked_files():
        if path.suffix in {".py", ".md"} and path.is_file():
            cited.update(re.findall(r'docs/decisions\.md[,]? ["\'](.+?)["\']', path.read_text(encoding="utf-8")))
            cited.update(re.findall(r'\[decisions\.md\]\(decisions\.md\),? "(.+?)"', path.read_text(encoding="utf-8")))
    assert len(cited) >= 10
    assert sorted(cited - titles) == []
