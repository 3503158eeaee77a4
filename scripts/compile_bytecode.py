"""Compile the project's Python bytecode into ``__pycache__`` (what ``pip install`` does for an
installed package), for `make run`, `make test` and the benchmarks.

Why: an editable install runs the modules from this tree, and with ``PYTHONDONTWRITEBYTECODE``
set (as in many containers and CI images) Python compiles every module it imports from source
again in every process and never keeps the result. Each ``ascendgraph`` command and each child
process a test starts then spends about 0.2 s compiling ascendgraph and the simulator.
``compileall`` writes the bytecode whatever that variable says; Python reads it back only while
it matches its source (size and modification time), so an edited module is compiled from source
again until the next run of this script, never run stale. Up to date, the script takes about
0.15 s; from scratch about 0.6 s on two cores.

Usage: ``python scripts/compile_bytecode.py`` (it takes no arguments; the tree is the one the
script sits in). Quiet; exit 1 when a module does not compile, with compileall's message on
stderr.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import os
import sys
from typing import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The trees whose modules processes import: the packages, the tests' own helper modules (pytest
# rewrites test modules and conftest files with its own cache, not these) and the benchmarks.
BYTECODE_DIRS = ("ascendgraph", "ascendgraph_npu_facade", "sim", "hw", "tests", "bench")


def compile_project(root: str = ROOT) -> bool:
    """Compile every module of `BYTECODE_DIRS` under ``root`` that is out of date; False when one
    does not compile."""
    ok = True
    with _stdout_to_stderr():
        for name in BYTECODE_DIRS:
            path = os.path.join(root, name)
            if os.path.isdir(path):
                ok = compileall.compile_dir(path, quiet=1, workers=0) and ok
    return ok


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """compileall reports a module that does not compile on stdout, from its worker processes
    too: a log, not a result, so file descriptor 1 points at stderr meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):  # what this process prints itself
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


if __name__ == "__main__":
    argparse.ArgumentParser(prog="scripts/compile_bytecode.py", description=__doc__.split("\n\n")[0]).parse_args()
    sys.exit(0 if compile_project() else 1)
