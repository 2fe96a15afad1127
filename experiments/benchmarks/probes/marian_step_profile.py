"""Where a Marian-shaped Transformer's decode step spends its time on the CPU (bench row 10's gap).

    .venv/bin/python experiments/benchmarks/probes/marian_step_profile.py

OPUS-MT en-de's shape (vocabulary 58,101, d 512, 6+6 layers, 8 heads, FFN 2048), random parameters, batch 32
sources of width 24 tiled to beam 4 (128 rows), 32 greedy decode steps of ``model.for_decoding()`` in one
jitted scan (the model alone, no search). One call runs under ``jax.profiler.trace`` with a Perfetto trace;
the XLA ops' times are summed by kind and printed per step. Then the same scan without the profiler and ``beam_search`` itself are timed.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_jax.decoding import beam_search
from attn_jax.models import TransformerConfig, build_model, repeat_batch

V, STEPS, WIDTH, B, K = 58101, 32, 24, 32, 4


def _median(f, n: int = 3) -> float:
    f()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    cfg = TransformerConfig(
        src_vocab=V,
        tgt_vocab=V,
        d_model=512,
        heads=8,
        d_ff=2048,
        encoder_layers=6,
        decoder_layers=6,
        dropout=0.0,
        activation="swish",
        share_embeddings="all",
        layer_norm_eps=1e-5,
        positions="sinusoidal_halves",
        max_length=64,
    )
    model = build_model(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(4)
    lens = rng.integers(WIDTH // 2, WIDTH + 1, B)
    mask = np.arange(WIDTH)[None] < lens[:, None]
    src = jnp.asarray(np.where(mask, rng.integers(4, V, (B, WIDTH)), 0))
    src_mask = jnp.asarray(mask)

    @nnx.jit
    def alone(model, src, src_mask):
        model = model.for_decoding()  # the form a decoding loop steps, as the searches do
        enc = model.encode(src, src_mask)
        dec = repeat_batch(model.init_decoder_state(enc, STEPS), K)
        enc = repeat_batch(enc, K)

        def step(carry, _):
            dec, prev = carry
            logits, dec, _ = model.decode_step(enc, dec, prev)
            return (dec, jnp.argmax(logits, -1).astype(jnp.int32)), None

        (_, last), _ = jax.lax.scan(step, (dec, jnp.full((B * K,), 1, jnp.int32)), None, length=STEPS)
        return last

    jax.block_until_ready(alone(model, src, src_mask))
    with tempfile.TemporaryDirectory() as tmp:
        with jax.profiler.trace(tmp, create_perfetto_trace=True):
            jax.block_until_ready(alone(model, src, src_mask))
        (path,) = glob.glob(f"{tmp}/**/*.trace.json.gz", recursive=True)
        trace = json.load(gzip.open(path))
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    by_name = collections.Counter()
    for e in events:
        if e.get("ph") == "X":
            by_name[e["name"]] += e["dur"]
    # The op that runs once per step and takes longest is the output projection [128, 512] x [512, V].
    kinds = collections.Counter()
    ops = {n: v for n, v in by_name.items() if not n.startswith(("$", "ThunkExecutor", "Slinky", "while"))}
    top = max(ops, key=ops.get)
    for name, us in ops.items():
        kind = "output projection" if name == top else name.split(".")[0].rstrip("0123456789_")
        kinds[kind] += us
    print("| XLA op kind | ms per step |\n|---|---|")
    for kind, us in kinds.most_common(10):
        print(f"| {kind} | {us / 1e3 / STEPS:.1f} |")
    print(f"| all ops | {sum(kinds.values()) / 1e3 / STEPS:.1f} |")
    model_s = _median(lambda: jax.block_until_ready(alone(model, src, src_mask)))
    search_s = _median(
        lambda: jax.block_until_ready(
            beam_search(model, src, src_mask, beam_size=K, max_length=STEPS, max_length_ratio=None)
        )
    )
    print(f"\nmodel alone {model_s:.2f} s, beam_search {search_s:.2f} s ({STEPS} steps, beam {K}, batch {B})")


if __name__ == "__main__":
    main()
