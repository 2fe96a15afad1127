# Two commands do everything on a fresh machine with only Python:
#   make demo   – bootstrap .venv, install attn-jax with its extras, run the main job
#   make test   – the same bootstrap, then the test suite
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attn-jax-installed
EXTRAS ?= all,dev
PYTEST_ARGS ?=

.PHONY: demo test lint bench clean install

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	@touch $@

demo: $(STAMP)
	$(BIN)/python experiments/showcase.py

test: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check attn_jax tests experiments configs
	$(BIN)/ruff format --check attn_jax tests experiments configs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
