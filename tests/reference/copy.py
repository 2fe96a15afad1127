"""float64 references for the pointer-generator mixture (See, Liu & Manning 2017, eq. 9), loop by loop, and its
gradients by central differences of the same loops."""

import math

import numpy as np


def pointer_generator_ref(logits, attention, src_ids, gen_logits, extended_size, src_mask=None):
    """``log(p_gen softmax(z)_w [w < V] + (1 - p_gen) Σ_{j: x_j = w, real} α_j)`` for every row, ``[N, E]``.

    Rows are the leading axes flattened: ``logits [N, V]``, ``attention [N, S]``, ``src_ids [N, S]``,
    ``gen_logits [N]``, ``src_mask [N, S]`` or None. Impossible words give ``-inf``.
    """
    z = np.asarray(logits, np.float64)
    a = np.asarray(attention, np.float64)
    ids = np.asarray(src_ids)
    g = np.asarray(gen_logits, np.float64)
    n, v = z.shape
    s = a.shape[1]
    out = np.full((n, extended_size), -np.inf)
    for r in range(n):
        p_gen = 1.0 / (1.0 + math.exp(-g[r]))
        top = max(z[r])
        denom = math.fsum(math.exp(z[r, u] - top) for u in range(v))
        for w in range(extended_size):
            gen = p_gen * math.exp(z[r, w] - top) / denom if w < v else 0.0
            copied = math.fsum(
                a[r, j] for j in range(s) if ids[r, j] == w and (src_mask is None or src_mask[r, j])
            )
            p = gen + (1.0 - p_gen) * copied
            out[r, w] = math.log(p) if p > 0 else -np.inf
    return out


def numeric_grad(f, x, h=1e-6):
    """Central differences of the scalar ``f`` at the float64 array ``x``."""
    x = np.array(x, np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        grad[i] = (f(up) - f(down)) / (2 * h)
    return grad
