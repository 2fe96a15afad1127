"""Strict test set-up: 8 fake CPU devices (set before jax is imported), a PRNG-key fixture, markers."""

import os

# Must happen before the first `import jax` anywhere in the test session (subprocesses inherit both).
# XLA's backend (LLVM) optimisation level 0: the suite's time is mostly compiling many small programs that then run
# a few times, and level 0 halves a CPU compilation (an RNNsearch train step 7 s -> 4 s, its initialiser 10 s -> 4 s)
# while programs this small run about as fast (the 300-step Transformer overfitting test: 15.7 s -> 11.3 s; the
# bahdanau2015 smoke run, a subprocess: 122 s -> 98 s). It is a code-generation setting (tests/test_gnmt_sharded.py
# used it per program already): the tests that read compiled HLO or its memory analysis pass unchanged, and results
# can differ from level 2 only in the last bit (e.g. where LLVM contracts a multiply-add), far inside every
# tolerance here. An XLA_FLAGS set by the caller replaces both flags.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

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


def pytest_collection_modifyitems(config, items):
    if jax.default_backend() == "cpu":
        skip_gpu = pytest.mark.skip(reason="needs an accelerator")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip_gpu)
