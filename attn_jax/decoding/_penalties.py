"""GNMT's length normalisation and coverage penalty (Wu et al. 2016, eq. 14), the scores beam search ranks by."""

from __future__ import annotations

import jax.numpy as jnp

from attn_jax.typing import Array, ArrayLike, Bool, Float

__all__ = ["coverage_penalty", "length_penalty", "normalized_score"]

# log(min(Σ_j α_ij, 1)) is -inf for a source word that never received any weight (local-p's window puts exact
# zeros outside it, and float32 softmax underflows); clipping the coverage at the smallest normal float32 keeps
# the penalty finite (log ≈ -87.3 per such word) so the ranking stays a total order.
_MIN_COVERAGE = float(jnp.finfo(jnp.float32).tiny)


def length_penalty(lengths: ArrayLike, alpha: ArrayLike) -> Float[Array, "..."]:
    """GNMT's length normalisation ``lp(Y) = ((5 + |Y|) / 6)^α`` (float32).

    Wu et al. (2016), "Google's Neural Machine Translation System", eq. 14. ``|Y|`` counts every token of
    the hypothesis including its ``</s>``; ``α = 0`` gives ``lp = 1`` (raw log-probabilities).

    Args:
      lengths: ``[...]`` hypothesis lengths ``|Y|`` (integers or floats).
      alpha: ``α ≥ 0`` (GNMT found 0.6–0.7 best), a scalar or broadcastable to ``lengths``.

    Returns:
      ``[...]`` float32 ``lp(Y)``.

    >>> float(length_penalty(7, 1.0))
    2.0
    """
    lengths = jnp.asarray(lengths, jnp.float32)
    return ((5.0 + lengths) / 6.0) ** jnp.asarray(alpha, jnp.float32)


def coverage_penalty(
    coverage: Float[Array, "... S"], src_mask: Bool[Array, "... S"], beta: ArrayLike
) -> Float[Array, "..."]:
    """GNMT's coverage penalty ``cp(X; Y) = β · Σ_i log(min(Σ_j α_ij, 1))`` over the real source words ``i``.

    Wu et al. (2016), eq. 14: ``α_ij`` is the attention of target word ``j`` on source word ``i``, so
    ``coverage[..., i] = Σ_j α_ij`` is how much attention word ``i`` received over the whole hypothesis.
    Padding (``src_mask`` False) contributes nothing; coverage is clipped below at the smallest normal float32
    so a never-attended word costs ``β · log(1.18e-38) ≈ -87.3 β`` instead of ``-∞``. Always ``≤ 0``.

    Args:
      coverage: ``[..., S]`` attention summed over target positions.
      src_mask: ``[..., S]`` boolean, True at real source tokens (broadcastable to ``coverage``).
      beta: ``β ≥ 0`` (GNMT: 0.2), a scalar or broadcastable to the leading axes.

    Returns:
      ``[...]`` float32 ``cp``.

    >>> round(float(coverage_penalty(jnp.array([0.5, 2.0, 0.0]), jnp.array([True, True, False]), 1.0)), 4)
    -0.6931
    """
    coverage = jnp.clip(jnp.asarray(coverage, jnp.float32), _MIN_COVERAGE, 1.0)
    per_word = jnp.where(src_mask, jnp.log(coverage), 0.0)
    return jnp.asarray(beta, jnp.float32) * jnp.sum(per_word, axis=-1)


def normalized_score(
    log_probs: Float[Array, "..."],
    lengths: ArrayLike,
    coverage: Float[Array, "... S"] | None,
    src_mask: Bool[Array, "... S"] | None,
    alpha: ArrayLike,
    beta: ArrayLike,
) -> Float[Array, "..."]:
    """The ranking score ``s(Y, X) = log P(Y|X) / lp(Y) + cp(X; Y)`` of Wu et al. (2016), eq. 14 (float32).

    ``coverage``/``src_mask`` may be ``None`` (a model without attention): then ``cp = 0``.

    >>> float(normalized_score(jnp.float32(-4.0), 7, None, None, 1.0, 0.0))
    -2.0
    """
    score = jnp.asarray(log_probs, jnp.float32) / length_penalty(lengths, alpha)
    if coverage is not None:
        score = score + coverage_penalty(coverage, src_mask, beta)
    return score
