"""Luong's local attention: attend only to a window ``[p_t - D, p_t + D]`` around an aligned position ``p_t``.

Luong, Pham & Manning, "Effective Approaches to Attention-based Neural Machine Translation", EMNLP 2015,
section 3.2. Two ways to choose ``p_t``:

* local-m (monotonic): ``p_t = t`` (:func:`monotonic_centers`), plain softmax inside the window;
* local-p (predictive): ``p_t = (S_len - 1) · sigmoid(v_pᵀ tanh(W_p h_t))`` (:func:`predictive_centers`; see
  "Centre range" below), and the in-window weights are multiplied by a Gaussian ``exp(-(s - p_t)² / 2σ²)``,
  ``σ = D/2``.

Conventions chosen here (the paper leaves them open for a 0-indexed, padded batch):

* **Window.** Source positions ``s`` with ``|s - round(p_t)| <= D`` are attended, where
  ``round(p) = floor(p + 0.5)``: always exactly ``2D + 1`` positions (the ``W`` axis of ``attn_jax.typing``)
  before clipping to the sentence, symmetric around the real-valued ``p_t``, and the same set a gathered
  ``[..., T, W]`` implementation would read (OpenNMT-lua's ``CenteredWindow`` centres on ``floor(p_t)``
  instead). The window membership is piecewise constant in ``p_t`` and carries no gradient; ``p_t`` learns
  only through the Gaussian, as in the paper.
* **Centre range.** Positions are 0-indexed, so the predictor uses the sentence's *true* length ``S_len``
  (not the padded length) as ``p_t = (S_len - 1) · sigmoid(...) ∈ [0, S_len - 1]``: the paper's
  ``S · sigmoid`` with 1-indexed positions ``1..S`` maps to the same interval shifted by one, and this keeps
  ``round(p_t)`` on a valid, unpadded position.
* **Normalisation.** The softmax runs over the window ∩ mask; the Gaussian is applied *after* it, exactly as
  in the paper, so local-p weights do **not** sum to 1 (the centre keeps its softmax weight, the window edge
  keeps ``exp(-2)`` of it). A row whose window holds no valid key gets zero weights and a zero context.

Cost: scores and weights are dense ``[..., T, S]`` and the window is a mask, ``O(T·S)`` like global attention;
gathering the ``2D + 1`` window keys per query (``O(T·D)``) is a later optimisation.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from attn_jax.attention._checks import (
    check_broadcastable,
    check_mask,
    check_min_rank,
    positive_int,
    shape_str,
)
from attn_jax.attention._normalizers import check_normalizer, masked_normalize
from attn_jax.attention._padding import finite_rows, live_rows, zero_rows
from attn_jax.attention._softmax import weighted_context
from attn_jax.typing import Array, Bool, Float, Int, PRNGKeyArray

__all__ = [
    "init_local_p_params",
    "local_attention",
    "local_window_mask",
    "monotonic_centers",
    "predictive_centers",
]


def _lengths(source_lengths) -> Array:
    """``source_lengths`` as an integer array, or a ValueError."""
    lengths = jnp.asarray(source_lengths)
    if not jnp.issubdtype(lengths.dtype, jnp.integer):
        raise ValueError(f"source_lengths must be integers, got dtype {lengths.dtype}")
    return lengths


def monotonic_centers(
    query_length: int, source_lengths: Int[Array, "..."] | None = None
) -> Float[Array, "... T"]:
    r"""Local-m aligned positions ``p_t = t``, clipped to the last valid source position if lengths are given.

    .. math:: p_t = \min(t, S_{len} - 1), \qquad t = 0, \dots, T - 1

    Luong et al. 2015, section 3.2 (monotonic alignment, "local-m"). Without clipping, a target longer than
    its source would put late windows entirely on padding (zero context); clipping keeps the last ``D + 1``
    source words in view.

    Args:
      query_length: ``T``, a static int.
      source_lengths: optional true source lengths ``[...]`` (integers).

    Returns:
      float32 centres ``[T]``, or ``[..., T]`` with ``source_lengths``' leading axes.

    >>> monotonic_centers(5, jnp.array([3, 7]))
    Array([[0., 1., 2., 2., 2.],
           [0., 1., 2., 3., 4.]], dtype=float32)
    """
    if isinstance(query_length, bool) or not isinstance(query_length, int) or query_length < 0:
        raise ValueError(f"query_length must be a non-negative int, got {query_length!r}")
    t = jnp.arange(query_length, dtype=jnp.float32)
    if source_lengths is None:
        return t
    last = jnp.maximum(_lengths(source_lengths) - 1, 0).astype(jnp.float32)
    return jnp.minimum(t, last[..., None])


def init_local_p_params(
    key: PRNGKeyArray, query_features: int, hidden: int, dtype=jnp.float32
) -> dict[str, Array]:
    """Initialise the local-p position predictor: ``{"w_p": [Dq, A], "v_p": [A]}``, ``N(0, 1/fan_in)``.

    >>> {k: v.shape for k, v in init_local_p_params(jax.random.key(0), 4, 3).items()}
    {'w_p': (4, 3), 'v_p': (3,)}
    """
    dq = positive_int("query_features", query_features)
    a = positive_int("hidden", hidden)
    k_w, k_v = jax.random.split(key)
    return {
        "w_p": (jax.random.normal(k_w, (dq, a), jnp.float32) / math.sqrt(dq)).astype(dtype),
        "v_p": (jax.random.normal(k_v, (a,), jnp.float32) / math.sqrt(a)).astype(dtype),
    }


def predictive_centers(
    params: dict[str, Array], query: Float[Array, "... T Dq"], source_lengths: Int[Array, "..."] | int
) -> Float[Array, "... T"]:
    r"""Local-p aligned positions predicted from the decoder state, in ``[0, S_len - 1]``.

    .. math:: p_t = (S_{len} - 1) \cdot \operatorname{sigmoid}\big(v_p^\top \tanh(W_p h_t)\big)

    Luong et al. 2015, section 3.2 (predictive alignment, "local-p"; the paper writes ``S · sigmoid(...)`` for
    1-indexed positions ``1..S``). ``S_len`` is each sentence's *true* length, so a padded batch never centres
    a window on padding; see the module docstring for the ``- 1``.

    Args:
      params: ``{"w_p": [Dq, A], "v_p": [A]}`` from :func:`init_local_p_params`.
      query: decoder states ``[..., T, Dq]``.
      source_lengths: true source lengths, an int or an integer array broadcastable to ``query``'s leading
        axes ``[...]``.

    Returns:
      float32 centres ``[..., T]``, differentiable w.r.t. ``params`` and ``query``.

    >>> p = {"w_p": jnp.zeros((4, 3)), "v_p": jnp.zeros(3)}
    >>> predictive_centers(p, jnp.ones((2, 4)), 9)  # sigmoid(0) = 1/2: the middle of positions 0..8
    Array([4., 4.], dtype=float32)
    """
    w_p, v_p = params["w_p"], params["v_p"]
    if jnp.ndim(w_p) != 2 or jnp.ndim(v_p) != 1 or jnp.shape(w_p)[1] != jnp.shape(v_p)[0]:
        raise ValueError(
            f"local-p params must be w_p [Dq, A], v_p [A]; got {shape_str(w_p)}, {shape_str(v_p)}"
        )
    check_min_rank("query", query, 2)
    if jnp.shape(query)[-1] != jnp.shape(w_p)[0]:
        raise ValueError(
            f"query has {jnp.shape(query)[-1]} features (shape {shape_str(query)}) but w_p {shape_str(w_p)} "
            f"expects Dq = {jnp.shape(w_p)[0]}"
        )
    lengths = _lengths(source_lengths)
    check_broadcastable(["source_lengths", "query batch axes"], [jnp.shape(lengths), jnp.shape(query)[:-2]])
    query, finite = finite_rows(query)  # a NaN/±inf row (padding) gives a NaN centre and a zero gradient
    hidden = jnp.tanh(jnp.einsum("...td,da->...ta", query, w_p, preferred_element_type=jnp.float32))
    z = jnp.einsum("...ta,a->...t", hidden.astype(jnp.float32), jnp.asarray(v_p, jnp.float32))
    span = jnp.maximum(lengths - 1, 0).astype(jnp.float32)[..., None]
    return jnp.where(finite, span * jax.nn.sigmoid(z), jnp.nan)


def _check_window(window) -> int:
    """Return ``window`` (the half-width ``D``) or raise unless it is a non-negative int."""
    if isinstance(window, bool) or not isinstance(window, int):
        raise ValueError(f"window (the half-width D) must be a static int, got {window!r}")
    if window < 0:
        raise ValueError(f"window (the half-width D) must be >= 0, got {window}")
    return window


def local_window_mask(
    centers: Float[Array, "... T"], source_length: int, *, window: int
) -> Bool[Array, "... T S"]:
    """Boolean ``[..., T, S]``: True where ``|s - round(p_t)| <= window`` (``round(p) = floor(p + 0.5)``).

    >>> local_window_mask(jnp.array([0.0, 2.6]), 5, window=1).astype(int)
    Array([[1, 1, 0, 0, 0],
           [0, 0, 1, 1, 1]], dtype=int32)
    """
    d = _check_window(window)
    if isinstance(source_length, bool) or not isinstance(source_length, int) or source_length < 0:
        raise ValueError(f"source_length must be a non-negative int, got {source_length!r}")
    centre = jnp.floor(jnp.asarray(centers, jnp.float32) + 0.5)[..., None]
    return jnp.abs(jnp.arange(source_length, dtype=jnp.float32) - centre) <= d


def local_attention(
    scores: Float[Array, "... T S"],
    values: Float[Array, "... S Dv"],
    centers: Float[Array, "... T"],
    *,
    window: int,
    mask: Bool[Array, "... T S"] | None = None,
    gaussian: bool,
    return_weights: bool = False,
    normalizer: str = "softmax",
) -> Float[Array, "... T Dv"] | tuple[Float[Array, "... T Dv"], Float[Array, "... T S"]]:
    r"""Luong's local attention: softmax in a ``2D + 1`` window around ``p_t``, optionally Gaussian-weighted.

    .. math:: a_t(s) = \operatorname{softmax}_{s \in \mathcal{W}_t}(e_{ts})
        \cdot \Big[\exp\Big(-\frac{(s - p_t)^2}{2\sigma^2}\Big)\Big]_{\text{gaussian}}, \quad
        \mathcal{W}_t = \{s : |s - \operatorname{round}(p_t)| \le D\}, \quad \sigma = \frac{D}{2}

    Luong, Pham & Manning 2015, section 3.2. local-m is ``gaussian=False`` with :func:`monotonic_centers`;
    local-p is ``gaussian=True`` with :func:`predictive_centers`. The Gaussian multiplies the *normalised*
    weights, so with ``gaussian=True`` rows do not sum to 1, and gradients reach ``p_t`` only through it.
    Value rows outside every window or masked for every query (padding) are zeroed first, so NaN or ±inf
    there changes nothing (keys: see :func:`luong_attention`).

    Args:
      scores: energies ``[..., T, S]`` from any Luong/additive scorer.
      values: source states ``[..., S, Dv]``.
      centers: aligned positions ``p_t``, ``[..., T]`` broadcastable to ``scores``' leading axes.
      window: the half-width ``D`` (a static int ``>= 0``; ``>= 1`` when ``gaussian``, since ``σ = D/2``).
      mask: boolean, broadcastable to ``[..., T, S]``; True = may attend. Intersected with the window.
      gaussian: multiply by ``exp(-(s - p_t)² / (2σ²))`` after the softmax (local-p).
      return_weights: also return the float32 weights.
      normalizer: what normalises inside the window ∩ mask: ``"softmax"`` (Luong's), ``"sparsemax"``
        (Martins & Astudillo 2016) or ``"entmax15"`` (Peters et al. 2019); the Gaussian multiplies its
        result alike. See :func:`attn_jax.masked_normalize`.

    Returns:
      context ``[..., T, Dv]`` in ``values``' dtype, or ``(context, weights [..., T, S])``.

    >>> scores = jnp.zeros((1, 5))
    >>> _, w = local_attention(scores, jnp.ones((5, 2)), jnp.array([2.0]), window=1, gaussian=False,
    ...                        return_weights=True)
    >>> w.round(3)
    Array([[0.   , 0.333, 0.333, 0.333, 0.   ]], dtype=float32)
    """
    d = _check_window(window)
    check_normalizer(normalizer)
    if gaussian and d == 0:
        raise ValueError("gaussian=True needs window >= 1 (σ = window / 2 would be 0)")
    check_min_rank("scores", scores, 2)
    check_min_rank("values", values, 2)
    scores_shape = tuple(jnp.shape(scores))
    if scores_shape[-1] != jnp.shape(values)[-2]:
        raise ValueError(
            f"scores {shape_str(scores)} [..., T, S] and values {shape_str(values)} [..., S, Dv] "
            "disagree on S"
        )
    check_broadcastable(
        ["scores batch axes", "values batch axes"], [scores_shape[:-2], jnp.shape(values)[:-2]]
    )
    check_min_rank("centers", centers, 1)
    try:
        ok = tuple(jnp.broadcast_shapes(jnp.shape(centers), scores_shape[:-1])) == scores_shape[:-1]
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(
            f"centers {shape_str(centers)} must broadcast to the scores' [..., T] = "
            f"{shape_str(scores_shape[:-1])}"
        )
    check_mask(mask, scores_shape)

    in_window = local_window_mask(centers, scores_shape[-1], window=d)  # [..., T, S]
    attended = in_window if mask is None else in_window & mask
    weights = masked_normalize(scores, attended, normalizer=normalizer)
    # values outside every window and mask may hold anything (padding): 0 · NaN would reach the context
    values = zero_rows(values, live_rows(attended, jnp.shape(values), -1))
    if gaussian:
        sigma = d / 2
        centers = jnp.asarray(centers, jnp.float32)
        if mask is not None:
            # A query the mask lets attend nothing (padding) has zero weights: 0 · exp(NaN) would still be NaN
            centers = jnp.where(jnp.any(jnp.asarray(mask), axis=-1), centers, 0.0)
        offset = jnp.arange(scores_shape[-1], dtype=jnp.float32) - centers[..., None]
        weights = weights * jnp.exp(-jnp.square(offset) / (2 * sigma**2))
    context = weighted_context(weights, values)
    return (context, weights) if return_weights else context
