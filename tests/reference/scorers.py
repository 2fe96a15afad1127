"""float64 references for the additive (Bahdanau), Luong (dot/general/concat/location) and local scorers.

Written loop by loop over batch, target and source positions with explicit sums over feature axes, so that
a swapped axis or a transposed weight cannot pass. Weight layout follows the library: ``w[d_in, d_out]``.
"""

import math

import numpy as np

from tests.reference.core import context_ref, softmax_ref, softmax_row_ref


def rel_err(actual, expected) -> float:
    """``max|a - b| / max|b|`` in float64 (``max|b|`` floored at 1e-30 so an all-zero reference is absolute)."""
    a = np.asarray(actual, np.float64)
    b = np.asarray(expected, np.float64)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.max(np.abs(a - b), initial=0.0) / max(float(np.max(np.abs(b), initial=0.0)), 1e-30))


def _f64(x):
    return None if x is None else np.asarray(x, np.float64)


def _matvec(x, w):
    """``out[a] = Σ_d x[d] · w[d, a]`` for one vector ``x [D]`` and ``w [D, A]``."""
    D, A = w.shape
    assert x.shape == (D,), (x.shape, w.shape)
    return np.array([math.fsum(x[d] * w[d, a] for d in range(D)) for a in range(A)])


def _batch(*pairs):
    """Broadcast the leading (batch) axes of ``(array, core_rank)`` pairs; return the batch shape and arrays."""
    batch = np.broadcast_shapes(*(a.shape[: a.ndim - k] for a, k in pairs))
    return batch, [np.broadcast_to(a, batch + a.shape[a.ndim - k :]) for a, k in pairs]


def effective_v_ref(v, g=None):
    """``v``, or ``g · v / ‖v‖`` (weight normalisation, Salimans & Kingma 2016; tf/nmt ``normed_bahdanau``)."""
    v = _f64(v)
    if g is None:
        return v
    norm = math.sqrt(math.fsum(x * x for x in v))
    return np.array([float(g) * x / norm for x in v])


def additive_energies_ref(query, keys, w_q, w_k, v, b=None, g=None, w_c=None, coverage=None):
    """Bahdanau energies ``e_ij = vᵀ tanh(W s_i + U h_j (+ w_c c_ij) (+ b))``, ``[..., T, S]``; ``W = w_q``,
    ``U = w_k``; the coverage term (See et al. 2017, eq. 11) when ``w_c [A]`` and ``coverage [..., T, S]`` are
    given."""
    query, keys, w_q, w_k, b, w_c = map(_f64, (query, keys, w_q, w_k, b, w_c))
    v_eff = effective_v_ref(v, g)
    A = v_eff.shape[0]
    batch, (query, keys) = _batch((query, 2), (keys, 2))
    if coverage is not None:
        coverage = np.broadcast_to(_f64(coverage), batch + (query.shape[-2], keys.shape[-2]))
    T, S = query.shape[-2], keys.shape[-2]
    out = np.zeros(batch + (T, S))
    for idx in np.ndindex(*batch):
        ws = [_matvec(query[idx + (i,)], w_q) for i in range(T)]  # W s_i
        uh = [_matvec(keys[idx + (j,)], w_k) for j in range(S)]  # U h_j
        for i in range(T):
            for j in range(S):
                acc = []
                for a in range(A):
                    pre = ws[i][a] + uh[j][a] + (0.0 if b is None else b[a])
                    if coverage is not None:
                        pre += w_c[a] * coverage[idx + (i, j)]
                    acc.append(v_eff[a] * math.tanh(pre))
                out[idx + (i, j)] = math.fsum(acc)
    return out


def additive_ref(params, query, keys, values=None, mask=None, coverage=None):
    """Additive attention ``(context, weights)`` in float64 from a params dict as in ``init_additive_params``
    (with ``coverage [..., T, S]`` when the params hold ``w_c``)."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    e = additive_energies_ref(
        query, keys, p["w_q"], p["w_k"], p["v"], p.get("b"), p.get("g"), p.get("w_c"), coverage
    )
    w = softmax_ref(e, mask)
    return context_ref(w, keys if values is None else values), w


def dot_scores_ref(query, keys):
    """Luong ``dot``: ``e_ts = Σ_d h_t[d] h̄_s[d]``."""
    batch, (query, keys) = _batch((_f64(query), 2), (_f64(keys), 2))
    T, D = query.shape[-2:]
    S = keys.shape[-2]
    assert keys.shape[-1] == D
    out = np.zeros(batch + (T, S))
    for idx in np.ndindex(*batch):
        for t in range(T):
            for s in range(S):
                out[idx + (t, s)] = math.fsum(query[idx + (t, d)] * keys[idx + (s, d)] for d in range(D))
    return out


def general_scores_ref(query, keys, w):
    """Luong ``general``: ``e_ts = Σ_d Σ_e h_t[d] W[d, e] h̄_s[e]``."""
    w = _f64(w)
    batch, (query, keys) = _batch((_f64(query), 2), (_f64(keys), 2))
    T, Dq = query.shape[-2:]
    S, Dk = keys.shape[-2:]
    assert w.shape == (Dq, Dk)
    out = np.zeros(batch + (T, S))
    for idx in np.ndindex(*batch):
        for t in range(T):
            for s in range(S):
                out[idx + (t, s)] = math.fsum(
                    query[idx + (t, d)] * w[d, e] * keys[idx + (s, e)] for d in range(Dq) for e in range(Dk)
                )
    return out


def concat_scores_ref(query, keys, w_q, w_k, v, b=None):
    """Luong ``concat`` literally: ``v_aᵀ tanh(W_a [h_t; h̄_s])`` with ``W_a`` the row-stack of ``w_q``, ``w_k``."""
    w_a = np.concatenate([_f64(w_q), _f64(w_k)], axis=0)  # [Dq + Dk, A]
    v, b = _f64(v), _f64(b)
    batch, (query, keys) = _batch((_f64(query), 2), (_f64(keys), 2))
    T, S = query.shape[-2], keys.shape[-2]
    out = np.zeros(batch + (T, S))
    for idx in np.ndindex(*batch):
        for t in range(T):
            for s in range(S):
                x = np.concatenate([query[idx + (t,)], keys[idx + (s,)]])  # [h_t; h̄_s]
                pre = _matvec(x, w_a)
                out[idx + (t, s)] = math.fsum(
                    v[a] * math.tanh(pre[a] + (0.0 if b is None else b[a])) for a in range(len(v))
                )
    return out


def location_scores_ref(query, w, source_length):
    """Luong ``location``: ``e_ts = (W_a h_t)[s]`` for ``s < source_length``."""
    query, w = _f64(query), _f64(w)
    batch = query.shape[:-2]
    T = query.shape[-2]
    out = np.zeros(batch + (T, source_length))
    for idx in np.ndindex(*batch):
        for t in range(T):
            full = _matvec(query[idx + (t,)], w)
            for s in range(source_length):
                out[idx + (t, s)] = full[s]
    return out


def monotonic_centers_ref(query_length, source_lengths=None):
    """local-m ``p_t = t``, clipped to ``max(len - 1, 0)``."""
    if source_lengths is None:
        return np.arange(query_length, dtype=np.float64)
    lengths = np.asarray(source_lengths)
    out = np.zeros(lengths.shape + (query_length,))
    for idx in np.ndindex(*lengths.shape):
        for t in range(query_length):
            out[idx + (t,)] = min(t, max(int(lengths[idx]) - 1, 0))
    return out


def predictive_centers_ref(query, w_p, v_p, source_lengths):
    """local-p ``p_t = (len - 1) · sigmoid(v_pᵀ tanh(W_p h_t))``."""
    query, w_p, v_p = _f64(query), _f64(w_p), _f64(v_p)
    lengths = np.broadcast_to(np.asarray(source_lengths), query.shape[:-2])
    T = query.shape[-2]
    out = np.zeros(query.shape[:-1])
    for idx in np.ndindex(*query.shape[:-2]):
        span = max(int(lengths[idx]) - 1, 0)
        for t in range(T):
            hidden = _matvec(query[idx + (t,)], w_p)
            z = math.fsum(v_p[a] * math.tanh(hidden[a]) for a in range(len(v_p)))
            out[idx + (t,)] = span / (1.0 + math.exp(-z))
    return out


def local_ref(scores, values, centers, window, mask=None, gaussian=False):
    """Local attention ``(context, weights)``: softmax over ``{s : |s - floor(p_t + 0.5)| <= D} ∩ mask``, then
    (if ``gaussian``) times ``exp(-(s - p_t)² / (2 (D/2)²))``."""
    scores = _f64(scores)
    shape = scores.shape
    S = shape[-1]
    centers = np.broadcast_to(_f64(centers), shape[:-1])
    mask = np.ones(shape, bool) if mask is None else np.broadcast_to(np.asarray(mask, bool), shape)
    weights = np.zeros(shape)
    for row in np.ndindex(*shape[:-1]):
        p = float(centers[row])
        centre = math.floor(p + 0.5)
        valid = [bool(mask[row + (s,)]) and abs(s - centre) <= window for s in range(S)]
        w = softmax_row_ref(scores[row], valid)
        if gaussian:
            sigma = window / 2
            w = np.array([w[s] * math.exp(-((s - p) ** 2) / (2 * sigma**2)) for s in range(S)])
        weights[row] = w
    return context_ref(weights, values), weights
