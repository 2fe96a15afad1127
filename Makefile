# Two commands do everything on a fresh machine with only Python:
#   make demo   – bootstrap .venv, install attn-jax with its extras, run the main job
#                 (the attention showcase, then experiments/bahdanau2015: RNNenc vs RNNsearch, with the Transformer
#                 beside them -> runs/demo/report.md)
#   make test   – the same bootstrap, then the test suite
#   make bench  – experiments/benchmarks: side-by-side timings and memory vs jax.nn and PyTorch -> RESULTS.md
#                 (BENCH_ARGS=--quick for the smoke version; installs the CPU PyTorch wheel if torch is missing)
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attn-jax-installed
EXTRAS ?= all,dev
# Two workers on CI's two cores; a file's tests stay on one worker so module fixtures (trained runs) build once.
# `heavy` tests (multi-process training, whole sharded trainer runs: minutes of compiling each) run in `make test-all`,
# so that `make test` stays within CI's ~15 minutes on 2 cores.
PYTEST_ARGS ?= -n auto --dist loadfile -m "not heavy"
DEMO_DIR ?= runs/demo
# PRESET=paper prints the full-size WMT'14 commands (for an accelerator) instead of training here.
PRESET ?= cpu
DEMO_ARGS ?=
BENCH_ARGS ?=
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: demo test test-all bench lint clean install

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	@touch $@

demo: $(STAMP)
	$(BIN)/python experiments/showcase.py
	$(BIN)/python experiments/bahdanau2015/run.py --out $(DEMO_DIR) --preset $(PRESET) $(DEMO_ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile

bench: $(STAMP)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet torch --index-url $(TORCH_INDEX)
	$(BIN)/python experiments/benchmarks/bench.py --out experiments/benchmarks/RESULTS.md $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check attn_jax tests experiments configs
	$(BIN)/ruff format --check attn_jax tests experiments configs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
