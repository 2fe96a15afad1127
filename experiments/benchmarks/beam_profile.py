"""Where beam-search time goes: the whole search against the model alone (issue 16, item 1: "measure, don't guess").

    .venv/bin/python experiments/benchmarks/beam_profile.py

On bench row 5's RNNsearch (V 2000, m 128, n 256, l 128, A 128; random parameters), batches of 1 and 32 source
sentences of width 30, ``max_length=30``: the median time of ``attn_jax.decoding.beam_search`` at beams 1, 4, 12,
and of the model alone doing the same work without any search (encode once, tile to B·K rows, 30 ``decode_step``
calls with a log-softmax and an argmax feeding the next step, one jitted ``lax.scan``). The difference is the
search's bookkeeping (top-k over K·V, back-pointer gathers of states, tokens and the attention history, the
finished set). The model alone always runs 30 steps while the search may stop early, so the share is a lower
bound when the search stops before 30 (negative where it stops well before). Medians of 5 calls after a warm-up;
run on a quiet machine.

Measured 2026-12-02 10:18 UTC (2 cores, idle machine, load average 1.2):

| batch | beam | beam_search | model alone | bookkeeping share |
|---|---|---|---|---|
| 1 | 1 | 20.2 ms | 20.1 ms | 0 % |
| 1 | 4 | 23.3 ms | 21.9 ms | 6 % |
| 1 | 12 | 28.6 ms | 28.6 ms | 0 % |
| 32 | 1 | 71.2 ms | 57.0 ms | 20 % |
| 32 | 4 | 213.4 ms | 171.9 ms | 19 % |
| 32 | 12 | 489.7 ms | 452.6 ms | 8 % |

So the search is no longer where the time goes. At batch 32, beam 12 the PyTorch search at 2 threads took 566 ms in
bench row 5 of the same morning; 1.5x that is 377 ms, below the 453 ms the model alone needs here. The target of
issue 16 needs a faster RNNsearch decode step on the CPU (XLA's small matmuls at 384 rows against PyTorch's
oneDNN), not less bookkeeping (removing all of it would give 566 / 453 = 1.25x).
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attn_jax.decoding import beam_search
from attn_jax.models import RNNConfig, build_model, repeat_batch

LENGTH = 30


def _median(f, n: int = 5) -> float:
    f()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    cfg = RNNConfig(src_vocab=2000, tgt_vocab=2000, embed=128, hidden=256, maxout=128, align=128)
    model = build_model(cfg, rngs=nnx.Rngs(0))
    print("| batch | beam | beam_search | model alone | bookkeeping share |")
    print("|---|---|---|---|---|")
    for batch in (1, 32):
        rng = np.random.default_rng(4)
        lens = rng.integers(LENGTH // 2, LENGTH + 1, batch)
        mask = np.arange(LENGTH)[None] < lens[:, None]
        src = jnp.asarray(np.where(mask, rng.integers(4, cfg.src_vocab, (batch, LENGTH)), 0))
        jmask = jnp.asarray(mask)
        for k in (1, 4, 12):

            @nnx.jit
            def model_alone(model, src, jmask, k=k):
                enc = model.encode(src, jmask)
                dec = repeat_batch(model.init_decoder_state(enc), k)
                enc = repeat_batch(enc, k)

                def step(carry, _):
                    dec, prev = carry
                    logits, dec, _ = model.decode_step(enc, dec, prev)
                    logp = jax.nn.log_softmax(logits.astype(jnp.float32))
                    return (dec, jnp.argmax(logp, -1).astype(jnp.int32)), None

                start = jnp.full((src.shape[0] * k,), 1, jnp.int32)
                (_, last), _ = jax.lax.scan(step, (dec, start), None, length=LENGTH)
                return last

            search = _median(
                lambda k=k, src=src, jmask=jmask: jax.block_until_ready(
                    beam_search(model, src, jmask, beam_size=k, max_length=LENGTH, max_length_ratio=None)
                )
            )
            alone = _median(
                lambda src=src, jmask=jmask: jax.block_until_ready(model_alone(model, src, jmask))
            )
            print(
                f"| {batch} | {k} | {search * 1e3:.1f} ms | {alone * 1e3:.1f} ms | "
                f"{100 * (1 - alone / search):.0f} % |",
                flush=True,
            )


if __name__ == "__main__":
    main()
