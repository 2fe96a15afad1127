"""float64 loop references for the GRU, RNNsearch (every scorer, input feeding) and RNNenc.

Written from the papers' equations (Bahdanau, Cho & Bengio 2015, appendix A; Cho et al. 2014), one unit and one
time step at a time, over each sentence's *real* tokens only (a padded batch is never seen here), so that a padding
leak, a swapped axis or a wrong gate shows up as a mismatch. Parameters are read from the model's pure dict
(``nnx.state(model, nnx.Param).to_pure_dict()``) and converted to float64.
"""

import math

import numpy as np

from tests.reference.copy import pointer_generator_ref
from tests.reference.core import softmax_row_ref

__all__ = ["gru_cell_ref", "gru_sequence_ref", "rnnenc_ref", "rnnsearch_ref"]


def _f64(tree):
    if isinstance(tree, dict):
        return {k: _f64(v) for k, v in tree.items()}
    return np.asarray(tree, np.float64)


def _sigmoid(x):
    return 1.0 / (1.0 + math.exp(-x))


def _vecmat(x, w):
    """``out[o...] = Σ_i x[i] w[i, o...]`` with an explicit loop over the input units."""
    out = np.zeros(w.shape[1:])
    for i in range(w.shape[0]):
        out += x[i] * w[i]
    return out


def gru_cell_ref(p, h, x, context=None, extra=None):
    """One GRU step (appendix A.2.2): gates (z, r, candidate); ``extra = (kernel [E, 3, n], input [E])``."""
    n = p["u"].shape[-1]
    a = np.array(p["b"], np.float64).copy()  # [3, n]
    a += _vecmat(x, p["w_x"])
    if context is not None:
        a += _vecmat(context, p["w_c"])
    if extra is not None:
        a += _vecmat(extra[1], extra[0])
    z = np.zeros(n)
    r = np.zeros(n)
    for o in range(n):
        z[o] = _sigmoid(a[0, o] + sum(h[k] * p["u"][k, 0, o] for k in range(n)))
        r[o] = _sigmoid(a[1, o] + sum(h[k] * p["u"][k, 1, o] for k in range(n)))
    out = np.zeros(n)
    for o in range(n):
        cand = math.tanh(a[2, o] + sum(r[k] * h[k] * p["u"][k, 2, o] for k in range(n)))
        out[o] = (1.0 - z[o]) * h[o] + z[o] * cand
    return out


def gru_sequence_ref(p, xs, reverse=False):
    """States of a GRU over ``xs [T, Din]`` (only real tokens), ``h_0 = 0``; returned in time order."""
    p = _f64(p)
    h = np.zeros(p["u"].shape[-1])
    if len(xs) == 0:
        return np.zeros((0, h.shape[0]))
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    states = [None] * len(xs)
    for t in order:
        h = gru_cell_ref(p, h, np.asarray(xs[t], np.float64))
        states[t] = h
    return np.array(states).reshape(len(xs), -1)


def _readout_logits(out, s, e, c):
    """Deep output: ``t = maxout_2(U_o s + V_o e + C_o c + b_o)``, ``logits = W_o t + b``."""
    pre = out["b_o"] + _vecmat(s, out["u_o"]) + _vecmat(e, out["v_o"]) + _vecmat(c, out["c_o"])  # [l, 2]
    t = np.array([max(pre[u, 0], pre[u, 1]) for u in range(pre.shape[0])])
    return t, out["b_w"] + _vecmat(t, out["w_o"])


def _energies(params, scorer, s, ann, n, coverage=None):
    """Unnormalised scores ``e_j`` of one query ``s`` against the real annotations ``ann [L, 2n]`` (with the
    coverage term ``w_c c_j`` inside the tanh when ``coverage [L]`` is given)."""
    L = ann.shape[0]
    if scorer in ("additive", "normed_additive"):
        a = params["attention"]["params"]
        v = a["v"]
        if "g" in a:
            v = a["g"] * v / math.sqrt(sum(x * x for x in v))
        q = _vecmat(s, a["w_q"]) + a.get("b", 0.0)
        keys = [_vecmat(ann[j], a["w_k"]) for j in range(L)]  # U_a h_j
        if coverage is not None:
            keys = [keys[j] + a["w_c"] * coverage[j] for j in range(L)]
        return np.array([sum(v[k] * math.tanh(q[k] + keys[j][k]) for k in range(len(v))) for j in range(L)])
    if scorer == "dot":
        return np.array([sum(s[d] * (ann[j, d] + ann[j, n + d]) for d in range(n)) for j in range(L)])
    w = params["score"]["general"]["w"]  # [n, 2n]
    return np.array(
        [sum(s[d] * w[d, k] * ann[j, k] for d in range(n) for k in range(2 * n)) for j in range(L)]
    )


def _weights(params, scorer, s, ann, n, window, coverage=None):
    """Attention weights over the real source words."""
    e = _energies(params, scorer, s, ann, n, coverage)
    if scorer != "local-p":
        return softmax_row_ref(e)
    pos = params["score"]["position"]
    hidden = np.tanh(_vecmat(s, pos["w_p"]))
    p = (len(e) - 1) * _sigmoid(sum(pos["v_p"][k] * hidden[k] for k in range(len(hidden))))
    centre = math.floor(p + 0.5)
    inside = [abs(j - centre) <= window for j in range(len(e))]
    alpha = softmax_row_ref(e, inside)
    sigma = window / 2
    return np.array([alpha[j] * math.exp(-((j - p) ** 2) / (2 * sigma**2)) for j in range(len(e))])


def rnnsearch_ref(
    params,
    src,
    src_mask,
    tgt_in,
    *,
    scorer="additive",
    input_feeding=False,
    window=10,
    coverage=False,
    copy_src_ext=None,
):
    """RNNsearch logits ``[B, T, V]`` and attention ``[B, T, S]`` (zeros at padding), sentence by sentence;
    ``coverage``: the attention accumulated over the previous steps feeds the additive scorer; ``copy_src_ext``
    (``[B, S]`` extended source ids): the pointer-generator's log-probabilities ``[B, T, V + S]`` instead of the
    logits (See et al. 2017, eq. 8-9; ``p_gen`` reads ``c_i``, ``s_{i-1}`` and ``E y_{i-1}``)."""
    params = _f64(params)
    src, src_mask, tgt_in = np.asarray(src), np.asarray(src_mask, bool), np.asarray(tgt_in)
    B, S = src.shape
    T = tgt_in.shape[1]
    dec, out = params["decoder"]["params"], params["output"]["params"]
    n = dec["u"].shape[-1]
    V = out["w_o"].shape[1]
    logits, attention, gates = np.zeros((B, T, V)), np.zeros((B, T, S)), np.zeros((B, T))
    for b in range(B):
        real = [j for j in range(S) if src_mask[b, j]]
        xs = params["src_embed"]["embedding"][src[b, real]]
        fwd = gru_sequence_ref(params["encoder"]["forward"]["params"], xs)
        bwd = gru_sequence_ref(params["encoder"]["backward"]["params"], xs, reverse=True)
        ann = np.concatenate([fwd, bwd], axis=1)  # [L, 2n]: h_j = [→h_j; ←h_j]
        s = np.tanh(
            _vecmat(bwd[0], params["init_state"]["w_s"]) + params["init_state"]["b_s"]
        )  # s_0 = tanh(W_s ←h_1)
        feed = np.zeros(out["w_o"].shape[0])
        covered = np.zeros(len(real))  # Σ of the previous steps' weights over the real words
        for i in range(T):
            e = params["tgt_embed"]["embedding"][tgt_in[b, i]]
            alpha = _weights(params, scorer, s, ann, n, window, covered if coverage else None)
            covered = covered + alpha
            c = sum(alpha[j] * ann[j] for j in range(len(real)))
            t, logits[b, i] = _readout_logits(out, s, e, c)
            if copy_src_ext is not None:
                g = params["copy_gate"]
                gates[b, i] = g["b"] + math.fsum(
                    [*(c * g["w_h"]), *(s * g["w_s"]), *(e * g["w_x"])]
                )  # the logit of p_gen
            for k, j in enumerate(real):
                attention[b, i, j] = alpha[k]
            extra = (params["feed_kernel"], feed) if input_feeding else None
            s = gru_cell_ref(dec, s, e, c, extra)
            feed = t
    if copy_src_ext is None:
        return logits, attention
    ids = np.broadcast_to(np.asarray(copy_src_ext)[:, None, :], (B, T, S)).reshape(B * T, S)
    mask = np.broadcast_to(src_mask[:, None, :], (B, T, S)).reshape(B * T, S)
    log_probs = pointer_generator_ref(
        logits.reshape(B * T, V), attention.reshape(B * T, S), ids, gates.reshape(-1), V + S, mask
    )
    return log_probs.reshape(B, T, V + S), attention


def rnnenc_ref(params, src, src_mask, tgt_in):
    """RNNenc logits ``[B, T, V]``: ``c = tanh(V h_{T_x})``, ``s_0 = tanh(W_s c)``, c fed to every step."""
    params = _f64(params)
    src, src_mask, tgt_in = np.asarray(src), np.asarray(src_mask, bool), np.asarray(tgt_in)
    B, S = src.shape
    T = tgt_in.shape[1]
    dec, out = params["decoder"]["params"], params["output"]["params"]
    logits = np.zeros((B, T, out["w_o"].shape[1]))
    for b in range(B):
        real = [j for j in range(S) if src_mask[b, j]]
        xs = params["src_embed"]["embedding"][src[b, real]]
        h = gru_sequence_ref(params["encoder"]["params"], xs)
        last = h[-1] if len(real) else np.zeros(dec["u"].shape[-1])
        c = np.tanh(_vecmat(last, params["summary"]["w_v"]) + params["summary"]["b_v"])
        s = np.tanh(_vecmat(c, params["init_state"]["w_s"]) + params["init_state"]["b_s"])
        for i in range(T):
            e = params["tgt_embed"]["embedding"][tgt_in[b, i]]
            _, logits[b, i] = _readout_logits(out, s, e, c)
            s = gru_cell_ref(dec, s, e, c)
    return logits
