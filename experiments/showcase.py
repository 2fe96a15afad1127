"""A twenty-second showcase of attn_jax's additive attention: the first thing `make demo` runs.

Learns Bahdanau attention that *reverses* a padded batch of toy "sentences": target position i must read source
position len-1-i, found by matching the query against the backward half of bidirectional-style annotations. Only the attention parameters are trained (optax Adam, 300 steps), then the learned alignment of
each sentence is printed as a text heatmap with the checks the library promises: rows sum to 1 over the source
axis, padded keys get exactly 0.

Run: ``make demo`` (or ``.venv/bin/python experiments/showcase.py``); about 20 s on a 2-core CPU.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import attn_jax
from attn_jax.attention import _additive

SHADES = " .:-=+*#%@"


def toy_batch(lengths: list[int], max_len: int, d: int = 16):
    """Bidirectional-style annotations and position queries for a padded batch that must be read in reverse.

    Like a bidirectional encoder's annotation, key j carries its distance from the start (forward) and from the
    sentence end (backward); query i carries the target step. Target step i must read source position len-1-i.
    """
    pos = attn_jax.sinusoidal_positions(max_len, d)  # [L, D]
    n = jnp.asarray(lengths)[:, None]  # [B, 1]
    backward = jnp.clip(n - 1 - jnp.arange(max_len), 0, max_len - 1)  # [B, S] distance to the last word
    keys = jnp.concatenate(
        [jnp.broadcast_to(pos, (len(lengths), max_len, d)), pos[backward]], -1
    )  # [B, S, 2D]
    queries = jnp.broadcast_to(pos, (len(lengths), max_len, d))  # [B, T, D]
    key_valid = attn_jax.make_padding_mask(jnp.asarray(lengths), max_len)  # [B, S]
    mask = attn_jax.make_attention_mask(key_valid, key_valid)  # [B, T, S]
    gold = np.zeros((len(lengths), max_len, max_len), np.float32)
    for b, n_b in enumerate(lengths):
        for i in range(n_b):
            gold[b, i, n_b - 1 - i] = 1.0
    return queries, keys, mask, jnp.asarray(gold)


def heatmap(weights: np.ndarray, n: int) -> str:
    rows = []
    for i in range(n):
        rows.append(
            f"  t={i:<2d} |"
            + "".join(SHADES[min(int(w * len(SHADES)), len(SHADES) - 1)] * 2 for w in weights[i, :n])
            + "|"
        )
    return "\n".join(rows)


def main() -> None:
    start = time.perf_counter()
    lengths, max_len = [9, 6, 4], 9
    q, k, mask, gold = toy_batch(lengths, max_len)
    params = _additive.init_additive_params(jax.random.key(0), 16, 32, 32)

    def loss_fn(p):
        _, w = attn_jax.additive_attention(p, q, k, k, mask, return_weights=True)
        return -(gold * jnp.log(w + 1e-9)).sum() / gold.sum()

    opt = optax.adam(3e-2)
    state = opt.init(params)

    @jax.jit
    def step(p, s):
        loss, g = jax.value_and_grad(loss_fn)(p)
        upd, s = opt.update(g, s, p)
        return optax.apply_updates(p, upd), s, loss

    for i in range(301):
        params, state, loss = step(params, state)
        if i % 100 == 0:
            print(f"step {i:3d}  alignment cross-entropy {float(loss):.4f}")

    _, w = attn_jax.additive_attention(params, q, k, k, mask, return_weights=True)
    attn_jax.assert_valid_attention_weights(
        w, mask
    )  # rows sum to 1 over the source axis, padding gets exactly 0
    w = np.asarray(w)
    print("\nLearned additive-attention alignments (rows: target steps, columns: source positions):")
    for b, n in enumerate(lengths):
        acc = float(np.mean(w[b, :n, :n].argmax(-1) == np.arange(n)[::-1]))
        pad_mass = float(w[b, :n, n:].sum())
        print(
            f"\nsentence {b}: length {n}, argmax = reversed position for {acc:.0%} of steps, weight on padding {pad_mass:.1f}"
        )
        print(heatmap(w[b], n))
    print(f"\nrow sums over the source axis: {np.round(w.sum(-1)[0, : lengths[0]], 6).tolist()}")
    print(
        f"done in {time.perf_counter() - start:.1f}s. Next: the paper's experiment, RNNenc vs RNNsearch (experiments/bahdanau2015)."
    )


if __name__ == "__main__":
    main()
