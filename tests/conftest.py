"""Strict test set-up: 8 fake CPU devices (set before jax is imported), a PRNG-key fixture, markers."""

import os

# Must happen before the first `import jax` anywhere in the test session.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
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
