"""Luong's global-attention score functions: dot, general, concat and location.

Luong, Pham & Manning, "Effective Approaches to Attention-based Neural Machine Translation", EMNLP 2015,
section 3.1. Each function returns float32 energies ``[..., T, S]``;
normalisation and the context are shared by every scorer (:func:`luong_attention` is ``attend``), so masks,
fully-masked rows and low-precision inputs behave identically whichever score is used.

``concat`` is the additive scorer: ``v_aᵀ tanh(W_a [h_t; h̄_s])`` splits ``W_a = [W_q; W_k]`` row-wise into
``W_q h_t + W_k h̄_s``, so :func:`concat_scores` takes ``init_additive_params`` params (``use_bias=False`` is
Luong's exact form) and reuses ``additive_scores``.
"""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp

from attn_jax.attention._additive import additive_scores, project_keys
from attn_jax.attention._checks import (
    check_broadcastable,
    check_mask,
    check_min_rank,
    positive_int,
    shape_str,
)
from attn_jax.attention._normalizers import attend_normalized, check_normalizer
from attn_jax.attention._padding import finite_rows, nan_unless
from attn_jax.typing import Array, Bool, Float, PRNGKeyArray

__all__ = [
    "concat_scores",
    "dot_scores",
    "general_scores",
    "init_general_params",
    "init_location_params",
    "location_scores",
    "luong_attention",
]


def _check_pair(query, keys, dq: int | None = None, dk: int | None = None) -> None:
    """Validate ``query [..., T, Dq]`` and ``keys [..., S, Dk]`` (widths and batch axes)."""
    check_min_rank("query", query, 2)
    check_min_rank("keys", keys, 2)
    if dq is not None and jnp.shape(query)[-1] != dq:
        raise ValueError(
            f"query has {jnp.shape(query)[-1]} features (shape {shape_str(query)}) but Dq = {dq}"
        )
    if dk is not None and jnp.shape(keys)[-1] != dk:
        raise ValueError(f"keys have {jnp.shape(keys)[-1]} features (shape {shape_str(keys)}) but Dk = {dk}")
    check_broadcastable(
        ["query batch axes", "keys batch axes"], [jnp.shape(query)[:-2], jnp.shape(keys)[:-2]]
    )


def dot_scores(query: Float[Array, "... T D"], keys: Float[Array, "... S D"]) -> Float[Array, "... T S"]:
    r"""Luong's ``dot`` score, unscaled: ``score(h_t, h̄_s) = h_tᵀ h̄_s``.

    .. math:: e_{ts} = h_t^\top \bar h_s

    Luong et al. 2015, section 3.1 (no ``1/√D``: that is the Transformer's scaled dot product).

    Args:
      query: decoder states ``[..., T, D]``.
      keys: encoder states ``[..., S, D]``.

    Returns:
      float32 energies ``[..., T, S]``.

    >>> dot_scores(jnp.ones((2, 3)), jnp.ones((4, 3)))
    Array([[3., 3., 3., 3.],
           [3., 3., 3., 3.]], dtype=float32)
    """
    check_min_rank("query", query, 2)
    check_min_rank("keys", keys, 2)
    if jnp.shape(query)[-1] != jnp.shape(keys)[-1]:
        raise ValueError(
            f"dot score needs equal widths: query {shape_str(query)} vs keys {shape_str(keys)} (last axis)"
        )
    _check_pair(query, keys)
    # No mask here: NaN/±inf rows (padding) give NaN energies and meet no arithmetic (see finite_rows)
    query, finite_q = finite_rows(query)
    keys, finite_k = finite_rows(keys)
    scores = jnp.einsum("...td,...sd->...ts", query, keys, preferred_element_type=jnp.float32)
    return nan_unless(scores.astype(jnp.float32), finite_q, finite_k)


def init_general_params(
    key: PRNGKeyArray, query_features: int, key_features: int, dtype=jnp.float32
) -> dict[str, Array]:
    """Initialise ``W`` of Luong's ``general`` score: ``{"w": [Dq, Dk]}``, ``w ~ N(0, 1/Dk)``.

    ``W h̄_s`` maps a key into query space, so the fan-in is ``Dk``.

    >>> init_general_params(jax.random.key(0), 4, 6)["w"].shape
    (4, 6)
    """
    dq = positive_int("query_features", query_features)
    dk = positive_int("key_features", key_features)
    return {"w": (jax.random.normal(key, (dq, dk), jnp.float32) / math.sqrt(dk)).astype(dtype)}


def general_scores(
    params: dict[str, Array], query: Float[Array, "... T Dq"], keys: Float[Array, "... S Dk"]
) -> Float[Array, "... T S"]:
    r"""Luong's ``general`` score: ``score(h_t, h̄_s) = h_tᵀ W_a h̄_s``.

    .. math:: e_{ts} = h_t^\top W_a \bar h_s

    Luong et al. 2015, section 3.1.

    Args:
      params: ``{"w": [Dq, Dk]}`` from :func:`init_general_params`.
      query: decoder states ``[..., T, Dq]``.
      keys: encoder states ``[..., S, Dk]``.

    Returns:
      float32 energies ``[..., T, S]``.

    >>> p = {"w": jnp.eye(3, 2)}
    >>> general_scores(p, jnp.ones((1, 3)), jnp.ones((4, 2)))
    Array([[2., 2., 2., 2.]], dtype=float32)
    """
    w = params["w"]
    if jnp.ndim(w) != 2:
        raise ValueError(f"general params w must be [Dq, Dk], got shape {shape_str(w)}")
    _check_pair(query, keys, *jnp.shape(w))
    # No mask here: NaN/±inf rows (padding) give NaN energies and meet no arithmetic (see finite_rows)
    query, finite_q = finite_rows(query)
    keys, finite_k = finite_rows(keys)
    wk = jnp.einsum("...se,de->...sd", keys, w, preferred_element_type=jnp.float32)  # W_a h̄_s: [..., S, Dq]
    scores = jnp.einsum(
        "...td,...sd->...ts", query, wk.astype(jnp.float32), preferred_element_type=jnp.float32
    )
    return nan_unless(scores, finite_q, finite_k)


def concat_scores(
    params: dict[str, Array], query: Float[Array, "... T Dq"], keys: Float[Array, "... S Dk"]
) -> Float[Array, "... T S"]:
    r"""Luong's ``concat`` score ``v_aᵀ tanh(W_a [h_t; h̄_s])`` — the additive (Bahdanau) scorer.

    .. math:: v_a^\top \tanh\!\Big(W_a \begin{bmatrix} h_t \\ \bar h_s \end{bmatrix}\Big)
        = v_a^\top \tanh(W_q h_t + W_k \bar h_s)

    Luong et al. 2015, section 3.1. Splitting ``W_a`` by columns of the concatenation gives exactly
    :func:`additive_scores` (Bahdanau et al. 2015), so this is
    ``additive_scores(params, query, project_keys(params, keys))``. Use ``init_additive_params(...,
    use_bias=False)`` for Luong's bias-free form; a bias or weight-norm gain in ``params`` is honoured. In a
    decoder loop, call :func:`project_keys` once and :func:`additive_scores` per step instead.

    Args:
      params: from ``init_additive_params`` (``w_q [Dq, A]``, ``w_k [Dk, A]``, ``v [A]``).
      query: decoder states ``[..., T, Dq]``.
      keys: encoder states ``[..., S, Dk]``.

    Returns:
      float32 energies ``[..., T, S]``.

    >>> from attn_jax.attention._additive import init_additive_params
    >>> p = init_additive_params(jax.random.key(0), 3, 2, 5, use_bias=False)
    >>> concat_scores(p, jnp.ones((4, 3)), jnp.ones((6, 2))).shape
    (4, 6)
    """
    return additive_scores(params, query, project_keys(params, keys))


def init_location_params(
    key: PRNGKeyArray, query_features: int, max_source_length: int, dtype=jnp.float32
) -> dict[str, Array]:
    """Initialise Luong's ``location`` score ``a_t = softmax(W_a h_t)``: ``{"w": [Dq, Smax]}``, N(0, 1/Dq).

    >>> init_location_params(jax.random.key(0), 4, 50)["w"].shape
    (4, 50)
    """
    dq = positive_int("query_features", query_features)
    smax = positive_int("max_source_length", max_source_length)
    return {"w": (jax.random.normal(key, (dq, smax), jnp.float32) / math.sqrt(dq)).astype(dtype)}


def location_scores(
    params: dict[str, Array], query: Float[Array, "... T Dq"], source_length: int
) -> Float[Array, "... T S"]:
    r"""Luong's ``location`` score: energies from the target state alone, ``(W_a h_t)[:S]``.

    .. math:: e_{ts} = (W_a h_t)_s, \qquad s < S \le S_{max}

    Luong et al. 2015, section 3.1 (``a_t = softmax(W_a h_t)``). Only the first ``source_length`` rows of the
    ``Smax`` outputs are used; the softmax is applied later with the padding mask, like any other score, so a
    padded batch uses the padded length here and the mask for each sentence's true length.

    Args:
      params: ``{"w": [Dq, Smax]}`` from :func:`init_location_params`.
      query: decoder states ``[..., T, Dq]``.
      source_length: ``S``, a static Python int with ``1 <= S <= Smax``.

    Returns:
      float32 energies ``[..., T, S]``.

    >>> p = init_location_params(jax.random.key(0), 4, 10)
    >>> location_scores(p, jnp.ones((3, 4)), 7).shape
    (3, 7)
    """
    w = params["w"]
    if jnp.ndim(w) != 2:
        raise ValueError(f"location params w must be [Dq, Smax], got shape {shape_str(w)}")
    dq, smax = jnp.shape(w)
    try:
        s = operator.index(source_length)
    except TypeError:
        raise ValueError(f"source_length must be a static int, got {source_length!r}") from None
    if not 1 <= s <= smax:
        raise ValueError(
            f"source_length {s} is outside [1, Smax = {smax}] of the location params w {shape_str(w)}"
        )
    check_min_rank("query", query, 2)
    if jnp.shape(query)[-1] != dq:
        raise ValueError(
            f"query has {jnp.shape(query)[-1]} features (shape {shape_str(query)}) but w {shape_str(w)} "
            f"expects Dq = {dq}"
        )
    query, finite_q = finite_rows(query)  # a NaN/±inf row (padding) gives NaN energies and a zero gradient
    scores = jnp.einsum("...td,ds->...ts", query, w[:, :s], preferred_element_type=jnp.float32)
    return nan_unless(scores.astype(jnp.float32), finite_q, None)


def luong_attention(
    scores: Float[Array, "... T S"],
    values: Float[Array, "... S Dv"],
    mask: Bool[Array, "... T S"] | None = None,
    *,
    return_weights: bool = False,
    normalizer: str = "softmax",
) -> Float[Array, "... T Dv"] | tuple[Float[Array, "... T Dv"], Float[Array, "... T S"]]:
    r"""Global attention from any score: masked softmax over the source axis, then ``c_t = Σ_s a_t(s) h̄_s``.

    .. math:: a_t(s) = \frac{\exp e_{ts}}{\sum_{s'} \exp e_{ts'}}, \qquad c_t = \sum_s a_t(s)\, \bar h_s

    Luong et al. 2015, section 3.1. The same normalisation as every other scorer (``attend``): masked
    keys get exactly 0, fully masked rows give zero weights and context. Value rows that the mask never reads
    (padding) are zeroed first, so NaN or ±inf there changes nothing. The scorers take no mask: a query or
    key row holding NaN or ±inf gets NaN energies, which a masked pair never reads, and a zero gradient.

    Args:
      scores: energies ``[..., T, S]`` from :func:`dot_scores`, :func:`general_scores`, :func:`concat_scores`
        or :func:`location_scores`.
      values: source states ``[..., S, Dv]``.
      mask: boolean, broadcastable to ``[..., T, S]``; True = may attend.
      return_weights: also return the float32 weights.
      normalizer: ``"softmax"`` (Luong's), ``"sparsemax"`` (Martins & Astudillo 2016) or ``"entmax15"``
        (Peters et al. 2019), with the same mask policy; see :func:`attn_jax.masked_normalize`.

    Returns:
      context ``[..., T, Dv]`` in ``values``' dtype, or ``(context, weights [..., T, S])``.

    >>> ctx = luong_attention(jnp.zeros((2, 3)), jnp.arange(6.0).reshape(3, 2))
    >>> ctx
    Array([[2., 3.],
           [2., 3.]], dtype=float32)
    """
    check_normalizer(normalizer)
    check_min_rank("scores", scores, 2)
    check_min_rank("values", values, 2)
    if jnp.shape(scores)[-1] != jnp.shape(values)[-2]:
        raise ValueError(
            f"scores {shape_str(scores)} [..., T, S] and values {shape_str(values)} [..., S, Dv] "
            "disagree on S"
        )
    check_broadcastable(
        ["scores batch axes", "values batch axes"], [jnp.shape(scores)[:-2], jnp.shape(values)[:-2]]
    )
    check_mask(mask, tuple(jnp.shape(scores)))
    # zeroes the value rows no query reads
    context, weights = attend_normalized(scores, values, mask, normalizer=normalizer)
    return (context, weights) if return_weights else context
