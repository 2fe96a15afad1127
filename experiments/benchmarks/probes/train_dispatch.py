"""A paper-like RNNsearch train step under one malloc and dispatch setting: first step, median step, getrusage.

    PY=/work/main/.venv/bin/python
    for i in 1 2 3; do for v in tuned sync-noarena sync-tuned default; do
        $PY experiments/benchmarks/probes/train_dispatch.py --variant $v --json /tmp/td.jsonl; done; done

Variants (each in its own process: mallopt is process-wide and must come before JAX starts):

* ``default``: glibc's malloc as it is, asynchronous CPU dispatch (JAX's default);
* ``tuned``: ``attn_jax.tune_host_allocator()`` as committed (M_ARENA_MAX=1, M_MMAP_MAX=0, trim 2 GiB - 1);
* ``sync-noarena``: M_MMAP_MAX=0 and the trim threshold only, ``jax_cpu_enable_async_dispatch=False``;
* ``sync-tuned``: the committed setting plus synchronous dispatch;
* ``noarena``: M_MMAP_MAX=0 and the trim threshold only, asynchronous dispatch;
* ``arena2``: the committed setting with M_ARENA_MAX=2 instead of 1, asynchronous dispatch;
* ``threshold``: M_MMAP_THRESHOLD=1 GiB and the trim threshold only, asynchronous dispatch.

Every variant but ``tuned`` and ``sync-tuned`` sets ``ATTN_JAX_HOST_ALLOCATOR=default`` first, so that
``import attn_jax`` leaves glibc's malloc to the variant.

Sizes are row 4's paper-like RNNsearch (V 8000, m 256, n 512, l 256, A 512, B 64, S = T = 30), Adam + clipping.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import resource
import statistics
import sys
import time

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument(
    "--variant",
    default="tuned",
    choices=("default", "tuned", "sync-noarena", "sync-tuned", "noarena", "arena2", "threshold"),
)
p.add_argument("--steps", type=int, default=8)
p.add_argument("--small", action="store_true", help="row 4's bench size instead (V 2000, n 256, B 32)")
p.add_argument("--json", default=None)
args = p.parse_args()
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

t_start = time.perf_counter()
if args.variant in ("tuned", "sync-tuned"):
    import attn_jax

    assert attn_jax.tune_host_allocator().applied
else:
    os.environ["ATTN_JAX_HOST_ALLOCATOR"] = "default"
    # mallopt parameter codes of <malloc.h>
    codes = {"arena": -8, "mmap_max": -4, "mmap_threshold": -3, "trim": -1}
    values = {
        "sync-noarena": {"mmap_max": 0, "trim": (1 << 31) - 1},
        "noarena": {"mmap_max": 0, "trim": (1 << 31) - 1},
        "arena2": {"arena": 2, "mmap_max": 0, "trim": (1 << 31) - 1},
        "threshold": {"mmap_threshold": 1 << 30, "trim": (1 << 31) - 1},
    }.get(args.variant, {})
    libc = ctypes.CDLL("libc.so.6")
    assert all(libc.mallopt(codes[k], v) == 1 for k, v in values.items())
import jax  # noqa: E402
import numpy as np  # noqa: E402

if args.variant.startswith("sync"):
    jax.config.update("jax_cpu_enable_async_dispatch", False)

from harness.context import FULL  # noqa: E402
from rows.rnnsearch import random_batches  # noqa: E402

from attn_jax.models import RNNConfig  # noqa: E402
from attn_jax.train import OptimizerConfig, StepConfig, init_train_state, train_step  # noqa: E402


class _Ctx:
    np = np


if args.small:
    vocab, m, n, lo, a, batch, length = 2000, 128, 256, 128, 128, 32, 30
else:
    vocab, m, n, lo, a, batch, length, _ = FULL.paper_train
model = RNNConfig(src_vocab=vocab, tgt_vocab=vocab, embed=m, hidden=n, maxout=lo, align=a)
cfg = StepConfig(
    model=model, optimizer=OptimizerConfig(name="adam", learning_rate=1e-3, eps=1e-8, clip_norm=1.0)
)
batches = random_batches(_Ctx, 4, batch, length, vocab, seed=3)
t0 = time.perf_counter()
state = init_train_state(cfg, 0)
jax.block_until_ready(state)
init_s = time.perf_counter() - t0
times, used = [], []
for i in range(args.steps + 1):
    os.access(f"/step-{i}", os.F_OK)  # a marker for strace -e trace=access,faccessat2,...
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    state, metrics = train_step(state, batches[i % 4], cfg)
    jax.device_get(metrics)  # what the training loop does each step
    times.append(time.perf_counter() - t0)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    used.append(
        (
            r1.ru_utime - r0.ru_utime,
            r1.ru_stime - r0.ru_stime,
            r1.ru_minflt - r0.ru_minflt,
            r1.ru_nvcsw - r0.ru_nvcsw + r1.ru_nivcsw - r0.ru_nivcsw,
        )
    )
later = used[2:]
row = {
    "variant": args.variant,
    "size": "bench" if args.small else "paper-like",
    "init_s": round(init_s, 2),
    "first_step_s": round(times[0], 2),
    "first_user_s": round(used[0][0], 2),  # compilation: XLA compiles on several threads
    "first_sys_s": round(used[0][1], 2),
    "median_step_s": round(statistics.median(times[1:]), 3),
    "user_s": round(statistics.mean(u[0] for u in later), 3),
    "sys_s": round(statistics.mean(u[1] for u in later), 3),
    "faults": round(statistics.mean(u[2] for u in later)),
    "switches": round(statistics.mean(u[3] for u in later)),
    "load1": round(os.getloadavg()[0], 2),
}
print(json.dumps(row), flush=True)
if args.json:
    with open(args.json, "a") as f:
        f.write(json.dumps(row) + "\n")
