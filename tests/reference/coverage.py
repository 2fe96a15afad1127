"""float64 references for the coverage loss (See, Liu & Manning 2017, eq. 12-13) and its gradient, loop by loop."""

import math

import numpy as np


def coverage_loss_ref(weights, tgt_mask):
    """``Σ_t m_t Σ_j min(α_tj, c_tj)``, ``c_tj = Σ_{t'<t} α_t'j``, one sum per sentence ``[B]``."""
    w = np.asarray(weights, np.float64)
    m = np.asarray(tgt_mask, bool)
    B, T, S = w.shape
    out = np.zeros(B)
    for b in range(B):
        terms = []
        for t in range(T):
            if not m[b, t]:
                continue
            for j in range(S):
                covered = math.fsum(w[b, u, j] for u in range(t))
                terms.append(min(w[b, t, j], covered))
        out[b] = math.fsum(terms)
    return out


def coverage_loss_grad_ref(weights, tgt_mask, d_out):
    """``∂(Σ_b d_out[b] · loss_b) / ∂α``: α_tj counts where it is the smaller of the pair at step t, and in
    ``c_t'j`` for every later real step t' where the coverage is the smaller (weights without ties)."""
    w = np.asarray(weights, np.float64)
    m = np.asarray(tgt_mask, bool)
    B, T, S = w.shape
    grad = np.zeros_like(w)
    for b in range(B):
        for t in range(T):
            for j in range(S):
                g = 0.0
                if m[b, t] and w[b, t, j] < math.fsum(w[b, u, j] for u in range(t)):
                    g += 1.0
                for later in range(t + 1, T):
                    if m[b, later] and math.fsum(w[b, u, j] for u in range(later)) < w[b, later, j]:
                        g += 1.0
                grad[b, t, j] = d_out[b] * g
    return grad
