"""The command line: one module per subcommand, plus the translation of pasted `vllm serve` lines.

`main(argv)` is the console script `ascendgraph`. It imports the command line only when
called, so a Ctrl-C while the modules load is exit 130 like a Ctrl-C later (no traceback).
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

__all__ = ["main"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        from ascendgraph.cli.app import main as app_main
    except KeyboardInterrupt:
        try:
            sys.stderr.write("ascendgraph: interrupted\n")
        except (OSError, ValueError, AttributeError):
            pass
        return 130
    return app_main(argv)
