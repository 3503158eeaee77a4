"""`python -m ascendgraph` runs the command line."""

import sys

from ascendgraph.cli import main

sys.exit(main())
