# Two commands do everything on a fresh machine with only Python:
#   make demo   – bootstrap .venv, install attn-jax with its extras, run the main job
#                 (for now: the attention showcase, then RNNsearch trained on the built-in corpus and evaluated)
#   make test   – the same bootstrap, then the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attn-jax-installed
EXTRAS ?= all,dev
# Two workers on CI's two cores; a file's tests stay on one worker so module fixtures (trained runs) build once.
PYTEST_ARGS ?= -n auto --dist loadfile
DEMO_DIR ?= runs/demo

.PHONY: demo test lint bench clean install

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	@touch $@

demo: $(STAMP)
	$(BIN)/python experiments/showcase.py
	rm -rf $(DEMO_DIR)/rnnsearch_cpu
	$(BIN)/attn-jax train --config configs/rnnsearch_cpu.py --workdir $(DEMO_DIR)/rnnsearch_cpu
	$(BIN)/attn-jax evaluate --workdir $(DEMO_DIR)/rnnsearch_cpu --split test --max-examples 70 --beam 4
	@echo "demo done: training metrics in $(DEMO_DIR)/rnnsearch_cpu/metrics.jsonl, evaluation in $(DEMO_DIR)/rnnsearch_cpu/eval/test"

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check attn_jax tests experiments configs
	$(BIN)/ruff format --check attn_jax tests experiments configs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
