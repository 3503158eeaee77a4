# Two commands on a fresh machine: `make run` (the main job) and `make test` (the test suite).
# Both create .venv and install ascendgraph with its test extra on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ascendgraph-installed

.PHONY: run test test-all bench parity parity-record mutation mutation-rules clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

# The main job: graph mode end to end on the CPU simulator.
run: $(STAMP)
	$(VENV)/bin/ascendgraph run

# The default test suite (no NPU, no vLLM needed), parallel on all cores; worksteal: an idle
# worker takes queued tests from a busy one, so no core waits on the other at the end.
test: $(STAMP)
	$(PY) -m pytest -n auto --dist worksteal

# Everything that runs without an NPU: the default suite plus the slow tests (10,000-example fuzzing).
test-all: $(STAMP)
	$(PY) -m pytest -n auto -m 'not npu and not vllm'

# Differential tests against vLLM 0.32, in their own cached venv (docs/parity.md); what .ci/run does second.
parity:
	"$$(scripts/parity-env.sh | tail -n 1)" -m pytest -m vllm tests/parity -n auto -q -p no:warnings

# Re-record vLLM 0.32's answers (tests/data/vllm_answers.json) that the default suite checks against.
parity-record:
	"$$(scripts/parity-env.sh | tail -n 1)" scripts/record_vllm_answers.py

# Mutation testing (docs/testing.md), a habit and not CI (too slow for .ci/run).
# mutmut over the capture modules ([tool.mutmut] in pyproject.toml; results cached in mutants/,
# a rerun tests only the mutants of changed functions); MUTATION_ARGS names mutants, e.g.
# MUTATION_ARGS='ascendgraph.runtime.params.*'.
mutation: $(STAMP)
	$(VENV)/bin/mutmut run --max-children 2 $(MUTATION_ARGS)
	$(VENV)/bin/mutmut results

# The rule modules (modes, sizes, resolve, dispatch) with the project's own AST mutation runner;
# MUTATION_RULES_ARGS="--max 20 ascendgraph/sizes.py" narrows a run.
mutation-rules: $(STAMP)
	$(PY) scripts/mutate.py $(MUTATION_RULES_ARGS)

bench: $(STAMP)
	$(PY) -m bench

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis mutants
