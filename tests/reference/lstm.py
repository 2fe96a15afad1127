"""float64 loop references for the LSTM and for the whole GNMT forward (Wu et al. 2016; tf/nmt gnmt_v2 wiring).

Written from the equations in ``attn_jax/nn/lstm.py`` and ``attn_jax/models/gnmt.py``, one unit and one time step
at a time, one sentence at a time over its *real* source words only (a padded batch is never seen here), with the
layers visited one by one in order (no stacking, no scan), so a padding leak, a swapped gate, a layer run in the
wrong order or a residual on the wrong layer shows up as a mismatch. Parameters are read from the model's pure
dict (``nnx.to_pure_dict(nnx.state(model, nnx.Param))``); stacked layers are sliced on their leading axis.
"""

import math

import numpy as np

from tests.reference.core import softmax_row_ref

__all__ = ["gnmt_ref", "lstm_cell_ref", "lstm_sequence_ref"]


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


def lstm_cell_ref(p, h, cell, x, context=None):
    """One LSTM step, gates ``(i, f, g, o)``: ``c' = f c + i g``, ``h = o tanh(c')``. Returns ``(h, c')``."""
    p = _f64(p)
    n = p["u"].shape[-1]
    a = np.array(p["b"]).copy()  # [4, n]
    a += _vecmat(np.asarray(x, np.float64), p["w_x"])
    if context is not None:
        a += _vecmat(np.asarray(context, np.float64), p["w_c"])
    new_h, new_c = np.zeros(n), np.zeros(n)
    for o in range(n):
        pre = [a[g, o] + sum(h[k] * p["u"][k, g, o] for k in range(n)) for g in range(4)]
        i, f, g, out = _sigmoid(pre[0]), _sigmoid(pre[1]), math.tanh(pre[2]), _sigmoid(pre[3])
        new_c[o] = f * cell[o] + i * g
        new_h[o] = out * math.tanh(new_c[o])
    return new_h, new_c


def lstm_sequence_ref(p, xs, reverse=False, contexts=None):
    """Outputs ``h`` of an LSTM over ``xs [T, Din]`` (real tokens only) from zero states, in time order, and the
    final ``(h, c')`` in scan order."""
    p = _f64(p)
    n = p["u"].shape[-1]
    h, c = np.zeros(n), np.zeros(n)
    order = range(len(xs) - 1, -1, -1) if reverse else range(len(xs))
    out = np.zeros((len(xs), n))
    for t in order:
        h, c = lstm_cell_ref(p, h, c, xs[t], None if contexts is None else contexts[t])
        out[t] = h
    return out, (h, c)


def _layer(stack, index):
    """Layer ``index`` of a stacked param dict (every leaf sliced on its leading ``layers`` axis)."""
    return {k: v[index] for k, v in stack.items()}


def _attention(a, query, memory):
    """Additive (optionally weight-normalised) attention of one query over the real memory rows ``[L, n]``."""
    v = a["v"]
    if "g" in a:
        v = a["g"] * v / math.sqrt(sum(x * x for x in v))
    q = _vecmat(query, a["w_q"]) + a.get("b", 0.0)
    energies = []
    for j in range(memory.shape[0]):
        k = _vecmat(memory[j], a["w_k"])
        energies.append(sum(v[u] * math.tanh(q[u] + k[u]) for u in range(len(v))))
    alpha = softmax_row_ref(np.array(energies))
    ctx = np.zeros(memory.shape[1])
    for j in range(memory.shape[0]):
        ctx += alpha[j] * memory[j]
    return ctx, alpha


def gnmt_ref(params, src, src_mask, tgt_in, *, residual_start):
    """GNMT logits ``[B, T, V]`` and bottom-layer attention ``[B, T, S]`` (zeros at padding), sentence by sentence.

    Encoder: bidirectional layer 1, ``x² = LSTM(x¹)``, ``x^l = LSTM(x^{l-1}) (+ x^{l-1} if l ≥ r)``. Decoder from
    zero states: ``h¹_i = LSTM([E y_{i-1}; a_{i-1}])``, ``a_i`` from the query ``h¹_i``,
    ``ỹ^l_i = LSTM([ỹ^{l-1}_i; a_i]) (+ ỹ^{l-1}_i if l ≥ r)``, ``logits = W ỹ^{L_d}_i + b``.
    """
    params = _f64(params)
    src, src_mask, tgt_in = np.asarray(src), np.asarray(src_mask, bool), np.asarray(tgt_in)
    B, S = src.shape
    T = tgt_in.shape[1]
    V = params["output"]["w"].shape[1]

    # Encoder layers 2 .. L_e in order, and decoder layers 2 .. L_d in order, with their residual flags.
    enc_layers = [params["encoder_plain"][k]["params"] for k in sorted(params["encoder_plain"])]
    if "encoder_stack" in params:
        stack = params["encoder_stack"]["params"]
        enc_layers += [_layer(stack, k) for k in range(stack["u"].shape[0])]
    dec_layers = [params["decoder_plain"][k]["params"] for k in sorted(params["decoder_plain"])]
    if "decoder_stack" in params:
        stack = params["decoder_stack"]["params"]
        dec_layers += [_layer(stack, k) for k in range(stack["u"].shape[0])]
    n = params["decoder_bottom"]["params"]["u"].shape[-1]

    logits, attention = np.zeros((B, T, V)), np.zeros((B, T, S))
    for b in range(B):
        real = [j for j in range(S) if src_mask[b, j]]
        xs = params["src_embed"]["embedding"][src[b, real]]
        fwd, _ = lstm_sequence_ref(params["encoder_forward"]["params"], xs)
        bwd, _ = lstm_sequence_ref(params["encoder_backward"]["params"], xs, reverse=True)
        x = np.concatenate([fwd, bwd], axis=1)  # [L, 2n]
        for depth, p in enumerate(enc_layers, start=2):
            out, _ = lstm_sequence_ref(p, x)
            x = out + x if depth >= residual_start else out
        memory = x  # [L, n]

        bottom = (np.zeros(n), np.zeros(n))
        states = [(np.zeros(n), np.zeros(n)) for _ in dec_layers]
        ctx = np.zeros(n)
        for i in range(T):
            e = params["tgt_embed"]["embedding"][tgt_in[b, i]]
            bottom = lstm_cell_ref(params["decoder_bottom"]["params"], *bottom, e, ctx)  # reads a_{i-1}
            ctx, alpha = _attention(params["attention"]["params"], bottom[0], memory)  # a_i from h¹_i
            for k, j in enumerate(real):
                attention[b, i, j] = alpha[k]
            y = bottom[0]
            for depth, p in enumerate(dec_layers, start=2):
                states[depth - 2] = lstm_cell_ref(p, *states[depth - 2], y, ctx)
                y = states[depth - 2][0] + y if depth >= residual_start else states[depth - 2][0]
            logits[b, i] = _vecmat(y, params["output"]["w"]) + params["output"]["b"]
    return logits, attention
