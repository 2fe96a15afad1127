"""Put this folder first on PYTHONPATH to run every Python process (test subprocesses too) with synchronous CPU
dispatch, ``jax_cpu_enable_async_dispatch=False``: JAX reads no environment variable for that flag.

    PYTHONPATH=experiments/benchmarks/probes/sync_site:. ATTN_JAX_TEST_FAST_COMPILE=1 \
        .venv/bin/python -m pytest -p no:xdist -q tests/test_multiprocess.py
"""

import jax

jax.config.update("jax_cpu_enable_async_dispatch", False)
