"""float64 references shared by every mechanism: masked softmax and weighted context."""

import math

import numpy as np


def softmax_row_ref(energies, mask_row=None):
    """Softmax of one row of energies (float64), exact zeros where masked, all zeros if all masked."""
    e = np.asarray(energies, np.float64)
    n = e.shape[0]
    valid = [True] * n if mask_row is None else [bool(m) for m in mask_row]
    if not any(valid):
        return np.zeros(n)
    mx = max(e[j] for j in range(n) if valid[j])
    ex = [math.exp(e[j] - mx) if valid[j] else 0.0 for j in range(n)]
    z = sum(ex)
    return np.array([x / z for x in ex])


def softmax_ref(logits, mask=None):
    """Masked softmax over the last axis of ``[..., T, S]``, one row at a time."""
    logits = np.asarray(logits, np.float64)
    mask = None if mask is None else np.broadcast_to(np.asarray(mask, bool), logits.shape)
    out = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape[:-1]):
        out[idx] = softmax_row_ref(logits[idx], None if mask is None else mask[idx])
    return out


def context_ref(weights, values):
    """``c[..., t, :] = Σ_s w[..., t, s] v[..., s, :]`` with explicit loops."""
    w = np.asarray(weights, np.float64)
    v = np.asarray(values, np.float64)
    batch = np.broadcast_shapes(w.shape[:-2], v.shape[:-2])
    w = np.broadcast_to(w, batch + w.shape[-2:])
    v = np.broadcast_to(v, batch + v.shape[-2:])
    T, S = w.shape[-2:]
    Dv = v.shape[-1]
    out = np.zeros(batch + (T, Dv))
    for b in np.ndindex(*batch):
        for t in range(T):
            for s in range(S):
                out[b + (t,)] += w[b + (t, s)] * v[b + (s,)]
    return out
