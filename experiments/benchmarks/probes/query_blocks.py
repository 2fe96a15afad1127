"""Block sizes of the chunked attention kernel on the CPU: forward and forward + backward times per block shape.

    PY=.venv/bin/python
    $PY experiments/benchmarks/probes/query_blocks.py --lengths 1024,2048,4096 --blocks 512x512,1024x512,1024x1024
    $PY experiments/benchmarks/probes/query_blocks.py --lengths 768,1024 --blocks 0x0,512x512,1024x512 --allocator default
    $PY experiments/benchmarks/probes/query_blocks.py --lengths 1024,2048 --blocks 512x512,1024x512 --causal

A block ``QxK`` runs ``chunked_dot_product_attention(query_chunk=Q, key_chunk=K)``; ``0x0`` is the plain path
(``implementation="xla"``). B 4, H 8, K 64, float32. The variants are timed in alternation, round by round, so
the machine's noise hits each alike. One JSON line per (L, block, pass): the median over rounds and each round's
median. ``--allocator default`` leaves glibc's malloc as it is, as in a library user's process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--lengths", default="1024,2048,4096")
p.add_argument("--blocks", default="512x512,1024x512,1024x1024,2048x512")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--causal", action="store_true")
p.add_argument("--allocator", choices=("tuned", "default"), default="tuned")
args = p.parse_args()
os.environ["JAX_PLATFORMS"] = "cpu"
sys.path.insert(
    0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
)
import attn_jax  # noqa: E402

if args.allocator == "tuned":
    assert attn_jax.tune_host_allocator().applied
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from attn_jax.attention import chunked_dot_product_attention, dot_product_attention  # noqa: E402

B, H, K = 4, 8, 64


def timed(fn, operands, calls: int) -> float:
    """Median milliseconds of ``calls`` calls."""
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        jax.block_until_ready(fn(*operands))
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def attention(bq: int, bk: int):
    if bq == 0:
        return lambda q, k, v: dot_product_attention(q, k, v, implementation="xla", causal=args.causal)
    return lambda q, k, v: chunked_dot_product_attention(
        q, k, v, query_chunk=bq, key_chunk=bk, causal=args.causal
    )


for length in (int(x) for x in args.lengths.split(",")):
    rng = np.random.default_rng(0)
    q, k, v, g = (jnp.asarray(rng.standard_normal((B, H, length, K)), jnp.float32) for _ in range(4))
    programs = {}
    for spec in args.blocks.split(","):
        bq, bk = (int(n) for n in spec.split("x"))
        f = attention(bq, bk)
        programs[(spec, "fwd")] = (jax.jit(f), (q, k, v))
        programs[(spec, "fwd+bwd")] = (
            jax.jit(lambda q, k, v, g, f=f: jax.vjp(f, q, k, v)[1](g)),
            (q, k, v, g),
        )
    for fn, operands in programs.values():  # compile and warm up
        jax.block_until_ready(fn(*operands))
    runs = {key: [] for key in programs}
    for _ in range(args.rounds):
        for key, (fn, operands) in programs.items():
            runs[key].append(timed(fn, operands, 5 if length <= 1024 else 3))
    for (spec, kind), ms in runs.items():
        record = {
            "L": length,
            "block": spec,
            "pass": kind,
            "causal": args.causal,
            "allocator": args.allocator,
        }
        record |= {"median_ms": round(statistics.median(ms), 1), "runs_ms": [round(x, 1) for x in ms]}
        print(json.dumps(record), flush=True)
