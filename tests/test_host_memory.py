"""`import attn_jax` sets the host allocator: XLA's temp buffer is reused, not page-faulted in again, never silently.

Each case runs in a fresh process (the setting is process-wide and must come before JAX starts) that does nothing
but ``import attn_jax`` (after a JAX computation in the "late" case) and then reads the answer: a jitted program
whose ``[4096, 4096]`` float32 intermediate (64 MiB, beyond glibc's largest mmap threshold) lives in XLA's temp
buffer is called three times, and the minor page faults of each call are counted with ``getrusage``.
"""

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="the setting is glibc's mallopt"
)

_SCRIPT = textwrap.dedent(
    """
    import json, resource, sys
    if sys.argv[1] == "late":
        import jax.numpy as jnp
        jnp.ones(1).block_until_ready()
    import attn_jax
    answer = attn_jax.host_allocator()
    again = attn_jax.tune_host_allocator()  # the old explicit call: the same answer, nothing set twice
    light = not any(m in sys.modules for m in ("flax", "optax", "orbax"))  # usable with the core install only
    import jax, jax.numpy as jnp
    f = jax.jit(lambda x, w: (jnp.tanh(x @ w) @ w.T).sum())  # x @ w: [4096, 4096] in the temp buffer
    x, w = jnp.full((4096, 64), 0.01), jnp.ones((64, 4096))
    faults = []
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        f(x, w).block_until_ready()
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    print(json.dumps({"applied": answer.applied, "message": answer.message, "same": again == answer, "light": light,
                      "faults": faults}))
    """
)
_PAGES = 4096 * 4096 * 4 // 4096  # the intermediate's 4 KiB pages: what each call faults in afresh by default


def _run(when: str, setting: str | None = None) -> dict:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("ATTN_JAX_HOST_ALLOCATOR", None)
    if setting is not None:
        env["ATTN_JAX_HOST_ALLOCATOR"] = setting
    done = subprocess.run(
        [sys.executable, "-c", _SCRIPT, when], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "stderr": done.stderr}


def _huge_pages_always() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="utf-8") as f:
            return "[always]" in f.read()
    except OSError:
        return False


def test_import_alone_applies_it_and_the_temp_buffer_is_reused():
    out = _run("early")
    assert out["applied"] and out["same"] and out["light"]
    assert "M_ARENA_MAX=1" in out["message"] and "ATTN_JAX_HOST_ALLOCATOR=default" in out["message"]
    assert "host allocator" not in out["stderr"]  # logged at INFO: quiet unless the user configures logging
    # The first call grows the heap; later calls reuse it: far fewer faults than one per page. The second call
    # may still fault in a few MiB that something else in the process allocated; the last one settles.
    assert max(out["faults"][1:]) < _PAGES // 10 and out["faults"][-1] < _PAGES // 20, out["faults"]


def test_opt_out_keeps_glibc_default_which_faults_the_buffer_in_every_call():
    out = _run("early", setting="default")
    assert (
        not out["applied"]
        and out["message"] == "host allocator: glibc's default (ATTN_JAX_HOST_ALLOCATOR=default)"
    )
    if not _huge_pages_always():  # with transparent huge pages always on, a fault brings in 2 MiB, not 4 KiB
        # What the setting removes: without it, each call page-faults the whole intermediate in again.
        assert min(out["faults"][1:]) > _PAGES // 2, out["faults"]


def test_a_process_that_started_jax_first_is_told_so_and_unknown_settings_are_named():
    late = _run("late")
    assert not late["applied"] and "JAX had already started" in late["message"]
    assert "import attn_jax before the first JAX computation" in late["message"]
    assert late["message"] in late["stderr"]  # a WARNING of the "attn_jax" logger: shown without set-up
    odd = _run("early", setting="jemalloc")
    assert (
        not odd["applied"]
        and "ATTN_JAX_HOST_ALLOCATOR='jemalloc' is neither 'keep' nor 'default'" in odd["message"]
    )
    assert odd["message"] in odd["stderr"]
