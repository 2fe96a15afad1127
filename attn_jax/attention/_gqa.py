"""Grouped-query attention for :func:`dot_product_attention`: ``H`` query heads over ``G`` key/value heads.

Ainslie et al. 2023, "GQA"; with ``G = 1`` it is multi-query attention (Shazeer 2019). Axis -3 is the head
axis: ``query`` is ``[..., H, T, K]`` and ``key``/``value`` are ``[..., G, S, K|Kv]`` with ``H % G == 0``.
Query head ``h`` reads key/value head ``h // (H / G)``: consecutive groups of ``H / G`` query heads share
one, as in ``jax.nn``'s GQA. Masks, biases and lengths are shaped for the ``H`` query heads.

The repeated keys and values are never materialised. The queries are viewed as ``[..., G, H/G, T, K]``, and
each key/value head broadcasts over its group through a size-1 axis that the products contract without
copying. The ``"xla"`` and ``"chunked"`` paths run on that view in both passes; ``"cudnn"`` refuses it.
``G = H`` is ordinary multi-head attention, the very same program as no grouping.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import check_broadcastable, check_mask, positive_int, shape_str


def check_kv_heads(query, key, value, num_kv_heads) -> int:
    """Validate ``num_kv_heads`` against the head axes (-3) of the operands; return the group size ``H / G``."""
    positive_int("num_kv_heads", num_kv_heads)
    for name, x in (("query", query), ("key", key), ("value", value)):
        if np.ndim(x) < 3:
            raise ValueError(
                f"num_kv_heads={num_kv_heads} needs a head axis: {name} must be [..., heads, length, width], "
                f"got shape {shape_str(x)}"
            )
    heads = np.shape(query)[-3]
    for name, x in (("key", key), ("value", value)):
        if np.shape(x)[-3] != num_kv_heads:
            raise ValueError(
                f"num_kv_heads={num_kv_heads} but {name} {shape_str(x)} has {np.shape(x)[-3]} heads on axis -3 "
                "(key and value are [..., num_kv_heads, S, K])"
            )
    if heads % num_kv_heads:
        raise ValueError(
            f"num_kv_heads ({num_kv_heads}) must divide the query's heads H ({heads}, axis -3 of query "
            f"{shape_str(query)}): each key/value head serves H / num_kv_heads query heads"
        )
    return heads // num_kv_heads


def grouped_logits_shape(query, key, value, mask, bias) -> tuple[int, ...]:
    """The ``[..., H, T, S]`` logits shape of a grouped call; raise if ``mask``/``bias`` do not broadcast to it."""
    batch = check_broadcastable(
        ["query batch axes", "key batch axes", "value batch axes"],
        [np.shape(query)[:-3], np.shape(key)[:-3], np.shape(value)[:-3]],
    )
    logits_shape = batch + tuple(np.shape(query)[-3:-1]) + (np.shape(key)[-2],)
    check_mask(mask, logits_shape, what="grouped-query attention logits [..., H, T, S]")
    if bias is not None:
        try:
            widened = tuple(np.broadcast_shapes(np.shape(bias), logits_shape))
        except ValueError:
            widened = None
        if widened != logits_shape:
            raise ValueError(
                f"bias of shape {shape_str(np.shape(bias))} does not broadcast to the grouped-query attention "
                f"logits [..., H, T, S] of shape {shape_str(logits_shape)}"
            )
    return logits_shape


def _split_head_axis(x, axis: int, groups: int, repeats: int):
    """Axis ``axis`` (counted from the end) of size ``H`` or 1 becomes ``(G, H/G)`` or ``(1, 1)``; None stays."""
    if x is None or np.ndim(x) < -axis:
        return x  # no head axis: it broadcasts over both new axes
    x = jnp.asarray(x)
    i = x.ndim + axis
    split = (groups, repeats) if x.shape[i] != 1 else (1, 1)
    return jnp.reshape(x, x.shape[:i] + split + x.shape[i + 1 :])


def group_operands(query, key, value, mask, bias, lengths, num_kv_heads, repeats):
    """Queries ``[..., G, H/G, T, K]``, keys/values ``[..., G, 1, S, K]``; masks, biases, lengths split alike."""
    query = jnp.asarray(query)
    query = jnp.reshape(query, query.shape[:-3] + (num_kv_heads, repeats) + query.shape[-2:])
    key, value = (jnp.expand_dims(jnp.asarray(x), -3) for x in (key, value))  # a size-1 axis: no copy
    mask, bias = (_split_head_axis(x, -3, num_kv_heads, repeats) for x in (mask, bias))
    lengths = tuple(_split_head_axis(x, -1, num_kv_heads, repeats) for x in lengths)
    return query, key, value, mask, bias, lengths


def merge_groups(x):
    """``[..., G, H/G, T, X]`` back to the query heads ``[..., H, T, X]``."""
    return jnp.reshape(x, x.shape[:-4] + (x.shape[-4] * x.shape[-3],) + x.shape[-2:])
