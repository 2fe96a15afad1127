"""float64 loop reference for the intra-attention GRU (LSTMN-style; Cheng, Dong & Lapata 2016, with a GRU).

Written from the equations, one sentence, one step and one unit at a time, over the sentence's *real* tokens only
(padding is never seen here), so a padding leak, a wrong causal boundary or a swapped axis shows up as a mismatch::

    a_{t,j} = vᵀ tanh(W_h h_j + W_x x_t + W_h̃ h̃_{t-1} + b)   for the positions j read before t
    s_t = softmax_j(a_{t,j}),   h̃_t = Σ_j s_{t,j} h_j   (h̃_t = h_0 if nothing was read before t)
    h_t = GRU(x_t, h̃_t),        h̃_{-1} = h_0
"""

import math

import numpy as np

from tests.reference.core import softmax_row_ref
from tests.reference.rnn import gru_cell_ref

__all__ = ["intra_model_params", "intra_sequence_ref", "intra_states_ref"]


def _f64(tree):
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    return np.asarray(tree, np.float64)


def _vecmat(x, w):
    """``out[o] = Σ_i x[i] w[i, o]``, one input unit at a time."""
    out = np.zeros(w.shape[1:])
    for i in range(w.shape[0]):
        out += x[i] * w[i]
    return out


def intra_sequence_ref(gru, intra, xs, *, reverse=False, h0=None):
    """States ``[L, n]`` (time order) and weights ``[L, L]`` of the intra-attention GRU over ``xs [L, Din]``.

    ``weights[t, j]`` is ``s_{t,j}``; zero for positions not read before ``t`` and an all-zero row at the first
    position read.
    """
    gru, intra = _f64(gru), _f64(intra)
    n = gru["u"].shape[-1]
    length = len(xs)
    h0 = np.zeros(n) if h0 is None else np.asarray(h0, np.float64)
    states, weights = np.zeros((length, n)), np.zeros((length, length))
    order = list(range(length - 1, -1, -1)) if reverse else list(range(length))
    read = []  # positions already processed, in processing order
    summary_prev = h0
    for t in order:
        x = np.asarray(xs[t], np.float64)
        if read:
            q = _vecmat(x, intra["w_x"]) + _vecmat(summary_prev, intra["w_tilde"]) + intra["b"]
            energies = []
            for j in read:
                k = _vecmat(states[j], intra["w_h"])
                energies.append(sum(intra["v"][a] * math.tanh(q[a] + k[a]) for a in range(len(q))))
            s = softmax_row_ref(np.array(energies))
            summary = np.zeros(n)
            for w, j in zip(s, read, strict=True):
                summary += w * states[j]
                weights[t, j] = w
        else:
            summary = h0
        states[t] = gru_cell_ref(gru, summary, x)
        summary_prev = summary
        read.append(t)
    return states, weights


def intra_model_params(params):
    """A model's pure param dict rearranged so ``tests.reference.rnn``'s model references can run with intra-attention.

    Each intra-attention encoder direction ``{"cell": {"params": gru}, "attention": intra}`` becomes
    ``{"params": {"gru": gru, "intra": intra}}``, where those references read a GRU's params; patch their
    ``gru_sequence_ref`` with :func:`intra_states_ref` (which reads that pair) to get the intra encoder.
    """

    def direction(d):
        return {"params": {"gru": d["cell"]["params"], "intra": d["attention"]}}

    out = dict(params)
    enc = params["encoder"]
    if "forward" in enc:
        out["encoder"] = {"forward": direction(enc["forward"]), "backward": direction(enc["backward"])}
    else:
        out["encoder"] = direction(enc)
    return out


def intra_states_ref(p, xs, reverse=False):
    """Drop-in for ``gru_sequence_ref`` over :func:`intra_model_params`' pairs: the states only."""
    return intra_sequence_ref(p["gru"], p["intra"], xs, reverse=reverse)[0]
