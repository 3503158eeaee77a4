"""What tests that start a pytest of their own pass it.

`UNUSED_PLUGINS_OFF` turns off two plugins of the test extra that no inner suite here uses:

* ``-p no:hypothesispytest``: Hypothesis's pytest plugin imports all of Hypothesis in its
  end-of-session summary (``pytest_terminal_summary`` imports ``hypothesis.internal.observability``),
  about 1 s per inner pytest;
* ``-p no:faker``: Faker's plugin imports Faker with all its locales when pytest loads it
  (about 0.45 s of CPU per inner pytest); the project's own pytest has it off in pyproject.toml's
  addopts, an inner project's pytest does not read those.

In-process inner sessions (pytester's ``runpytest_inprocess``) pass it too: pytester restores
``sys.modules`` after each run, so every such session imported (and assertion-rewrote) both
plugins' packages again, about 0.9 s each.
"""

UNUSED_PLUGINS_OFF = ("-p", "no:hypothesispytest", "-p", "no:faker")
