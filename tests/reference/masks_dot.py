"""float64 loop references for masks, dot-product and multi-head attention, and positional encodings."""

import math

import numpy as np

from tests.reference.core import context_ref, softmax_ref


def padding_mask_ref(lengths, max_len):
    """``m[b, j] = j < lengths[b]``, one entry at a time."""
    lengths = np.asarray(lengths)
    out = np.zeros(lengths.shape + (max_len,), bool)
    for idx in np.ndindex(*lengths.shape):
        for j in range(max_len):
            out[idx + (j,)] = j < lengths[idx]
    return out


def causal_mask_ref(query_length, key_length, offset=0):
    """``m[i, j] = j <= i + offset``, one entry at a time."""
    out = np.zeros((query_length, key_length), bool)
    for i in range(query_length):
        for j in range(key_length):
            out[i, j] = j <= i + offset
    return out


def dot_scores_ref(query, keys, scale=None):
    """``e[..., t, s] = scale · Σ_k q[..., t, k] k[..., s, k]`` with explicit loops."""
    q = np.asarray(query, np.float64)
    k = np.asarray(keys, np.float64)
    width = q.shape[-1]
    scale = 1.0 / math.sqrt(width) if scale is None else scale
    batch = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    q = np.broadcast_to(q, batch + q.shape[-2:])
    k = np.broadcast_to(k, batch + k.shape[-2:])
    T, S = q.shape[-2], k.shape[-2]
    out = np.zeros(batch + (T, S))
    for b in np.ndindex(*batch):
        for t in range(T):
            for s in range(S):
                out[b + (t, s)] = scale * sum(q[b + (t, i)] * k[b + (s, i)] for i in range(width))
    return out


def dot_attention_ref(query, key, value, mask=None, bias=None, scale=None):
    """``(context, weights)`` of masked scaled dot-product attention in float64."""
    logits = dot_scores_ref(query, key, scale)
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    batch = np.broadcast_shapes(logits.shape[:-2], np.shape(value)[:-2])
    logits = np.broadcast_to(logits, batch + logits.shape[-2:])
    weights = softmax_ref(logits, mask)
    return context_ref(weights, value), weights


def _linear_ref(x, kernel, bias):
    """``y[..., t, o] = Σ_d x[..., t, d] W[d, o] + b[o]`` with a loop over the output features."""
    x = np.asarray(x, np.float64)
    kernel = np.asarray(kernel, np.float64)
    out = np.zeros(x.shape[:-1] + (kernel.shape[1],))
    for o in range(kernel.shape[1]):
        out[..., o] = sum(x[..., d] * kernel[d, o] for d in range(kernel.shape[0]))
        if bias is not None:
            out[..., o] += float(bias[o])
    return out


def multi_head_ref(params, inputs_q, inputs_kv=None, mask=None, scale=None):
    """``(out, weights [..., H, T, S])``: H independent single-head attentions, concatenated, then projected.

    ``mask`` is ``[..., T, S]`` (same for every head) or ``[..., H, T, S]``.
    """
    inputs_kv = inputs_q if inputs_kv is None else inputs_kv
    p = {n: {k: np.asarray(v, np.float64) for k, v in d.items()} for n, d in params.items()}
    H = p["query"]["kernel"].shape[1]
    heads, weights = [], []
    for h in range(H):
        q = _linear_ref(inputs_q, p["query"]["kernel"][:, h, :], p["query"].get("bias", [None] * H)[h])
        k = _linear_ref(inputs_kv, p["key"]["kernel"][:, h, :], p["key"].get("bias", [None] * H)[h])
        v = _linear_ref(inputs_kv, p["value"]["kernel"][:, h, :], p["value"].get("bias", [None] * H)[h])
        m = None
        if mask is not None:
            m = np.asarray(mask)
            if m.ndim == np.ndim(inputs_q) + 1:
                m = np.take(m, 0 if m.shape[-3] == 1 else h, axis=-3)
        ctx, w = dot_attention_ref(q, k, v, m, scale=scale)
        heads.append(ctx)
        weights.append(w)
    concat = np.concatenate(heads, axis=-1)  # [..., T, H·Kv], head-major like Flax's out kernel [H, Kv, Do]
    wo = p["out"]["kernel"]
    out = _linear_ref(concat, wo.reshape(wo.shape[0] * wo.shape[1], wo.shape[2]), p["out"].get("bias"))
    return out, np.stack(weights, axis=-3)


def sinusoidal_ref(positions, features, max_timescale=10000.0):
    """``PE[pos, 2i] = sin(pos / 10000^(2i/D))``, ``PE[pos, 2i+1] = cos(...)``, entry by entry."""
    positions = np.arange(positions) if np.ndim(positions) == 0 else np.asarray(positions)
    out = np.zeros(positions.shape + (features,))
    for idx in np.ndindex(*positions.shape):
        pos = float(positions[idx])
        for i in range(features // 2):
            angle = pos / max_timescale ** (2 * i / features)
            out[idx + (2 * i,)] = math.sin(angle)
            out[idx + (2 * i + 1,)] = math.cos(angle)
    return out


def rope_ref(x, positions=None, base=10000.0, interleaved=True):
    """RoPE, one feature pair at a time: pair i is (2i, 2i+1) if interleaved else (i, i + K/2)."""
    x = np.asarray(x, np.float64)
    *lead, L, K = x.shape
    positions = np.arange(L) if positions is None else np.asarray(positions)
    positions = np.broadcast_to(positions, x.shape[:-1])
    out = np.zeros_like(x)
    for idx in np.ndindex(*x.shape[:-1]):
        m = float(positions[idx])
        for i in range(K // 2):
            a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + K // 2)
            theta = m * base ** (-2 * i / K)
            c, s = math.cos(theta), math.sin(theta)
            out[idx + (a,)] = c * x[idx + (a,)] - s * x[idx + (b,)]
            out[idx + (b,)] = s * x[idx + (a,)] + c * x[idx + (b,)]
    return out


def gqa_attention_ref(query, key, value, num_kv_heads, mask=None, scale=None):
    """``(context [..., H, T, Kv], weights [..., H, T, S])`` of grouped-query attention, one query head at a time.

    Query head ``h`` of ``[..., H, T, K]`` attends key/value head ``h // (H / G)`` of ``[..., G, S, K|Kv]``
    (Ainslie et al. 2023); ``mask`` is ``[..., T, S]`` or ``[..., H|1, T, S]``.
    """
    q, k, v = (np.asarray(x, np.float64) for x in (query, key, value))
    heads = q.shape[-3]
    per_group = heads // num_kv_heads
    contexts, weights = [], []
    for h in range(heads):
        g = h // per_group
        m = None
        if mask is not None:
            m = np.asarray(mask)
            if m.ndim >= 3:
                m = np.take(m, 0 if m.shape[-3] == 1 else h, axis=-3)
        ctx, w = dot_attention_ref(q[..., h, :, :], k[..., g, :, :], v[..., g, :, :], m, scale=scale)
        contexts.append(ctx)
        weights.append(w)
    return np.stack(contexts, axis=-3), np.stack(weights, axis=-3)


def multi_head_gqa_ref(params, inputs_q, inputs_k, inputs_v, mask=None, scale=None):
    """``(out, weights [..., H, T, S])`` of multi-head attention with ``G`` key/value heads and separate key and
    value inputs: query head ``h`` uses key/value projection ``h // (H / G)``; heads concatenated, projected.

    ``params`` as ``init_multi_head_params`` (key kernel ``[Dk, G, K]``, value kernel ``[Dv, G, Kv]``); ``mask``
    ``[..., T, S]`` or ``[..., H, T, S]``.
    """
    p = {n: {k: np.asarray(v, np.float64) for k, v in d.items()} for n, d in params.items()}
    heads, groups = p["query"]["kernel"].shape[1], p["key"]["kernel"].shape[1]

    def project(name, x, h):
        bias = p[name]["bias"][h] if "bias" in p[name] else None
        return _linear_ref(x, p[name]["kernel"][:, h, :], bias)

    contexts, weights = [], []
    for h in range(heads):
        g = h // (heads // groups)
        m = None
        if mask is not None:
            m = np.asarray(mask)
            if m.ndim == np.ndim(inputs_q) + 1:
                m = np.take(m, 0 if m.shape[-3] == 1 else h, axis=-3)
        ctx, w = dot_attention_ref(
            project("query", inputs_q, h),
            project("key", inputs_k, g),
            project("value", inputs_v, g),
            m,
            scale=scale,
        )
        contexts.append(ctx)
        weights.append(w)
    concat = np.concatenate(contexts, axis=-1)  # [..., T, H·Kv], head-major like the out kernel [H, Kv, Do]
    wo = p["out"]["kernel"]
    out = _linear_ref(concat, wo.reshape(wo.shape[0] * wo.shape[1], wo.shape[2]), p["out"].get("bias"))
    return out, np.stack(weights, axis=-3)
