"""Scaled dot-product attention (Vaswani et al. 2017) over any leading batch axes; heads are a batch axis.

Layout is ``[..., T, K]`` for queries and ``[..., S, K]`` for keys — with heads, ``[B, H, T, K]``. (``jax.nn``
and Flax use ``[B, T, H, K]``; transpose when comparing.) Numerics follow ``_softmax.py``: logits in float32,
masked softmax over the source axis, context accumulated in float32 and returned in the value's dtype.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import (
    check_broadcastable,
    check_floating,
    check_mask,
    check_min_rank,
    shape_str,
)
from attn_jax.attention._softmax import attend
from attn_jax.typing import Array, Bool, Float


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


def _scale(scale: float | None, width: int) -> float:
    """``1/√K`` unless given."""
    return 1.0 / math.sqrt(width) if scale is None else scale


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
    return logits.astype(jnp.float32) * jnp.float32(_scale(scale, np.shape(query)[-1]))


def dot_product_attention(
    query: Float[Array, "... T K"],
    key: Float[Array, "... S K"],
    value: Float[Array, "... S Kv"],
    mask: Bool[Array, "... T S"] | None = None,
    *,
    bias: Float[Array, "... T S"] | None = None,
    scale: float | None = None,
    return_weights: bool = False,
) -> Float[Array, "... T Kv"] | tuple[Float[Array, "... T Kv"], Float[Array, "... T S"]]:
    r"""Scaled dot-product attention ``softmax(QKᵀ/√K + bias) V`` with a boolean mask.

    .. math:: \mathrm{Attention}(Q, K, V) = \mathrm{softmax}\!\Big(\frac{Q K^\top}{\sqrt{K}} + b\Big) V

    Vaswani et al. 2017, "Attention Is All You Need", §3.2.1. The softmax runs over the source (key) axis
    through :func:`attend`: masked keys get weight exactly 0, and a query whose keys are *all* masked gets
    zero weights and a zero context with finite gradients. (``jax.nn.dot_product_attention`` and
    ``flax.nnx.dot_product_attention`` instead return the uniform average of *all* values for such a row.)
    Heads are a leading batch axis: ``[B, H, T, K]``.

    Args:
      query: ``[..., T, K]``.
      key: ``[..., S, K]``.
      value: ``[..., S, Kv]``; the context takes its dtype.
      mask: boolean, True = may attend, broadcastable to ``[..., T, S]``; ``None`` attends everywhere.
      bias: additive float bias broadcastable to ``[..., T, S]`` (relative positions, ALiBi), added to the
        scaled logits in float32 before masking.
      scale: logit multiplier; ``None`` means ``1/√K``.
      return_weights: also return the float32 weights.

    Returns:
      the context ``[..., T, Kv]`` in ``value``'s dtype, or ``(context, weights [..., T, S] float32)`` when
      ``return_weights``.

    Raises:
      ValueError: mismatched widths or lengths, non-broadcasting batch axes, a mask or bias that does not
        broadcast to the logits, or a non-boolean mask; the message names the shapes.

    >>> q = jnp.array([[1.0, 0.0]]); k = jnp.array([[1.0, 0.0], [0.0, 1.0]]); v = jnp.array([[1.0], [3.0]])
    >>> dot_product_attention(q, k, v, jnp.array([[True, False]]))
    Array([[1.]], dtype=float32)
    """
    logits_shape = _check_qk(query, key)
    check_min_rank("value", value, 2)
    check_floating("value", value)
    if np.shape(key)[-2] != np.shape(value)[-2]:
        raise ValueError(
            "key and value must have the same length S (axis -2): "
            f"key {shape_str(key)}, value {shape_str(value)}"
        )
    batch = check_broadcastable(
        ["query batch axes", "key batch axes", "value batch axes"],
        [np.shape(query)[:-2], np.shape(key)[:-2], np.shape(value)[:-2]],
    )
    logits_shape = batch + logits_shape[-2:]
    check_mask(mask, logits_shape)
    if bias is not None:
        check_floating("bias", bias)
        try:
            widened = tuple(np.broadcast_shapes(np.shape(bias), logits_shape))
        except ValueError:
            widened = None
        if widened != logits_shape:
            raise ValueError(
                f"bias of shape {shape_str(np.shape(bias))} does not broadcast to the attention logits "
                f"[..., T, S] of shape {shape_str(logits_shape)}"
            )

    # The one XLA path. Issue 7 adds `implementation=` ("xla" | "chunked" | "cudnn") and dispatches here;
    # every other implementation must match this one, which stays the reference.
    logits = dot_product_scores(query, key, scale=scale)
    if bias is not None:
        logits = logits + jnp.asarray(bias, jnp.float32)
    # A value (or mask) with more batch axes than query/key widens the weights; a no-op otherwise.
    logits = jnp.broadcast_to(logits, logits_shape)
    context, weights = attend(logits, value, mask)
    return (context, weights) if return_weights else context
