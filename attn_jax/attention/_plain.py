"""The plain (``"xla"``) path of :func:`dot_product_attention`: the reference the other implementations match.

It forms the ``[..., T, S]`` logits and weights in float32, so it is the only path that can return the weights
or normalise them with sparsemax or 1.5-entmax. In the common case (no returned weights, a static ``scale``, and
operands that share their batch axes) its derivative is hand-written: a ``jax.custom_jvp`` whose transpose is
FlashAttention's backward, ``dS = P ∘ (dP − rowsum(dO ∘ O))`` (Dao et al. 2022). That is one fewer ``[T, S]``
pass than autodiff of the softmax, with the same values, and forward mode still works. Every other case uses
plain autodiff of the same operations.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_derivatives import SymbolicZero

from attn_jax.attention._checks import check_broadcastable, check_floating, check_min_rank, shape_str
from attn_jax.attention._masks import make_causal_mask, sliding_window_mask
from attn_jax.attention._normalizers import attend_normalized
from attn_jax.attention._padding import allowed_pairs
from attn_jax.attention._softmax import attend, masked_softmax
from attn_jax.typing import Array, Float


def _check_qk(query, keys) -> tuple[int, ...]:
    """Validate query/key ranks, widths and batch axes; return the logits shape ``[..., T, S]``."""
    check_min_rank("query", query, 2)
    check_min_rank("key", keys, 2)
    check_floating("query", query)
    check_floating("key", keys)
    if np.shape(query)[-1] != np.shape(keys)[-1]:
        raise ValueError(
            "query and key must have the same width K (last axis): "
            f"query {shape_str(query)}, key {shape_str(keys)}"
        )
    batch = check_broadcastable(
        ["query batch axes", "key batch axes"], [np.shape(query)[:-2], np.shape(keys)[:-2]]
    )
    return batch + (np.shape(query)[-2], np.shape(keys)[-2])


def scale_or_default(scale: float | None, width: int) -> float:
    """``1/√K`` unless given."""
    return 1.0 / math.sqrt(width) if scale is None else scale


def is_static(scale) -> bool:
    """Whether ``scale`` is None or a Python/NumPy number (not a traced or array value)."""
    return scale is None or isinstance(scale, int | float | np.number)


def dot_product_scores(
    query: Float[Array, "... T K"], keys: Float[Array, "... S K"], *, scale: float | None = None
) -> Float[Array, "... T S"]:
    r"""Scaled dot-product energies ``e_ij = scale · q_i · k_j`` in float32.

    .. math:: e_{ij} = \frac{q_i^\top k_j}{\sqrt{K}}

    Vaswani et al. 2017, "Attention Is All You Need", eq. 1. With ``scale=1.0`` this is Luong et al. 2015's
    unscaled ``dot`` score. The products are accumulated in float32 (``preferred_element_type``), so bf16/fp16
    inputs are multiplied exactly and never overflow.

    Args:
      query: ``[..., T, K]``.
      keys: ``[..., S, K]``; leading axes broadcast against ``query``'s.
      scale: multiplier of the dot products; ``None`` means ``1/√K``.

    Returns:
      float32 energies ``[..., T, S]``.

    >>> dot_product_scores(jnp.ones((2, 4)), jnp.ones((3, 4)))  # 4 / sqrt(4)
    Array([[2., 2., 2.],
           [2., 2., 2.]], dtype=float32)
    """
    _check_qk(query, keys)
    dtype = jnp.result_type(query, keys)
    logits = jnp.einsum(
        "...tk,...sk->...ts",
        jnp.asarray(query, dtype),
        jnp.asarray(keys, dtype),
        preferred_element_type=jnp.float32,
    )
    return logits.astype(jnp.float32) * jnp.float32(scale_or_default(scale, np.shape(query)[-1]))


def plain_attention(
    query,
    key,
    value,
    mask,
    bias,
    logits_shape,
    *,
    scale,
    causal,
    window,
    return_weights,
    normalizer,
    grouped,
):
    """The ``"xla"`` path on checked operands whose unread rows are already zero.

    ``grouped`` says the operands come from :func:`attn_jax.attention._gqa.group_operands`: keys and values
    broadcast over each group's query heads, and the hand-written derivative contracts that size-1 axis
    without copying, as autodiff does.
    """
    if bias is not None:
        # a -inf bias entry forbids its pair like a masked entry (a row of them gets zeros, as "chunked" gives)
        mask = allowed_pairs(mask, bias)
    if causal:
        causal_mask = make_causal_mask(logits_shape[-2], logits_shape[-1])
        mask = causal_mask if mask is None else jnp.logical_and(mask, causal_mask)
    if window is not None:
        window_mask = sliding_window_mask(logits_shape[-2], logits_shape[-1], window)
        mask = window_mask if mask is None else jnp.logical_and(mask, window_mask)
    batch = np.shape(query)[:-2]
    same_batch = np.shape(key)[:-2] == batch == np.shape(value)[:-2]
    same_batch = same_batch or (grouped and batch == tuple(logits_shape[:-2]))
    if normalizer != "softmax":
        # sparsemax / 1.5-entmax: the weights by sorting with their closed-form VJP (reverse mode only)
        logits = dot_product_scores(query, key, scale=scale)
        if bias is not None:
            logits = logits + jnp.asarray(bias, jnp.float32)
        logits = jnp.broadcast_to(logits, logits_shape)
        context, weights = attend_normalized(logits, value, mask, normalizer=normalizer)
        return (context, weights) if return_weights else context
    if not return_weights and is_static(scale) and same_batch:
        # the same forward as below with FlashAttention's derivative: one or two fewer [T, S] temporaries
        return _plain_attention(scale, query, key, value, mask, None if bias is None else jnp.asarray(bias))
    logits = dot_product_scores(query, key, scale=scale)
    if bias is not None:
        logits = logits + jnp.asarray(bias, jnp.float32)
    # A value (or mask) with more batch axes than query/key widens the weights; a no-op otherwise.
    logits = jnp.broadcast_to(logits, logits_shape)
    context, weights = attend(logits, value, mask)
    return (context, weights) if return_weights else context


def _plain_forward(scale, query, key, value, mask, bias):
    """The plain path's float32 ``(weights, context)``: the operations of :func:`plain_attention`."""
    logits = dot_product_scores(query, key, scale=scale)
    if bias is not None:
        logits = logits + jnp.asarray(bias, jnp.float32)
    weights = masked_softmax(logits, mask)
    # weighted_context without its final cast: the float32 context is the derivative's residual O
    context = jnp.einsum("...ts,...sd->...td", weights, value.astype(jnp.float32))
    return weights, context


@functools.partial(jax.custom_jvp, nondiff_argnums=(0,))
def _plain_attention(scale, query, key, value, mask, bias):
    """The plain path's context (``query``, ``key``, ``value`` share batch axes) with a hand-written derivative."""
    return _plain_forward(scale, query, key, value, mask, bias)[1].astype(value.dtype)


def _plain_attention_jvp(scale, primals, tangents):
    """``dO = (P∘dS) V − rowsum(P∘dS)·O + P dV`` with ``dS = scale·(dQ Kᵀ + Q dKᵀ) + dB``, in float32.

    The softmax's derivative is ``dP = P∘dS − P·rowsum(P∘dS)``; multiplying it by ``V`` turns the second term
    into ``rowsum(P∘dS)·O``. JAX transposes this rule into FlashAttention's backward (Dao et al. 2022, App. B.2):
    the cotangent of ``rowsum(P∘dS)`` is ``−rowsum(dO∘O)``, a ``[T, Kv]`` product, instead of autodiff's
    ``rowsum(P∘dP)`` over ``[T, S]``, so ``dS = P∘(dP − rowsum(dO∘O))`` takes one ``[T, S]`` pass.
    Masked entries have ``P = 0`` exactly, so they (and fully masked rows) get zero, finite derivatives.
    """
    query, key, value, mask, bias = primals
    d_query, d_key, d_value, _, d_bias = (
        None if isinstance(t, SymbolicZero) else t for t in tangents
    )  # the mask is boolean: no tangent
    weights, context = _plain_forward(scale, query, key, value, mask, bias)
    f32 = jnp.float32
    d_logits = None  # [..., T, S]
    if d_query is not None or d_key is not None:
        dtype = jnp.result_type(query, key)  # dot_product_scores' input dtype
        q, k = (jnp.asarray(x, dtype).astype(f32) for x in (query, key))
        parts = []
        if d_query is not None:
            parts.append(jnp.einsum("...tk,...sk->...ts", jnp.asarray(d_query, dtype).astype(f32), k))
        if d_key is not None:
            parts.append(jnp.einsum("...tk,...sk->...ts", q, jnp.asarray(d_key, dtype).astype(f32)))
        d_logits = functools.reduce(jnp.add, parts) * f32(scale_or_default(scale, np.shape(query)[-1]))
    if d_bias is not None:
        d_bias = d_bias.astype(f32)
        d_logits = d_bias if d_logits is None else d_logits + d_bias
    d_context = None
    if d_logits is not None:
        p_ds = weights * d_logits  # [..., T, S]
        rows = jnp.sum(p_ds, axis=-1, keepdims=True)  # [..., T, 1]
        d_context = jnp.einsum("...ts,...sd->...td", p_ds, value.astype(f32)) - rows * context
    if d_value is not None:
        from_value = jnp.einsum("...ts,...sd->...td", weights, d_value.astype(f32))
        d_context = from_value if d_context is None else d_context + from_value
    out = context.astype(value.dtype)
    return out, d_context.astype(out.dtype)


_plain_attention.defjvp(_plain_attention_jvp, symbolic_zeros=True)
