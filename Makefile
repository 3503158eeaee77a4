# Two commands on a fresh machine: `make run` (the main job) and `make test` (the test suite).
# Both create .venv and install ascendgraph with its test extra on first use.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ascendgraph-installed

.PHONY: run test test-all bytecode typecheck bench parity parity-record vllm-ascend-env vllm-ascend ray mutation mutation-rules npu-device clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	touch $(STAMP)

# The simulated NPU's torch device (sim/npu_device, a C++ extension): built with g++ and ninja into
# the cache once per machine, found there afterwards (about a second). A failed build prints one
# line and does not stop `make test`: the CPU simulator does not need the extension.
npu-device: $(STAMP)
	-$(PY) -m sim.npu_device

# The project's bytecode, compiled where it is out of date (scripts/compile_bytecode.py says why:
# with PYTHONDONTWRITEBYTECODE set, every process would compile ascendgraph from source again).
bytecode: $(STAMP)
	$(PY) scripts/compile_bytecode.py

# The main job: graph mode end to end on the CPU simulator.
run: $(STAMP) bytecode
	$(VENV)/bin/ascendgraph run

# The default test suite (no NPU, no vLLM needed), parallel on all cores; worksteal: an idle
# worker takes queued tests from a busy one, so no core waits on the other at the end.
test: $(STAMP) npu-device bytecode
	$(PY) -m pytest -n auto --dist worksteal

# The type checker over ascendgraph/, ascendgraph_npu_facade/, sim/ and hw/ ([tool.mypy] in pyproject.toml); .ci/run runs it.
typecheck: $(STAMP)
	$(PY) -m mypy

# Everything that runs without an NPU: the default suite plus the slow tests (10,000-example fuzzing).
test-all: $(STAMP) npu-device bytecode
	$(PY) -m pytest -n auto -m 'not npu and not vllm and not vllm_ascend and not ray'

# Differential tests against vLLM 0.32, in their own cached venv (docs/parity.md); what .ci/run does second.
parity:
	"$$(scripts/parity-env.sh | tail -n 1)" -m pytest -m vllm tests/parity -n auto -q -p no:warnings

# Re-record vLLM 0.32's answers (tests/data/vllm_answers.json) that the default suite checks against.
parity-record:
	"$$(scripts/parity-env.sh | tail -n 1)" scripts/record_vllm_answers.py

# vLLM Ascend's own graph-mode code on the simulator's torch_npu facade (docs/vllm-ascend.md).
# VLLM_ASCEND_SRC=/path/to/your/vllm-ascend runs your working copy instead of the snapshot.
# The environment is cached (scripts/vllm-ascend-env.sh); .venv-vllm-ascend links to it. loadfile keeps a
# module's tests on one worker: the model runner's module builds each served configuration once.
VLLM_ASCEND_PYTEST_ARGS ?= -n auto --dist loadfile
vllm-ascend-env:
	env_out="$$(scripts/vllm-ascend-env.sh)" && \
		ln -sfn "$$(dirname "$$(dirname "$$(printf '%s\n' "$$env_out" | tail -n 1)")")" .venv-vllm-ascend

vllm-ascend: vllm-ascend-env
	.venv-vllm-ascend/bin/python -m sim.facade -- .venv-vllm-ascend/bin/python -m pytest -m vllm_ascend \
		tests/vllm_ascend -q -p no:cacheprovider -p no:warnings $(VLLM_ASCEND_PYTEST_ARGS)

# `ascendgraph scenario run --ray` on a local Ray instance against the serial run, in its own cached
# venv with the optional `ray` extra (scripts/ray-env.sh; docs/ranks.md "Many machines").
ray:
	"$$(scripts/ray-env.sh | tail -n 1)" -m pytest -m ray tests/ranks/test_ray.py -q -p no:cacheprovider -p no:xdist

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
	rm -rf $(VENV) .pytest_cache .hypothesis mutants .venv-vllm-ascend
