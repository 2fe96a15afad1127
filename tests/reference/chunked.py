"""float64 loop reference for the gradients of masked scaled dot-product attention (checks the chunked backward)."""

import math

import numpy as np

from tests.reference.masks_dot import causal_mask_ref, dot_attention_ref


def _unbroadcast(grad, shape):
    """Sum ``grad`` over the axes that broadcasting added to or stretched in ``shape``."""
    grad = grad.sum(axis=tuple(range(grad.ndim - len(shape))))
    return grad.sum(axis=tuple(a for a, n in enumerate(shape) if n == 1), keepdims=True).reshape(shape)


def attention_grads_ref(query, key, value, d_out, mask=None, bias=None, scale=None, causal=False):
    """``(dq, dk, dv, dbias)`` of ``Σ d_out · attention(q, k, v)`` in float64, one query row at a time.

    The textbook softmax backward, independent of any blocking: for each row ``t`` with weights ``w_t``,
    ``dP_ts = d_out_t · v_s``, ``dS_ts = w_ts (dP_ts − Σ_s' w_ts' dP_ts')``, then ``dq_t = scale Σ_s dS_ts k_s``,
    ``dk_s += scale dS_ts q_t``, ``dv_s += w_ts d_out_t``, ``dbias_ts = dS_ts``. Gradients of broadcast operands
    are summed back to their shapes; ``dbias`` is None without a bias.
    """
    q, k, v, g = (np.asarray(x, np.float64) for x in (query, key, value, d_out))
    T, S, K = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(K) if scale is None else scale
    if causal:
        c = causal_mask_ref(T, S)
        mask = c if mask is None else np.logical_and(mask, c)
    _, w = dot_attention_ref(q, k, v, mask, bias, scale)  # [..., T, S], exact zeros where masked
    batch = w.shape[:-2]
    qb, kb, vb = (np.broadcast_to(x, batch + x.shape[-2:]) for x in (q, k, v))
    gb = np.broadcast_to(g, batch + g.shape[-2:])
    dq, dk, dv = np.zeros(qb.shape), np.zeros(kb.shape), np.zeros(vb.shape)
    ds_all = np.zeros(w.shape)
    for b in np.ndindex(*batch):
        for t in range(T):  # one query row at a time; its S keys as float64 vectors
            w_t = w[b + (t,)]  # [S]
            dp = vb[b] @ gb[b + (t,)]  # [S]: d_out_t · v_s
            ds = w_t * (dp - w_t @ dp)
            ds_all[b + (t,)] = ds
            dq[b + (t,)] += scale * (ds @ kb[b])
            dk[b] += scale * np.outer(ds, qb[b + (t,)])
            dv[b] += np.outer(w_t, gb[b + (t,)])
    dbias = None if bias is None else _unbroadcast(ds_all, np.shape(bias))
    return (
        _unbroadcast(dq, q.shape),
        _unbroadcast(dk, k.shape),
        _unbroadcast(dv, v.shape),
        dbias,
    )


def gqa_attention_grads_ref(query, key, value, d_out, num_kv_heads, mask=None, scale=None):
    """``(dq, dk, dv)`` of ``Σ d_out · gqa_attention(q, k, v)`` in float64, one query head at a time.

    Query head ``h`` reads key/value head ``g = h // (H / G)``, so ``dk[g]`` and ``dv[g]`` are the sums of the
    :func:`attention_grads_ref` of the ``H / G`` heads of group ``g``; ``mask`` is ``[..., T, S]`` or
    ``[..., H|1, T, S]``.
    """
    q, k, v, g_out = (np.asarray(x, np.float64) for x in (query, key, value, d_out))
    heads = q.shape[-3]
    per_group = heads // num_kv_heads
    dq = np.zeros(np.broadcast_shapes(q.shape, g_out.shape[:-1] + q.shape[-1:]))
    dk, dv = np.zeros(k.shape), np.zeros(v.shape)
    for h in range(heads):
        g = h // per_group
        m = None
        if mask is not None:
            m = np.asarray(mask)
            if m.ndim >= 3:
                m = np.take(m, 0 if m.shape[-3] == 1 else h, axis=-3)
        dq_h, dk_h, dv_h, _ = attention_grads_ref(
            q[..., h, :, :], k[..., g, :, :], v[..., g, :, :], g_out[..., h, :, :], m, scale=scale
        )
        dq[..., h, :, :] = dq_h
        dk[..., g, :, :] += dk_h
        dv[..., g, :, :] += dv_h
    return dq, dk, dv
