"""`python -m ascendgraph` runs the command line."""

import sys

from ascendgraph.cli.app import main

sys.exit(main())
