"""float64 loop-by-loop reference of the Transformer (Vaswani et al. 2017) for ``tests/test_transformer.py``.

Written from the paper's equations, one sentence, one layer, one head and one position at a time, reading the
parameter dict of ``attn_jax.models.transformer.Transformer`` (``nnx.to_pure_dict`` of its ``nnx.Param`` state).
Shares only the masked-softmax row reference of ``tests/reference/core.py`` (and, with ``normalizer=``, the
sparsemax / 1.5-entmax row references of ``tests/reference/normalizers.py``).
"""

import math

import numpy as np

from tests.reference.core import softmax_row_ref
from tests.reference.normalizers import ROW_REFS
from tests.reference.positions import alibi_slopes_ref, relative_index_ref

LN_EPS = 1e-6


def f64(tree):
    """Every array of a nested dict as float64 NumPy."""
    if isinstance(tree, dict):
        return {k: f64(v) for k, v in tree.items()}
    return np.asarray(tree, np.float64)


def layer(params, index):
    """Layer ``index`` of parameters stacked on a leading layer axis."""
    if isinstance(params, dict):
        return {k: layer(v, index) for k, v in params.items()}
    return params[index]


def layer_norm_ref(x, p):
    """LayerNorm of one vector: ``(x - mean) / sqrt(var + eps) * scale + bias``."""
    n = len(x)
    mean = sum(x[i] for i in range(n)) / n
    var = sum((x[i] - mean) ** 2 for i in range(n)) / n
    return np.array(
        [(x[i] - mean) / math.sqrt(var + LN_EPS) * p["scale"][i] + p["bias"][i] for i in range(n)]
    )


def sinusoid_ref(pos, d):
    """``PE(pos, 2i) = sin(pos / 10000^(2i/d))``, ``PE(pos, 2i+1) = cos(...)`` (Vaswani §3.5)."""
    pe = np.zeros(d)
    for i in range(d // 2):
        angle = pos / 10000.0 ** (2 * i / d)
        pe[2 * i], pe[2 * i + 1] = math.sin(angle), math.cos(angle)
    return pe


def rope_vec_ref(x, pos, base=10000.0):
    """RoFormer's rotation of the interleaved pairs ``(2i, 2i+1)`` of one vector by ``pos · base^(-2i/K)``."""
    k = len(x)
    y = np.zeros(k)
    for i in range(k // 2):
        theta = pos * base ** (-2 * i / k)
        a, b = x[2 * i], x[2 * i + 1]
        y[2 * i] = a * math.cos(theta) - b * math.sin(theta)
        y[2 * i + 1] = a * math.sin(theta) + b * math.cos(theta)
    return y


def mha_ref(p, xq, xkv, allowed, rope=False, normalizer="softmax", alibi=False, relative=None):
    """Multi-head attention with explicit loops: ``(out [Tq, D], weights [H, Tq, Tk])``.

    Key and value kernels ``[D, G, K]`` with ``G < H`` (grouped-query attention) give head ``h`` the key/value
    head ``h // (H / G)``.

    ``head_h = softmax(q_h k_hᵀ / √K) v_h`` for each head ``h`` alone (RoPE on ``q_h``/``k_h`` at their
    positions when ``rope``), then ``Σ_h head_h W^O_h + b^O`` — the concatenation times ``W^O``, written as a sum
    over the heads' row blocks. ``allowed(i, j)`` says whether query ``i`` may attend key ``j``; ``normalizer``
    replaces the softmax by sparsemax or 1.5-entmax over the allowed keys. ``alibi``:
    add ``-m_h·|i - j|`` to head ``h``'s logits (Press et al. 2022); ``relative``: ``(a^K, a^V, k)``, Shaw et
    al. 2018's ``q_i·(k_j + a^K_ij)/√K`` and ``Σ_j α_ij (v_j + a^V_ij)`` with ``ij`` the clipped distance's row.
    """
    row_ref = softmax_row_ref if normalizer == "softmax" else ROW_REFS[normalizer]
    _, h_count, k_width = p["query"]["kernel"].shape
    per_group = (
        h_count // p["key"]["kernel"].shape[1]
    )  # grouped-query attention: query head h reads kv head h // per_group
    tq, tk = len(xq), len(xkv)
    out = np.zeros((tq, p["out"]["kernel"].shape[-1]))
    weights = np.zeros((h_count, tq, tk))
    slopes = alibi_slopes_ref(h_count) if alibi else None
    for h in range(h_count):

        def proj(name, x, h=h):
            g = h if name == "query" else h // per_group
            return x @ p[name]["kernel"][:, g, :] + p[name]["bias"][g]

        q = [proj("query", xq[i]) for i in range(tq)]
        k = [proj("key", xkv[j]) for j in range(tk)]
        v = [proj("value", xkv[j]) for j in range(tk)]
        if rope:
            q = [rope_vec_ref(q[i], i) for i in range(tq)]
            k = [rope_vec_ref(k[j], j) for j in range(tk)]
        for i in range(tq):
            if relative is None:
                keys, values = k, v
            else:
                rel_k, rel_v, dist = relative
                rows = [relative_index_ref(i, j, dist) for j in range(tk)]
                keys = [k[j] + rel_k[rows[j]] for j in range(tk)]
                values = [v[j] + rel_v[rows[j]] for j in range(tk)]
            energies = [float(np.dot(q[i], keys[j])) / math.sqrt(k_width) for j in range(tk)]
            if alibi:
                energies = [e - slopes[h] * abs(i - j) for j, e in enumerate(energies)]
            w = row_ref(np.asarray(energies), [allowed(i, j) for j in range(tk)])
            context = sum((w[j] * values[j] for j in range(tk)), np.zeros(v[0].shape))
            out[i] += context @ p["out"]["kernel"][h]
            weights[h, i] = w
    return out + p["out"]["bias"], weights


def ffn_ref(p, x):
    """``max(0, x W_1 + b_1) W_2 + b_2`` for one vector."""
    return np.maximum(x @ p["w_1"] + p["b_1"], 0.0) @ p["w_2"] + p["b_2"]


def _residual(norm, p_norm, x, fn):
    """Post-LN ``LN(x + fn(x))`` or pre-LN ``x + fn(LN(x))`` over a list of position vectors (no dropout)."""
    if norm == "pre":
        out = fn([layer_norm_ref(xi, p_norm) for xi in x])
        return [x[i] + out[i] for i in range(len(x))]
    out = fn(x)
    return [layer_norm_ref(x[i] + out[i], p_norm) for i in range(len(x))]


def _embed(table, tokens, positions_kind, position_table, d):
    """``E[w]·√d + PE(pos)`` per position (nothing added with RoPE)."""
    out = []
    for pos, w in enumerate(tokens):
        x = table[w] * math.sqrt(d)
        if positions_kind == "sinusoidal":
            x = x + sinusoid_ref(pos, d)
        elif positions_kind == "learned":
            x = x + position_table[pos]
        out.append(x)
    return out


def _relative(pl, dist):
    """A layer's Shaw tables ``(a^K, a^V, k)``, or None without relative positions."""
    return None if "relative" not in pl else (pl["relative"]["keys"], pl["relative"]["values"], dist)


def _encoder_layer_ref(pl, x, valid, norm, rope, alibi=False, dist=None, normalizer="softmax"):
    """Self-attention over the real source words, then the FFN, each a residual sub-layer."""

    def attention(h):
        return list(
            mha_ref(
                pl["attention"], h, h, lambda i, j: valid[j], rope, normalizer, alibi, _relative(pl, dist)
            )[0]
        )

    x = _residual(norm, pl["attention_norm"], x, attention)
    return _residual(norm, pl["ffn_norm"], x, lambda h: [ffn_ref(pl["ffn"], hi) for hi in h])


def _decoder_layer_ref(pl, y, memory, valid, norm, rope, alibi=False, dist=None, normalizer="softmax"):
    """Causal self-attention, cross-attention over the real source words, FFN: ``(y, cross weights)``."""
    cross = {}

    def self_attention(h):
        return list(
            mha_ref(
                pl["self_attention"], h, h, lambda i, j: j <= i, rope, normalizer, alibi, _relative(pl, dist)
            )[0]
        )

    def cross_attention(h):
        out, cross["w"] = mha_ref(
            pl["cross_attention"], h, memory, lambda i, j: valid[j], normalizer=normalizer
        )
        return list(out)

    y = _residual(norm, pl["self_attention_norm"], y, self_attention)
    y = _residual(norm, pl["cross_attention_norm"], y, cross_attention)
    y = _residual(norm, pl["ffn_norm"], y, lambda h: [ffn_ref(pl["ffn"], hi) for hi in h])
    return y, cross["w"]


def transformer_ref(
    params,
    src,
    src_mask,
    tgt_in,
    *,
    norm,
    positions,
    share_embeddings,
    max_relative_positions=None,
    normalizer="softmax",
):
    """Teacher-forced Transformer in float64, one sentence at a time (``normalizer``: every attention's).

    Returns a dict: ``logits`` ``[B, T, V]``, ``cross`` ``[B, L_dec, H, T, S]`` (every layer's cross-attention
    weights), ``decoder`` ``[B, L_dec, T, D]`` and ``encoder`` ``[B, L_enc, S, D]`` (each layer's output, before
    the final pre-LN), ``memory`` ``[B, S, D]`` (encoder output, zero at padding).
    """
    p = f64(params)
    src, src_mask, tgt_in = np.asarray(src), np.asarray(src_mask, bool), np.asarray(tgt_in)
    tgt_table = p["tgt_embed"]
    src_table = tgt_table if share_embeddings == "all" else p["src_embed"]
    d = tgt_table.shape[1]
    n_enc = p["encoder"]["ffn"]["w_1"].shape[0]
    n_dec = p["decoder"]["ffn"]["w_1"].shape[0]
    rope, alibi, dist = positions == "rope", positions == "alibi", max_relative_positions
    batch, s_len = src.shape
    t_len = tgt_in.shape[1]
    heads = p["decoder"]["cross_attention"]["query"]["kernel"].shape[2]
    out = {
        "logits": np.zeros((batch, t_len, tgt_table.shape[0])),
        "cross": np.zeros((batch, n_dec, heads, t_len, s_len)),
        "decoder": np.zeros((batch, n_dec, t_len, d)),
        "encoder": np.zeros((batch, n_enc, s_len, d)),
        "memory": np.zeros((batch, s_len, d)),
    }
    for b in range(batch):
        valid = src_mask[b]
        x = _embed(src_table, src[b], positions, p.get("src_positions"), d)
        for l_idx in range(n_enc):
            x = _encoder_layer_ref(layer(p["encoder"], l_idx), x, valid, norm, rope, alibi, dist, normalizer)
            out["encoder"][b, l_idx] = np.stack(x)
        if norm == "pre":
            x = [layer_norm_ref(xi, p["encoder_norm"]) for xi in x]
        memory = [x[j] if valid[j] else np.zeros(d) for j in range(s_len)]
        out["memory"][b] = np.stack(memory)
        y = _embed(tgt_table, tgt_in[b], positions, p.get("tgt_positions"), d)
        for l_idx in range(n_dec):
            y, out["cross"][b, l_idx] = _decoder_layer_ref(
                layer(p["decoder"], l_idx), y, memory, valid, norm, rope, alibi, dist, normalizer
            )
            out["decoder"][b, l_idx] = np.stack(y)
        if norm == "pre":
            y = [layer_norm_ref(yi, p["decoder_norm"]) for yi in y]
        for i, yi in enumerate(y):
            for v in range(tgt_table.shape[0]):
                # Untied: the output kernel's column v; tied: the target embedding's row v (E_tgtᵀ).
                w = p["output"]["kernel"][:, v] if share_embeddings == "none" else tgt_table[v]
                out["logits"][b, i, v] = np.dot(yi, w) + p["output"]["bias"][v]
    return out
