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

.DEFAULT_GOAL := help

$(BIN)/clasp: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(BIN)/clasp

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(BIN)/clasp ## create .venv and install clasp with its dev extra

test: $(BIN)/clasp ## the whole suite: tests/unit (no planner or worker processes), then tests/cluster (real ones)
	$(BIN)/python -m pytest -q tests/unit tests/cluster $(PYTEST_ARGS)

test-unit: $(BIN)/clasp ## the unit tests only: pure code and in-process parts, no planner or worker processes
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

test-cluster: $(BIN)/clasp ## the cluster tests only: real planner and worker processes, real faults
	$(BIN)/python -m pytest -q tests/cluster $(PYTEST_ARGS)

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
