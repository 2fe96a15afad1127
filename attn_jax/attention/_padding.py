"""Padding that cannot leak: zero the query, key and value rows that the mask never lets attention read.

A key that every query is masked from (padding, an uninitialised buffer, the gap in a packed batch) gets
weight exactly 0, but ``0 · NaN`` and ``0 · inf`` are NaN: a NaN or ±inf stored there still reaches the context
through ``Σ_j α_ij v_j``, and every gradient through the backward pass's products (``dQ = dS K`` multiplies a
masked logit's zero cotangent by the key). Masking the *products* with ``jnp.where`` does not save the backward
pass, whose transpose of the product still multiplies by the NaN. So the inputs are cleaned before any
arithmetic touches them: ``jnp.where(live, x, 0)`` on every query, key or value row whose position the mask
never reads. The transpose of ``where`` is a select, so such a row's gradient is exactly 0 (as it is
mathematically: the output does not depend on it), and the function is unchanged for every input.

Which rows are dead is read from the mask, and from a bias (an entry of ``-inf`` forbids its pair like a
masked entry): a key is dead when no query may attend it in any batch element that shares the key's row (a key
broadcast over heads is live if any head reads it); a query is dead when it may attend no key. A key masked
for only *some* queries (causal attention) is live and kept: its content is real data.

Cost: one ``any`` over the mask (a pass over ``[..., T, S]`` booleans at most; a running ``any`` along one
axis for a broadcast mask under ``causal``) and one select over the ``[..., T, K]``/``[..., S, K]`` inputs,
against the ``O(T·S·K)`` products of attention. In a decoder scan of :func:`additive_attention_step` the
loop-invariant keys are zeroed at every step. The timings are in ``experiments/benchmarks/README.md``.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from attn_jax.attention._checks import check_broadcastable, check_mask, check_min_rank, shape_str
from attn_jax.typing import Array, Bool, Float


def allowed_pairs(mask, bias) -> Bool[Array, "... T S"] | None:
    """``mask ∧ (bias ≠ −inf)`` (broadcast, not widened to the logits), or None when neither is given."""
    allowed = None if mask is None else jnp.asarray(mask)
    if bias is not None:
        finite_below = jnp.asarray(bias) != -jnp.inf  # NaN != -inf: a NaN bias stays visible, never hidden
        allowed = finite_below if allowed is None else jnp.logical_and(allowed, finite_below)
    return allowed


def _partner_any(allowed, axis: int, causal: tuple[int, int] | None) -> Bool[Array, "... L"]:
    """``allowed [..., T|1, S|1]`` reduced over the partner axis; with ``causal = (T, S)`` only over ``j <= i``.

    The causal cases never form a ``[T, S]`` array unless ``allowed`` already is one: a broadcast axis turns
    the reduction into a running ``any`` (a cumulative max) along the other axis.
    """
    if causal is None:
        return jnp.any(allowed, axis=-2 if axis == -1 else -1)
    t, s = causal
    rows, cols = allowed.shape[-2:]
    if rows > 1 and cols > 1:  # a full [T, S] mask: reduce it with the causal pattern
        past = jnp.arange(t)[:, None] >= jnp.arange(s)[None, :]
        return jnp.any(jnp.logical_and(allowed, past), axis=-2 if axis == -1 else -1)
    if axis == -1:  # key j is read iff some query i >= j may attend it
        if rows == 1:
            return jnp.logical_and(allowed[..., 0, :], jnp.arange(s) < t)  # [..., S]
        later = lax.cummax(allowed[..., :, 0].astype(jnp.int32), axis=allowed.ndim - 2, reverse=True) > 0
        if s <= t:
            return later[..., :s]
        return jnp.concatenate([later, jnp.zeros(later.shape[:-1] + (s - t,), bool)], axis=-1)
    # query i reads something iff it may attend some key j <= i
    if cols == 1:
        return allowed[..., :, 0]  # key 0 <= i for every query
    earlier = lax.cummax(allowed[..., 0, :].astype(jnp.int32), axis=allowed.ndim - 2) > 0  # [..., S]
    return earlier[..., np.minimum(np.arange(t), s - 1)]  # [..., T]


def _range_any(x, starts, stops) -> Bool[Array, "... N"]:
    """``any(x[..., a:b])`` for each static ``(a, b)`` of ``starts``/``stops``, by a prefix count (no ``[N, L]``)."""
    counts = jnp.cumsum(x.astype(jnp.int32), axis=-1)
    counts = jnp.concatenate(
        [jnp.zeros(counts.shape[:-1] + (1,), jnp.int32), counts], axis=-1
    )  # [..., L + 1]
    return counts[..., stops] - counts[..., starts] > 0


def _band_partner_any(allowed, axis: int, band: tuple[int, int, int, int]) -> Bool[Array, "... L"]:
    """:func:`_partner_any` over the pairs ``i - left <= j <= i + right`` only, ``band = (T, S, left, right)``.

    Like the causal case, a broadcast axis never widens to ``[T, S]``: a window count along the other axis.
    """
    t, s, left, right = band
    rows, cols = allowed.shape[-2:]
    if rows > 1 and cols > 1:  # a full [T, S] mask: reduce it with the band
        i, j = np.arange(t)[:, None], np.arange(s)[None, :]
        inside = (j >= i - left) & (j <= i + right)
        return jnp.any(jnp.logical_and(allowed, inside), axis=-2 if axis == -1 else -1)
    if axis == -1:  # key j is read iff some query i in [j - right, j + left] ∩ [0, T) may attend it
        if rows == 1:
            return jnp.logical_and(allowed[..., 0, :], jnp.arange(s) < t + right)  # [..., S]
        j = np.arange(s)
        starts = np.clip(j - right, 0, t)
        return _range_any(allowed[..., :, 0], starts, np.maximum(starts, np.clip(j + left + 1, 0, t)))
    # query i reads something iff it may attend some key j in [i - left, i + right] ∩ [0, S)
    if cols == 1:
        return jnp.logical_and(allowed[..., :, 0], jnp.arange(t) < s + left)  # [..., T]
    i = np.arange(t)
    starts = np.clip(i - left, 0, s)
    return _range_any(allowed[..., 0, :], starts, np.maximum(starts, np.clip(i + right + 1, 0, s)))


def live_rows(
    allowed: Bool[Array, "... T S"],
    x_shape: tuple[int, ...],
    axis: int,
    causal: tuple[int, int] | None = None,
    band: tuple[int, int, int, int] | None = None,
) -> Bool[Array, "... L"]:
    """Whether each row of ``x [..., L, F]`` is read: ``axis=-1`` for keys (``L = S``), ``-2`` for queries.

    Reduces ``allowed`` over the partner axis (only over ``j <= i`` when ``causal = (T, S)``, top-left aligned)
    and over the batch axes along which ``x`` is broadcast, so the result ``[..., L]`` (axes of size 1 where
    ``allowed`` broadcasts) selects rows of ``x`` without widening it. ``band = (T, S, left, right)`` reduces
    over ``i - left <= j <= i + right`` only instead (a sliding window, causal folded in as ``right = 0``).
    """
    batch = tuple(x_shape[:-2])
    nd = max(allowed.ndim, len(batch) + 2)
    a = jnp.reshape(allowed, (1,) * (nd - allowed.ndim) + tuple(allowed.shape))
    # [1.., *batch-like, L or 1]
    live = _band_partner_any(a, axis, band) if band is not None else _partner_any(a, axis, causal)
    x_batch = (1,) * (nd - 2 - len(batch)) + batch
    axes = tuple(i for i in range(nd - 2) if x_batch[i] == 1 and live.shape[i] != 1)
    if axes:
        live = jnp.any(live, axis=axes, keepdims=True)
    return jnp.reshape(live, live.shape[nd - 2 - len(batch) :])


def zero_rows(x: Float[Array, "... L F"], live: Bool[Array, "... L"] | None) -> Float[Array, "... L F"]:
    """``x`` with the rows where ``live`` is False replaced by zeros (``x`` itself when ``live`` is None)."""
    if live is None:
        return x
    x = jnp.asarray(x)
    return jnp.where(live[..., None], x, jnp.zeros((), x.dtype))


def zero_dead_inputs(
    query, key, value, mask, bias, logits_shape, *, causal: bool, window: tuple[int, int] | None = None
):
    """``(query, key, value)`` of a dot-product attention with every row the attention never reads zeroed.

    With ``causal`` (top-left aligned) the pairs ``j > i`` are forbidden too, so a key read only by padded
    later queries, or a key ``j >= T``, is zeroed as well; with a sliding ``window = (left, right)`` only the
    pairs ``i - left <= j <= i + right`` are allowed (ANDed with ``causal``).
    """
    allowed = allowed_pairs(mask, bias)
    t, s = logits_shape[-2:]
    if window is not None:
        left, right = window[0], 0 if causal else window[1]
        if allowed is None:
            if t <= s + left and s <= t + right:
                return query, key, value  # every query has a key in its window and every key a query
            allowed = jnp.ones((1, 1), bool)
        band = (t, s, left, right)
        live_q = live_rows(allowed, np.shape(query), -2, band=band)
        live_k = live_rows(allowed, np.shape(key), -1, band=band)
        live_v = live_rows(allowed, np.shape(value), -1, band=band)
        return zero_rows(query, live_q), zero_rows(key, live_k), zero_rows(value, live_v)
    if allowed is None:
        if not causal or s <= t:
            return query, key, value  # every row is read
        allowed = jnp.ones((1, 1), bool)
    pattern = (t, s) if causal else None
    live_q = live_rows(allowed, np.shape(query), -2, pattern)
    live_k = live_rows(allowed, np.shape(key), -1, pattern)
    live_v = live_rows(allowed, np.shape(value), -1, pattern)
    return zero_rows(query, live_q), zero_rows(key, live_k), zero_rows(value, live_v)


def _check_rows(name: str, x, mask, axis: int) -> None:
    """Raise unless ``mask [..., T, S]`` is boolean and pairs with ``x [..., L, F]`` (rows, batch axes)."""
    check_min_rank(name, x, 2)
    check_min_rank("mask", mask, 2)
    batch = check_broadcastable(
        [f"{name} batch axes", "mask batch axes"], [np.shape(x)[:-2], np.shape(mask)[:-2]]
    )
    t, s = np.shape(mask)[-2:]
    pairs = batch + ((t, np.shape(x)[-2]) if axis == -1 else (np.shape(x)[-2], s))
    check_mask(mask, pairs, what=f"pairs [..., T, S] of {name} {shape_str(x)}")


def zero_masked_keys(
    keys: Float[Array, "... S D"], mask: Bool[Array, "... T S"] | None
) -> Float[Array, "... S D"]:
    r"""Zero the key (or value) rows that no query may attend, so their content cannot reach any result.

    .. math:: \tilde k_j = \begin{cases} k_j & \exists i:\, m_{ij} \\ 0 & \text{otherwise} \end{cases}

    The attention functions of this library call this themselves, and its scorers handle non-finite rows
    (:func:`finite_rows`). Call it when you compose a scorer of your own with :func:`luong_attention` or
    :func:`attend`: a masked key gets weight 0, but a NaN or ±inf in it would still make the gradients NaN
    (``0 · NaN``), since the scorer's backward multiplies the key by the masked logit's zero cotangent. The
    function is unchanged and the gradient w.r.t. a zeroed row is exactly 0. A key broadcast over a batch axis
    of the mask (heads) is kept if any element reads it.

    Args:
      keys: ``[..., S, D]`` (keys, values, annotations, projected keys).
      mask: boolean ``[..., T, S]`` (True = may attend), broadcastable against ``keys``' batch axes;
        ``None`` returns ``keys`` unchanged.

    Returns:
      ``keys`` with the rows of never-attended positions set to 0.

    >>> keys = jnp.array([[1.0], [jnp.nan]])
    >>> zero_masked_keys(keys, jnp.array([[True, False]]))[:, 0]
    Array([1., 0.], dtype=float32)
    """
    if mask is None:
        return keys
    _check_rows("keys", keys, mask, -1)
    return zero_rows(keys, live_rows(jnp.asarray(mask), np.shape(keys), -1))


def zero_masked_queries(
    queries: Float[Array, "... T D"], mask: Bool[Array, "... T S"] | None
) -> Float[Array, "... T D"]:
    r"""Zero the query rows that may attend no key (fully masked rows: padded target positions).

    .. math:: \tilde q_i = \begin{cases} q_i & \exists j:\, m_{ij} \\ 0 & \text{otherwise} \end{cases}

    Such a query's context is 0 whatever it holds (the fully-masked-row policy of :func:`masked_softmax`), so
    this changes no result; it keeps a NaN or ±inf there out of the gradients of the keys and of the query's
    projection. See :func:`zero_masked_keys`.

    Args:
      queries: ``[..., T, D]``.
      mask: boolean ``[..., T, S]`` (True = may attend); ``None`` returns ``queries`` unchanged.

    Returns:
      ``queries`` with the rows of fully masked query positions set to 0.

    >>> queries = jnp.array([[1.0], [jnp.inf]])
    >>> zero_masked_queries(queries, jnp.array([[True, True], [False, False]]))[:, 0]
    Array([1., 0.], dtype=float32)
    """
    if mask is None:
        return queries
    _check_rows("queries", queries, mask, -2)
    return zero_rows(queries, live_rows(jnp.asarray(mask), np.shape(queries), -2))


def finite_rows(x: Float[Array, "... L F"]) -> tuple[Float[Array, "... L F"], Bool[Array, "... L"]]:
    """``(x with its rows holding NaN or ±inf zeroed, whether each row is finite)`` for a scorer's input.

    A scorer takes no mask, so it cannot tell padding from data. It computes on the zeroed rows and then marks
    their results NaN with :func:`nan_unless`: a read NaN row still gives a NaN answer, while a masked one
    meets no arithmetic, so its gradient is exactly 0 and ``0 · NaN`` never forms in the backward pass.
    """
    x = jnp.asarray(x)
    finite = jnp.all(jnp.isfinite(x), axis=-1)
    return jnp.where(finite[..., None], x, jnp.zeros((), x.dtype)), finite


def nan_unless(
    scores: Float[Array, "... T S"],
    finite_q: Bool[Array, "... T"] | None,
    finite_k: Bool[Array, "... S"] | None,
) -> Float[Array, "... T S"]:
    """``scores`` with NaN in the pairs whose query or key row was not finite (see :func:`finite_rows`)."""
    ok = None if finite_q is None else finite_q[..., :, None]
    if finite_k is not None:
        ok = finite_k[..., None, :] if ok is None else jnp.logical_and(ok, finite_k[..., None, :])
    return jnp.where(ok, scores, jnp.asarray(jnp.nan, scores.dtype))
