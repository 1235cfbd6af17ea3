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
# the tests write bytecode (beside the sources, in __pycache__, as Python does) even where
# the environment sets PYTHONDONTWRITEBYTECODE, and lifecycle's is compiled once before the
# suite starts: else each pytest process rewrites every test module's assertions and compiles
# lifecycle again, as does every `lifecycle` or worker process the tests start. (Bytecode
# kept under a PYTHONPYCACHEPREFIX instead would not find what pip compiled at install, and
# each fresh clone compiled every library again: 12 s more CPU starting four processes.)
TEST_ENV := PYTHONDONTWRITEBYTECODE=
COMPILE := $(BIN)/python -m compileall -q -j0 lifecycle tests benchmarks

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
	$(TEST_ENV) $(COMPILE)
	$(TEST_ENV) $(BIN)/python -m pytest -n $(TEST_JOBS) $(PYTEST_ARGS)

# the whole suite again with every core kept busy: no test may depend on the machine's speed
test-loaded: $(STAMP)
	$(TEST_ENV) $(COMPILE)
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
	find lifecycle tests benchmarks -name __pycache__ -prune -exec rm -rf {} +
