"""Strict test set-up: 8 fake CPU devices (set before jax is imported), a PRNG-key fixture, markers.

Tolerance policy (the whole suite follows it; tests/README.md points here):

* **Bitwise** (``assert_array_equal``, ``==``) only where the *same* compiled program runs twice: determinism,
  exact resume, kill/resume, a saved-and-restored state, the same jitted function on inputs that differ only where
  the result must not look (padded content whose weights are exact zeros), two traces that lower to the same
  program (a default that dispatches to the path it names). Also for exact arithmetic: integers, booleans, masks,
  tokens, and float values every float32 program computes exactly (hand-computed small integers, exact zeros).
* **Two float32 programs that agree mathematically** (jit vs eager, padded vs truncated, fused vs plain, vmap vs
  loop, sharded vs single device, traced vs static, scan of steps vs all at once, ours vs a float32 peer such as
  jax.nn or Flax): ``tests.tolerance.assert_close_f32(actual, desired, reduction=n)``, whose tolerance
  ``max(1e-5, 8 · eps32 · √n)`` follows float32 rounding and the length n of the reductions, relative to each
  entry and to the array's largest entry (derivation in tests/tolerance.py). Never a hand-picked 1e-6: which
  way XLA rounds depends on the CPU's vector width (AVX-512, AVX2, SSE), so a test tighter than float32
  rounding passes on one machine and fails on the next. A comparison whose error is amplified beyond one
  program's rounding (several training steps, an optimizer step that divides by √v) keeps its own tolerance
  with a comment saying why.
* **Against a float64 reference** (tests/reference): ~1e-5 relative in float32, looser for bf16/fp16 with a
  comment saying why; these are unchanged by the above.

Tests marked ``numerics`` (the two-float32-program comparisons of the attention core) run a second time in
``make test`` with ``XLA_FLAGS=... --xla_cpu_max_isa=AVX2`` (Makefile ``NUMERICS_ISAS``): XLA then generates code for
a narrower ISA than an AVX-512 machine's default, so a tolerance that holds only on one code path fails here first and
not on a user's. Costs and findings: tests/README.md.
"""

import os

# Must happen before the first `import jax` anywhere in the test session (subprocesses inherit both).
# XLA's backend (LLVM) optimisation level 0: the suite's time is mostly compiling many small programs that then run
# a few times, and level 0 halves a CPU compilation (an RNNsearch train step 7 s -> 4 s, its initialiser 10 s -> 4 s)
# while programs this small run about as fast (the 300-step Transformer overfitting test: 15.7 s -> 11.3 s; the
# bahdanau2015 smoke run, a subprocess: 122 s -> 98 s). It is a code-generation setting (tests/test_gnmt_sharded.py
# used it per program already): the tests that read compiled HLO or its memory analysis pass unchanged, and results
# can differ from level 2 only in the last bit (e.g. where LLVM contracts a multiply-add), far inside every
# tolerance here. An XLA_FLAGS set by the caller replaces both flags.
#
# --xla_cpu_use_fusion_emitters=false: XLA's CPU backend then emits its fusions with the older LLVM IR emitters
# instead of the MLIR fusion emitters, which compile 3-4x faster for this suite's small programs (tests/test_multihead.py:
# backend compilation 16.0 s -> 4.3 s for the same 147 programs; tests/README.md "Time budget" has the whole suite).
# It changes which code computes a fusion, never what it computes: every comparison here is bitwise only for one
# program run twice, or at a float32 tolerance. The users' default (the MLIR emitters) stays tested where code
# generation matters: `make test`'s second pass reruns the `numerics` tests without this flag (Makefile). XLA aborts
# on a flag it does not know, so a jax that has dropped it is probed once, in a subprocess, and the suite then runs
# without it (the pytest header says so).
FAST_COMPILE_FLAG = "--xla_cpu_use_fusion_emitters=false"
TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0"  # what every jax subprocess of a test adds to its own flags
)


def _xla_knows(flag: str) -> bool:
    import subprocess
    import sys

    probe = "import jax.numpy as jnp; jnp.add(jnp.zeros(2), 1).block_until_ready()"
    env = {**os.environ, "XLA_FLAGS": flag, "JAX_PLATFORMS": "cpu"}
    try:
        done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False  # a machine too busy to answer: the flag is left out, and the header says so
    return done.returncode == 0


if "XLA_FLAGS" not in os.environ:
    # pytest-xdist's workers inherit this process's environment, so only the first process probes.
    if os.environ.get("ATTN_JAX_TEST_FAST_COMPILE") is None:
        os.environ["ATTN_JAX_TEST_FAST_COMPILE"] = "1" if _xla_knows(FAST_COMPILE_FLAG) else "0"
    if os.environ["ATTN_JAX_TEST_FAST_COMPILE"] == "1":
        TEST_XLA_FLAGS += " " + FAST_COMPILE_FLAG
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8 " + TEST_XLA_FLAGS
else:
    TEST_XLA_FLAGS = " ".join(f for f in os.environ["XLA_FLAGS"].split() if "device_count" not in f)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# PyTorch (the parity tests' peers, the bench's) runs its CPU threads on OpenMP, whose idle threads spin by
# default: beside the other test worker they take its core and slow both (tests/README.md "Time budget").
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# JAX compiles on first use of each shape: hypothesis' per-example deadline would flag compilation as slowness.
settings.register_profile(
    "attn_jax", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("attn_jax")


@pytest.fixture
def key():
    """A fresh, fixed PRNG key per test."""
    return jax.random.key(0)


@pytest.fixture
def rng():
    """A fixed NumPy generator per test, for float64 reference inputs."""
    return np.random.default_rng(0)


# The files that take longest (CPU seconds of a whole `make test`, measured with --durations; tests/README.md),
# longest first. `--dist loadfile` hands files to the two workers in collection order, so collecting these first
# is longest-processing-time-first scheduling: without it a long file collected late ran alone for minutes at
# the end while the other worker idled. The rest keep their order. A file missing here only costs balance.
LONGEST_FILES = (
    "test_bench_quick.py",
    "test_experiment_bahdanau2015.py",
    "test_readme_own_corpus.py",
    "test_marian_import.py",
    "test_remat.py",
    "test_train_preempt.py",
    "test_report_html.py",
    "test_train_validation_bleu.py",
    "test_export.py",
    "test_lowering.py",
    "test_train_accumulate.py",
    "test_transformer.py",
    "test_train_ema_run.py",
    "test_joint_vocab.py",
    "test_data_prepared.py",
    "test_local_window.py",
    "test_checkpoint_damage.py",
    "test_own_model.py",
    "test_multiprocess_failures.py",
    "test_gqa.py",
    "test_cli_evaluate.py",
    "test_decoding.py",
    "test_sparse_dot_product.py",
    "test_train_loop.py",
    "test_train_resume.py",
    "test_doctests.py",
    "test_cli_papercuts.py",
    "test_sharded_step.py",
    "test_models_rnn.py",
    "test_gnmt.py",
    "test_normalizers.py",
)


def pytest_report_header(config):
    fast = os.environ.get("ATTN_JAX_TEST_FAST_COMPILE")
    note = {
        "0": f" ({FAST_COMPILE_FLAG} left out: this jax refused it, or its probe timed out)",
        None: " (set by the caller)",
    }
    return f"XLA_FLAGS: {os.environ['XLA_FLAGS']}{note.get(fast, '')}"


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    if jax.default_backend() == "cpu":
        skip_gpu = pytest.mark.skip(reason="needs an accelerator")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
