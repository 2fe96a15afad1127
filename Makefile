# Two commands do everything on a fresh machine with only Python:
#   make demo   – bootstrap .venv, install attn-jax with its extras, run the main job
#                 (the attention showcase, then experiments/bahdanau2015: RNNenc vs RNNsearch, with the Transformer
#                 beside them -> runs/demo/report.md)
#   make test   – the same bootstrap, the docs build (make docs), the test suite, then its `numerics` tests again
#                 on another CPU code path
#   make docs   – the user guide and API reference (docs/, mkdocs.yml) -> site/; any warning fails it
#   make bench  – experiments/benchmarks: side-by-side timings and memory vs jax.nn and PyTorch -> RESULTS.md
#                 (BENCH_ARGS=--quick for the smoke version; installs the CPU PyTorch wheel if torch is missing)
#   make gpu-check – on a GPU (≤ 8 min): the `gpu` tests + bf16 attention/matmul TFLOP/s, RNNsearch, GNMT, remat
#                 -> the gpu-check section of RESULTS.md. Without a GPU it says so, checks each section at tiny
#                 sizes, writes nothing and exits 0. It installs no CUDA wheels: see experiments/benchmarks/README.md
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.attn-jax-installed
EXTRAS ?= all,dev,docs,peers
# Two workers on CI's two cores; a file's tests stay on one worker so module fixtures (trained runs) build once.
# --durations=25: every CI log lists the slowest tests, the ones to trim when the suite outgrows its budget.
# `heavy` tests (multi-process training, whole sharded trainer runs: minutes of compiling each) run in `make test-all`,
# so that `make test` stays within CI's ~15 minutes on 2 cores.
PYTEST_ARGS ?= -n auto --dist loadfile -m "not heavy" --durations=25
# Then `make test` reruns the `numerics` tests (two float32 programs compared at a float32 tolerance; policy in
# tests/conftest.py) with XLA's CPU code generation capped at another ISA, AVX2 by default: on an AVX-512 machine,
# code for a narrower ISA, with its own rounding. A tolerance that holds only on one code path fails here, not on a
# user's machine. XLA_FLAGS replaces tests/conftest.py's defaults, so it repeats them. x86-64 only (the names are x86
# ISAs). NUMERICS_ISAS lists the ISAs, one pass each: "AVX2 SSE4_2" adds 4-lane code without FMA, whose bits differ
# from the default even where AVX2's do not (on this project's Intel machine AVX2 reproduces the default bits).
# This pass also leaves out tests/conftest.py's --xla_cpu_use_fusion_emitters=false (faster compilation, the older
# LLVM IR fusion emitters): the numerics tests run here on the MLIR fusion emitters that users' XLA uses by default.
# Cost and findings: tests/README.md.
NUMERICS_ISAS ?= AVX2
NUMERICS_XLA_FLAGS ?= --xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0
NUMERICS_ARGS ?= -n auto --dist loadfile -m "numerics and not heavy"
ifneq ($(filter x86_64 amd64 AMD64,$(shell uname -m)),)
NUMERICS_PASS = $(foreach isa,$(NUMERICS_ISAS),XLA_FLAGS="$(NUMERICS_XLA_FLAGS) --xla_cpu_max_isa=$(isa)" \
	$(BIN)/python -m pytest $(NUMERICS_ARGS) &&) true
else
NUMERICS_PASS = @echo "numerics pass (--xla_cpu_max_isa=$(NUMERICS_ISAS)) skipped: $$(uname -m) is not x86-64"
endif
DEMO_DIR ?= runs/demo
# PRESET=paper prints the full-size WMT'14 commands (for an accelerator) instead of training here.
PRESET ?= cpu
DEMO_ARGS ?=
BENCH_ARGS ?=
GPU_CHECK_ARGS ?=
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
# Where that index cannot be reached, pip falls back to PIP_FIND_LINKS: one quick retry, not five slow ones.
TORCH_PIP = --retries 1 --timeout 15 --index-url $(TORCH_INDEX)

.PHONY: demo test test-numerics test-all bench gpu-check lint clean install docs

install: $(STAMP)

# The Marian parity tests run transformers on PyTorch: the CPU wheel first, so no CUDA libraries come along.
# Debian's chromium, for the report page's browser tests (tests/test_report_html.py), only when missing.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet torch $(TORCH_PIP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e ".[$(EXTRAS)]"
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || \
		echo "chromium not installed (needs root and apt): the report page's browser tests will skip" >&2
	@touch $@

demo: $(STAMP)
	$(BIN)/python experiments/showcase.py
	$(BIN)/python experiments/bahdanau2015/run.py --out $(DEMO_DIR) --preset $(PRESET) $(DEMO_ARGS)

# The docs build first: a few seconds, and a broken link or a renamed function fails before the tests start.
test: $(STAMP) docs
	$(BIN)/python -m pytest $(PYTEST_ARGS)
	$(NUMERICS_PASS)

test-numerics: $(STAMP)
	$(NUMERICS_PASS)

test-all: $(STAMP)
	$(BIN)/python -m pytest -n auto --dist loadfile
	$(NUMERICS_PASS)

bench: $(STAMP)
	@$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet torch $(TORCH_PIP)
	$(BIN)/python experiments/benchmarks/bench.py --out experiments/benchmarks/RESULTS.md $(BENCH_ARGS)

gpu-check: $(STAMP)
	$(BIN)/python experiments/benchmarks/gpu_check.py --out experiments/benchmarks/RESULTS.md $(GPU_CHECK_ARGS)

# --strict: a warning (a broken link or anchor, a reference to a renamed function, a docstring parameter that is
# not in the signature) fails the build. Not --quiet: it hides the warnings from --strict, and the build passes.
docs: $(STAMP)
	$(BIN)/mkdocs build --strict

lint: $(STAMP)
	$(BIN)/ruff check attn_jax tests experiments configs
	$(BIN)/ruff format --check attn_jax tests experiments configs

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis site
