"""`python -m ascendgraph` runs the command line (as the ``ascendgraph`` script does)."""

from ascendgraph.cli import console_main

console_main()
