# Every target sets itself up: a fresh machine needs nothing but python3.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
RUNTIME := $(VENV)/.runtime-installed
STAMP := $(VENV)/.installed

# the suite runs in this many processes (pytest-xdist); much of its time is spent waiting for
# databases, Slurm, Chromium and worker processes, so four share even a small machine well
# (on 2 idle cores, a fresh clone's suite: 2:57 of pytest with four, 3:18 with two)
TEST_JOBS ?= 4
# the tests' bytecode is kept (in .venv, not beside the sources) even where the environment
# sets PYTHONDONTWRITEBYTECODE: without it every pytest process (the main one and each xdist
# worker) rewrites the assertions of every test module again, and every `lifecycle` or worker
# process the tests start compiles lifecycle from source (about half of collecting's CPU)
TEST_ENV := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX="$(CURDIR)/$(VENV)/pycache"

.PHONY: demo test test-loaded bench lint diagrams docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# the demo needs lifecycle's own dependencies only; the tests add their tools and the real
# HTCondor bindings and SMTP server they check formats against
$(RUNTIME): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e '.[test]'
	# TARDIS's adapters (its pydantic<2 pin is for its REST service, which is not used)
	$(BIN)/python -m pip install --quiet --no-deps 'cobald-tardis>=0.8'
	touch $(STAMP)

$(VENV)/.docs-installed: $(RUNTIME)
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

$(VENV)/.bench-installed: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

demo: $(RUNTIME)
	$(BIN)/lifecycle demo

test: $(STAMP)
	$(TEST_ENV) $(BIN)/python -m pytest -n $(TEST_JOBS) $(PYTEST_ARGS)

# the whole suite again with every core kept busy: no test may depend on the machine's speed
test-loaded: $(STAMP)
	$(TEST_ENV) $(BIN)/python tests/under_load.py $(BIN)/python -m pytest -n $(TEST_JOBS) $(PYTEST_ARGS)

bench: $(VENV)/.bench-installed
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

# every built-in machine's diagram: diagrams/<machine>.mmd, .dot, .svg (with Graphviz's dot)
diagrams: $(RUNTIME)
	$(BIN)/lifecycle diagrams --dir diagrams

# the documentation site, from docs/ (mkdocs.yml), into site/; --strict: a broken link,
# anchor or API reference, or a page left out of the nav, fails the build (never --quiet:
# it drops the warnings before --strict counts them)
docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check lifecycle tests benchmarks mkdocs_hooks.py
	$(BIN)/mypy lifecycle

clean:
	rm -rf $(VENV) site lifecycle.db lifecycle.db-wal lifecycle.db-shm
