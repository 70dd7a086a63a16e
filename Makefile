# `make help` lists the targets. The venv is created on first use by every target that needs it.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
WORKERS ?= 4
# The gradual profile peaks here (lines/s). Each worker stands for a host with RUN_CPU CPUs (a cgroup quota,
# root): one sustains ~6,000-8,000 lines/s, so the job grows from 1 worker to 3 or 4 at the peak and back, the local
# provider starting and stopping the worker processes (RUN_CPU= runs unquota'd).
RUN_MAX_RATE ?= 20000
RUN_CPU ?= $(shell [ "$$(id -u)" = 0 ] && echo 0.3)
RUN_MAX_WORKERS ?= 4
PYTEST_ARGS ?=
# XDIST runs tests/cluster on two pytest processes (pytest-xdist, in the dev extra; `XDIST=` runs it on one): a
# cluster test spends much of its time waiting (processes starting, a heartbeat, a recovery), which the other
# process fills. Each file stays on one process, its tests in order (a module-scoped cluster is started once).
# On one process the cluster suite takes ~16 min on this 2-core host, on two ~8.5 min.
XDIST ?= -n 2 --dist loadfile

.DEFAULT_GOAL := help

$(BIN)/clasp: pyproject.toml setup.py clasp/core/_kernels.c
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/clasp

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(BIN)/clasp ## create .venv and install clasp with its dev extra

# The unit suite is ~2 minutes of CPU; the cluster suite mostly waits on its processes: `make test` runs the
# unit suite beside it (its report printed after the cluster suite's), and fails if either fails.
test: $(BIN)/clasp ## the whole suite: tests/unit (no processes) beside tests/cluster (real planner and workers)
	@unit_log=$$(mktemp); \
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/unit $(PYTEST_ARGS) > $$unit_log 2>&1 & unit=$$!; \
	$(BIN)/python -m pytest -q $(XDIST) tests/cluster $(PYTEST_ARGS); cluster=$$?; \
	wait $$unit; units=$$?; echo "---- tests/unit"; cat $$unit_log; rm -f $$unit_log; \
	echo "tests/cluster exit $$cluster, tests/unit exit $$units"; [ $$cluster = 0 ] && [ $$units = 0 ]

test-unit: $(BIN)/clasp ## the unit tests only: pure code and in-process parts, no planner or worker processes
	$(BIN)/python -m pytest -q $(XDIST) tests/unit $(PYTEST_ARGS)

test-cluster: $(BIN)/clasp ## the cluster tests only: real planner and worker processes, real faults
	$(BIN)/python -m pytest -q $(XDIST) tests/cluster $(PYTEST_ARGS)

lint: $(BIN)/clasp ## ruff, and the layer contracts of docs/ARCHITECTURE.md (import-linter)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

cluster: $(BIN)/clasp ## start a local cluster in the foreground (WORKERS=N, default 4); Ctrl-C stops it
	$(BIN)/clasp cluster --workers $(WORKERS)

run: $(BIN)/clasp ## the main job: Word Count on a local cluster under a gradual input profile
	@mkdir -p out
	$(BIN)/clasp run wc --workers 1 --max-workers $(RUN_MAX_WORKERS) $(if $(RUN_CPU),--cpu-per-worker $(RUN_CPU)) \
		--profile gradual --max-rate $(RUN_MAX_RATE) --plot out/run.png --json out/run.json

bench: $(BIN)/clasp ## every paper figure in quick mode: out/bench/FIG.png and FIG.json (docs/results.md)
	$(BIN)/clasp bench all --quick --out out/bench

bench-runtime: $(BIN)/clasp ## the runtime's own benchmarks: chains, ingest, alpha and beta (JSON on stdout)
	$(BIN)/python -m clasp.bench.runtime

.PHONY: help install test test-unit test-cluster lint cluster run bench bench-runtime
