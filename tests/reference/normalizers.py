"""float64 references for the sparse normalisers: sparsemax (sort and threshold) and 1.5-entmax (bisection).

The entmax reference deliberately uses another algorithm than the library (bisection on the threshold instead of
the sort-based exact solve), so a shared mistake in the sort-based formulas cannot pass. Jacobians are central
finite differences of these float64 references.
"""

import math

import numpy as np

from tests.reference.core import context_ref, softmax_row_ref


def sparsemax_row_ref(z, mask_row=None):
    """Sparsemax of one row (Martins & Astudillo 2016, algorithm 1) over its valid entries; 0 elsewhere."""
    z = np.asarray(z, np.float64)
    n = z.shape[0]
    valid = [True] * n if mask_row is None else [bool(m) for m in mask_row]
    idx = [j for j in range(n) if valid[j]]
    out = np.zeros(n)
    if not idx:
        return out
    zs = sorted((z[j] for j in idx), reverse=True)
    k_z, cumsum, support_sum = 0, 0.0, 0.0
    for k in range(1, len(zs) + 1):
        cumsum += zs[k - 1]
        if 1.0 + k * zs[k - 1] > cumsum:
            k_z, support_sum = k, cumsum
    tau = (support_sum - 1.0) / k_z
    for j in idx:
        out[j] = max(z[j] - tau, 0.0)
    return out


def entmax15_row_ref(z, mask_row=None, iterations=200):
    """1.5-entmax of one row over its valid entries by bisection on ``τ`` in ``Σ [z/2 − τ]₊² = 1``; 0 elsewhere."""
    z = np.asarray(z, np.float64)
    n = z.shape[0]
    valid = [True] * n if mask_row is None else [bool(m) for m in mask_row]
    idx = [j for j in range(n) if valid[j]]
    out = np.zeros(n)
    if not idx:
        return out
    x = {j: z[j] / 2.0 for j in idx}
    top = max(x.values())
    lo, hi = top - 1.0, top  # mass(lo) >= 1 (the top entry alone gives 1), mass(hi) = 0

    def mass(tau):
        return math.fsum(max(x[j] - tau, 0.0) ** 2 for j in idx)

    for _ in range(iterations):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if mass(mid) >= 1.0:
            lo = mid
        else:
            hi = mid
    tau = 0.5 * (lo + hi)
    for j in idx:
        out[j] = max(x[j] - tau, 0.0) ** 2
    total = math.fsum(out)  # the bisection leaves |Σ − 1| at float64 rounding; divide it out
    return out / total


ROW_REFS = {"softmax": softmax_row_ref, "sparsemax": sparsemax_row_ref, "entmax15": entmax15_row_ref}


def normalize_ref(logits, mask=None, normalizer="softmax"):
    """Masked softmax, sparsemax or 1.5-entmax over the last axis of ``[..., T, S]``, one row at a time."""
    logits = np.asarray(logits, np.float64)
    mask = None if mask is None else np.broadcast_to(np.asarray(mask, bool), logits.shape)
    row_ref = ROW_REFS[normalizer]
    out = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape[:-1]):
        out[idx] = row_ref(logits[idx], None if mask is None else mask[idx])
    return out


def jacobian_fd_ref(row_ref, z, mask_row=None, h=1e-6):
    """``J[i, j] = ∂p_i/∂z_j`` of one row by central differences of a float64 row reference."""
    z = np.asarray(z, np.float64)
    n = z.shape[0]
    jac = np.zeros((n, n))
    for j in range(n):
        up, down = z.copy(), z.copy()
        up[j] += h
        down[j] -= h
        jac[:, j] = (row_ref(up, mask_row) - row_ref(down, mask_row)) / (2 * h)
    return jac


def vjp_ref(row_ref, logits, cotangent, mask=None):
    """``gᵀ J`` row by row for ``[..., S]`` logits and cotangents, with finite-difference Jacobians."""
    logits = np.asarray(logits, np.float64)
    g = np.asarray(cotangent, np.float64)
    mask = None if mask is None else np.broadcast_to(np.asarray(mask, bool), logits.shape)
    out = np.zeros_like(logits)
    for idx in np.ndindex(*logits.shape[:-1]):
        jac = jacobian_fd_ref(row_ref, logits[idx], None if mask is None else mask[idx])
        n = logits.shape[-1]
        for j in range(n):
            out[idx + (j,)] = math.fsum(g[idx + (i,)] * jac[i, j] for i in range(n))
    return out


def attention_ref(scores, values, mask=None, normalizer="softmax"):
    """``(context, weights)`` of global attention with the given normaliser, from float64 scores."""
    weights = normalize_ref(scores, mask, normalizer)
    return context_ref(weights, values), weights


def local_normalized_ref(scores, values, centers, window, mask=None, gaussian=False, normalizer="softmax"):
    """Local attention ``(context, weights)`` (as ``scorers.local_ref``) with the given normaliser in the window."""
    scores = np.asarray(scores, np.float64)
    shape = scores.shape
    S = shape[-1]
    centers = np.broadcast_to(np.asarray(centers, np.float64), shape[:-1])
    mask = np.ones(shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), shape)
    weights = np.zeros(shape)
    for row in np.ndindex(*shape[:-1]):
        p = float(centers[row])
        centre = math.floor(p + 0.5)
        valid = [bool(mask[row + (s,)]) and abs(s - centre) <= window for s in range(S)]
        w = ROW_REFS[normalizer](scores[row], valid)
        if gaussian:
            sigma = window / 2
            w = np.array([w[s] * math.exp(-((s - p) ** 2) / (2 * sigma**2)) for s in range(S)])
        weights[row] = w
    return context_ref(weights, values), weights
