"""What tests that start a pytest of their own pass it.

``-p no:hypothesispytest``: Hypothesis's pytest plugin imports all of Hypothesis in its
end-of-session summary (``pytest_terminal_summary`` imports ``hypothesis.internal.observability``),
about 1 s per inner pytest, and no inner suite here uses Hypothesis.
"""

NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
