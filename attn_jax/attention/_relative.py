"""Relative position representations (Shaw, Uszkoreit & Vaswani 2018, "Self-Attention with Relative Position
Representations"): learned key and value vectors for the clipped distance between a query and a key.

With ``k`` the clipping distance and ``a^K, a^V ∈ R^{(2k+1)×K}`` learned tables (shared by the heads of one
attention, one pair per layer), query ``i`` and key ``j`` use row ``clip(j - i, -k, k) + k``::

    e_ij = q_i (k_j + a^K_ij)ᵀ / √K          (Shaw et al., Eq. 4)
    z_i  = Σ_j α_ij (v_j + a^V_ij)            (Eq. 3), α = softmax_j(e_ij) under the mask

The key term is an additive logit bias ``q_i·a^K_ij/√K``, so the scores, the mask policy and grouped-query heads
are exactly :func:`~attn_jax.attention.dot_product_attention`'s; the value term adds ``Σ_j α_ij a^V_ij`` to its
context. Distances are integers, so a cached decoding step (one query at position ``t`` over the cache) reads the
very rows teacher forcing reads for ``t``. OpenNMT-py's ``max_relative_positions`` is this ``k``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from attn_jax.attention._checks import check_min_rank, position_offsets, positive_int, shape_str
from attn_jax.attention._dot_product import dot_product_attention
from attn_jax.typing import Array, Bool, Float, Int, PRNGKeyArray


def _check_distance(max_distance) -> None:
    positive_int("max_distance", max_distance)


def relative_position_index(
    query_positions: Int[Array, "... T"], key_positions: Int[Array, "... S"], max_distance: int
) -> Int[Array, "... T S"]:
    r"""Rows of the relative tables: ``clip(j - i, -k, k) + k`` for query position ``i``, key position ``j``.

    .. math:: \mathrm{idx}_{ij} = \min(\max(j - i, -k), k) + k \in [0, 2k]

    Shaw et al. 2018, Eq. (5)-(6): distances beyond ``k`` share the edge rows (the clipping).

    Args:
      query_positions: integer ``[..., T]``.
      key_positions: integer ``[..., S]``; leading axes broadcast with the query's.
      max_distance: ``k``, a positive int.

    Returns:
      int32 ``[..., T, S]``.

    >>> relative_position_index(jnp.arange(3), jnp.arange(4), 1)
    Array([[1, 2, 2, 2],
           [0, 1, 2, 2],
           [0, 0, 1, 2]], dtype=int32)
    """
    _check_distance(max_distance)
    offsets = position_offsets(query_positions, key_positions)  # [..., T, S]
    return (jnp.clip(offsets, -max_distance, max_distance) + max_distance).astype(jnp.int32)


def init_relative_embeddings(
    key: PRNGKeyArray, max_distance: int, features: int, *, dtype=jnp.float32
) -> Float[Array, "R K"]:
    r"""A relative-position table ``a ∈ R^{(2k+1)×K}``, initialised ``N(0, 1/K)``.

    .. math:: a_{r,c} \sim \mathcal{N}(0, 1/K)

    Shaw et al. 2018 do not state an initialiser; ``1/K`` gives ``q·a^K/√K`` the scale of one key's
    contribution to a logit at initialisation and the ``a`` rows unit norm.

    Args:
      key: PRNG key.
      max_distance: ``k``; the table has ``2k + 1`` rows.
      features: ``K``, the head width.
      dtype: parameter dtype.

    Returns:
      ``[2k + 1, K]``.

    >>> init_relative_embeddings(jax.random.key(0), 4, 8).shape
    (9, 8)
    """
    _check_distance(max_distance)
    positive_int("features", features)
    return (jax.random.normal(key, (2 * max_distance + 1, features), jnp.float32) / np.sqrt(features)).astype(
        dtype
    )


def relative_attention(
    query: Float[Array, "... H T K"],
    key: Float[Array, "... G S K"],
    value: Float[Array, "... G S K"],
    mask: Bool[Array, "..."] | None,
    relative_keys: Float[Array, "R K"],
    relative_values: Float[Array, "R K"],
    index: Int[Array, "... T S"],
    *,
    num_kv_heads: int | None = None,
) -> tuple[Float[Array, "... H T K"], Float[Array, "... H T S"]]:
    r"""Scaled dot-product attention with Shaw et al.'s relative key and value representations.

    .. math:: e_{ij} = \frac{q_i (k_j + a^K_{\mathrm{idx}_{ij}})^\top}{\sqrt{K}}, \qquad
        z_i = \sum_j \alpha_{ij} \big(v_j + a^V_{\mathrm{idx}_{ij}}\big)

    Shaw, Uszkoreit & Vaswani 2018, Eq. (3)-(4). The softmax, masks (masked pairs weigh exactly 0; a fully
    masked row gets zero weights, so its relative value term is 0 too) and grouped-query heads are
    :func:`~attn_jax.attention.dot_product_attention`'s plain path; the key term enters it as the bias
    ``q_i·a^K_ij/√K`` (float32). The tables are shared by every head.

    Args:
      query: ``[..., H, T, K]``.
      key, value: ``[..., G, S, K]`` (``G = H``, or ``num_kv_heads`` dividing ``H``).
      mask: boolean, broadcastable to ``[..., H, T, S]``, or None.
      relative_keys, relative_values: ``[2k + 1, K]`` tables (:func:`init_relative_embeddings`).
      index: int ``[..., T, S]`` (no head axis) from :func:`relative_position_index`; its leading axes
        broadcast with the query's batch axes.
      num_kv_heads: ``G`` for grouped-query attention, None when ``G = H``.

    Returns:
      ``(context [..., H, T, K] in the value dtype, weights [..., H, T, S] float32)``.

    >>> q = k = v = jnp.ones((1, 2, 3, 4))
    >>> table = jnp.zeros((3, 4))
    >>> idx = relative_position_index(jnp.arange(3), jnp.arange(3), 1)
    >>> relative_attention(q, k, v, None, table, table, idx)[0].shape
    (1, 2, 3, 4)
    """
    check_min_rank("query", query, 3)
    for name, table in (("relative_keys", relative_keys), ("relative_values", relative_values)):
        if np.ndim(table) != 2 or np.shape(table)[0] % 2 != 1 or np.shape(table)[1] != np.shape(query)[-1]:
            raise ValueError(
                f"{name} must be [2k + 1, K] with K = {np.shape(query)[-1]} (the query's width), got shape "
                f"{shape_str(table)}"
            )
    check_min_rank("index", index, 2)
    if tuple(np.shape(index)[-2:]) != (np.shape(query)[-2], np.shape(key)[-2]):
        raise ValueError(
            f"index has shape {shape_str(index)}, expected [..., T, S] = [..., {np.shape(query)[-2]}, "
            f"{np.shape(key)[-2]}] (query and key lengths)"
        )
    dtype = query.dtype
    # [..., T, S, K] per-pair rows; heads share them, so the head axis is added by the einsums below
    rel_k = jnp.take(relative_keys, index, axis=0).astype(dtype)
    rel_v = jnp.take(relative_values, index, axis=0).astype(jnp.float32)
    bias = jnp.einsum("...htk,...tsk->...hts", query, rel_k, preferred_element_type=jnp.float32)
    bias = bias * jnp.float32(1.0 / np.sqrt(np.shape(query)[-1]))
    context, weights = dot_product_attention(
        query, key, value, mask, bias=bias, return_weights=True, num_kv_heads=num_kv_heads
    )
    extra = jnp.einsum("...hts,...tsk->...htk", weights, rel_v)
    return (context.astype(jnp.float32) + extra).astype(value.dtype), weights
