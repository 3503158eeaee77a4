"""The device conformance suite (ascendgraph.testing.conformance), collected here.

Each case runs on sim in the default run and on npu under ``-m npu``.
"""

from ascendgraph.testing.conformance import CASES

globals().update(CASES)
