"""What zeroing the unread (padded) rows costs ``dot_product_attention``: fwd+bwd with and without it.

    .venv/bin/python experiments/benchmarks/padding_cost.py            # B=4, H=8, L=1024, K=64, float32 (~6 min CPU)
    .venv/bin/python experiments/benchmarks/padding_cost.py --rounds 4 --length 256   # a smoke run (~1 min)

"without" is the code before the zeroing (``zero_dead_inputs`` an identity, a ``-inf`` bias not folded into the
mask), compiled from the same source by patching the module, so both sides are otherwise one program. Each case
times the two compiled programs in alternation (one call each per round, the order flipping), and a control
case without mask or bias (where the zeroing is skipped, so both sides are the same program) shows the noise
of the machine. Then the zeroing alone (forward and its transpose, un-fused) is timed against the attention:
an upper bound on its share. Mask and bias are arguments, not constants (XLA would fold a constant mask's
row reductions away). Last, row 3's decoder scan of additive attention steps, where every step zeroes the
loop-invariant keys and annotations again. Results are in README.md ("Padding zeroing").
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import attn_jax.attention._dispatch as dispatch
import attn_jax.attention._dot_product as dp
import attn_jax.attention._plain as plain
from attn_jax.attention._padding import zero_dead_inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--length", type=int, default=1024)
    args = parser.parse_args()
    b, h, length, width = 4, 8, args.length, 64
    rng = np.random.default_rng(0)
    q, k, v, g = (jnp.asarray(rng.standard_normal((b, h, length, width)), jnp.float32) for _ in range(4))
    lengths = np.array([length, length * 7 // 8, length * 3 // 4, length * 5 // 8])
    mask = jnp.asarray(np.arange(length)[None, None, None, :] < lengths[:, None, None, None])  # [B, 1, 1, S]
    bias = jnp.asarray(rng.standard_normal((h, length, length)), jnp.float32).at[:, 5].set(-jnp.inf)
    real = dispatch.zero_dead_inputs, dispatch.allowed_pairs, plain.allowed_pairs

    def program(zeroing: bool, m, bias, **kw):
        if not zeroing:
            dispatch.zero_dead_inputs = lambda q, k, v, *a, **_: (q, k, v)
            dispatch.allowed_pairs = plain.allowed_pairs = lambda mask, bias: mask
        try:

            def fwd_bwd(q, k, v, g, m, bias):
                f = lambda q, k, v: dp.dot_product_attention(q, k, v, m, bias=bias, **kw)  # noqa: E731
                return jax.vjp(f, q, k, v)[1](g)

            compiled = jax.jit(fwd_bwd).lower(q, k, v, g, m, bias).compile()
        finally:
            dispatch.zero_dead_inputs, dispatch.allowed_pairs, plain.allowed_pairs = real
        return lambda: jax.block_until_ready(compiled(q, k, v, g, m, bias))

    cases = [
        ("padding mask", dict(m=mask, bias=None)),
        ("padding mask + causal", dict(m=mask, bias=None, causal=True)),
        ("padding mask, chunked", dict(m=mask, bias=None, implementation="chunked")),
        ("bias with a -inf column", dict(m=None, bias=bias)),
        ("control: no mask, no bias", dict(m=None, bias=None)),
    ]
    print(f"fwd+bwd, B={b} H={h} L={length} K={width}, median of {args.rounds} interleaved rounds")
    for label, kw in cases:
        calls = {"with": program(True, **kw), "without": program(False, **kw)}
        samples = {name: [] for name in calls}
        for call in calls.values():
            call()
        for r in range(args.rounds):
            for name in list(calls)[:: 1 if r % 2 == 0 else -1]:
                t0 = time.perf_counter()
                calls[name]()
                samples[name].append(time.perf_counter() - t0)
        w, wo = (statistics.median(samples[n]) for n in ("with", "without"))
        print(
            f"  {label:26s} with {w * 1e3:8.1f} ms   without {wo * 1e3:8.1f} ms   with/without {w / wo:.3f}"
        )

    for causal in (False, True):

        def zeroing(q, k, v, g, m, causal=causal):
            f = lambda q, k, v: zero_dead_inputs(q, k, v, m, None, (b, h, length, length), causal=causal)  # noqa: E731
            out, pull = jax.vjp(f, q, k, v)
            return out, pull((g, g, g))

        def attention(q, k, v, g, m, causal=causal):
            return jax.vjp(lambda q, k, v: dp.dot_product_attention(q, k, v, m, causal=causal), q, k, v)[1](g)

        times = []
        for fn, n in ((zeroing, 5 * args.rounds), (attention, args.rounds)):
            compiled = jax.jit(fn).lower(q, k, v, g, mask).compile()
            jax.block_until_ready(compiled(q, k, v, g, mask))
            ts = []
            for _ in range(n):
                t0 = time.perf_counter()
                jax.block_until_ready(compiled(q, k, v, g, mask))
                ts.append(time.perf_counter() - t0)
            times.append(statistics.median(ts))
        print(
            f"  zeroing alone (causal={causal}): {times[0] * 1e3:.1f} ms = {times[0] / times[1]:.1%} of the "
            f"attention's fwd+bwd ({times[1] * 1e3:.0f} ms)"
        )

    decoder_scan_cost(args.rounds)


def decoder_scan_cost(rounds: int) -> None:
    """Row 3's loss (additive attention steps in a ``lax.scan``) at row 4's model sizes, with and without the
    per-step zeroing of the loop-invariant projected keys and annotations: time and compiled temp memory."""
    import attn_jax.attention._additive as additive
    import attn_jax.attention._softmax as softmax
    from attn_jax.attention import additive_attention_step, init_additive_params, project_keys

    b, t, n, a = 32, 30, 256, 128
    rng = np.random.default_rng(2)
    params = init_additive_params(jax.random.key(0), n, 2 * n, a)
    h = jnp.asarray(rng.standard_normal((b, t, 2 * n)), jnp.float32)
    mask = jnp.asarray(np.arange(t)[None, :] < rng.integers(t // 2, t + 1, b)[:, None])
    c_w = jnp.asarray(rng.standard_normal((2 * n, n)) / np.sqrt(2 * n), jnp.float32)
    xs = jnp.asarray(rng.standard_normal((t, b, n)), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((t, b, 2 * n)), jnp.float32)

    def loss(params, h, c_w, xs, mask, fused):
        keys = project_keys(params, h)

        def step(state, inp):
            x, g = inp
            ctx_i, _ = additive_attention_step(params, state, keys, h, mask, fused=fused)
            return jnp.tanh(x + ctx_i @ c_w), jnp.sum(ctx_i * g)

        return jax.lax.scan(step, jnp.zeros((b, n), jnp.float32), (xs, cot))[1].sum()

    real = additive.zero_masked_keys, additive.zero_masked_queries, softmax.zero_masked_keys
    print(f"additive attention in a decoder scan (B={b}, T=S={t}, 2n={2 * n}, A={a}), fwd+bwd")
    for fused in (True, False):
        programs = {}
        for zeroing in (True, False):
            if not zeroing:
                additive.zero_masked_keys = additive.zero_masked_queries = softmax.zero_masked_keys = (
                    lambda x, m: x
                )
            try:
                grad = jax.grad(lambda *xs, fused=fused: loss(*xs, fused=fused), argnums=(0, 1, 2, 3))
                programs[zeroing] = jax.jit(grad).lower(params, h, c_w, xs, mask).compile()
            finally:
                additive.zero_masked_keys, additive.zero_masked_queries, softmax.zero_masked_keys = real
        samples = {z: [] for z in programs}
        for c in programs.values():
            jax.block_until_ready(c(params, h, c_w, xs, mask))
        for r in range(rounds):
            for z in (True, False) if r % 2 == 0 else (False, True):
                t0 = time.perf_counter()
                jax.block_until_ready(programs[z](params, h, c_w, xs, mask))
                samples[z].append(time.perf_counter() - t0)
        w, wo = (statistics.median(samples[z]) for z in (True, False))
        mem = {z: programs[z].memory_analysis().temp_size_in_bytes / 2**20 for z in programs}
        print(
            f"  fused={fused!s:5}  with {w * 1e3:6.1f} ms   without {wo * 1e3:6.1f} ms   with/without {w / wo:.3f}"
            f"   temp {mem[True]:.1f} MiB vs {mem[False]:.1f} MiB"
        )


if __name__ == "__main__":
    main()
