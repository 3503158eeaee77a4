"""The command line: one module per subcommand, plus the translation of pasted `vllm serve` lines.

`main(argv)` is the console script `ascendgraph`.
"""

from ascendgraph.cli.app import main

__all__ = ["main"]
