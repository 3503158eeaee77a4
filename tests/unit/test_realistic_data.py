"""tests/realistic_data.py: seeded, and Faker only where a test asks for the data (never at
pytest's start-up, at collection, or in an `ascendgraph` command)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_same_seed_gives_the_same_data_and_another_seed_other_data():
    from tests.realistic_data import file_names, nested_paths, prompts

    assert prompts(1, seed=1) == prompts(1, seed=1) != prompts(1, seed=2)
    assert file_names(2, seed=1) == file_names(2, seed=1) != file_names(2, seed=2)
    assert nested_paths(4, seed=1) == nested_paths(4, seed=1) != nested_paths(4, seed=2)
    assert any(not text.isascii() for _, text in prompts(1, seed=1)), "non-Latin scripts are in the mix"


def test_faker_is_imported_only_inside_functions():
    top_level = []
    for root in ("ascendgraph", "sim", "hw", "tests", "bench"):
        for path in (REPO / root).rglob("*.py"):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in tree.body:  # module level only; imports inside functions are fine
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                if any(name.split(".")[0] == "faker" for name in names):
                    top_level.append(str(path.relative_to(REPO)))
    assert top_level == []
    library = [str(p.relative_to(REPO)) for root in ("ascendgraph", "sim", "hw") for p in (REPO / root).rglob("*.py")
               if "faker" in p.read_text(encoding="utf-8").lower()]
    assert library == [], "the library never uses Faker"


def test_importing_the_generators_and_the_engine_leaves_faker_unimported():
    code = ("import sys; import tests.realistic_data, ascendgraph.runtime.engine, ascendgraph.cli.app; "
            "print('faker' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"
