"""The coverage loss of See, Liu & Manning (2017): attending again to what was already attended to costs.

See et al., "Get To The Point: Summarization with Pointer-Generator Networks", ACL 2017, eq. 12-13 (the coverage
vector of Tu et al. 2016, "Modeling Coverage for Neural Machine Translation"); OpenNMT-py's ``coverage_attn`` with
``lambda_coverage``. The trainer adds ``λ · Σ`` of it to the token-level loss sum (``lambda_coverage``), so, like
the cross-entropy, it is divided by the number of real target tokens.
"""

from __future__ import annotations

import jax.numpy as jnp

from attn_jax.typing import Array, Bool, Float

__all__ = ["coverage_loss"]


def coverage_loss(weights: Float[Array, "... T S"], tgt_mask: Bool[Array, "... T"]) -> Float[Array, "..."]:
    r"""Per-sentence coverage loss ``Σ_t m_t Σ_j min(α_tj, c_tj)`` with ``c_t = Σ_{t'<t} α_t'``.

    .. math:: \mathrm{covloss} = \sum_t m_t \sum_j \min(\alpha_{tj}, c_{tj}), \qquad
        c_{tj} = \sum_{t' < t} \alpha_{t'j}

    See, Liu & Manning 2017, eq. 12-13: bounded by the attention mass of each step (at most 1 per target word),
    zero while every step attends to source words not attended to before. ``c`` is formed here from the
    teacher-forced weights (``c_1 = 0``), the same sum a coverage decoder carries in its state. Padded target
    positions (``m_t`` False) contribute exactly 0 (``where``, so NaN there does not leak); padded source
    positions must have weight 0, as every attention of this library gives them.

    Args:
      weights: attention weights ``[..., T, S]`` (float32 from the models).
      tgt_mask: ``[..., T]`` bool, True at real target positions.

    Returns:
      float32 ``[...]``, one sum per sentence.

    >>> w = jnp.array([[[1.0, 0.0], [0.5, 0.5], [1.0, 0.0]]])  # the third step attends word 0 again
    >>> coverage_loss(w, jnp.ones((1, 3), bool)).tolist()
    [1.5]
    """
    weights = jnp.asarray(weights)
    if weights.ndim < 2 or not jnp.issubdtype(weights.dtype, jnp.floating):
        raise ValueError(
            f"coverage_loss needs float weights [..., T, S], got {weights.dtype} {list(weights.shape)}"
        )
    tgt_mask = jnp.asarray(tgt_mask)
    if tgt_mask.dtype != jnp.bool_ or tgt_mask.shape != weights.shape[:-1]:
        raise ValueError(
            f"coverage_loss: tgt_mask must be bool {list(weights.shape[:-1])} (weights {list(weights.shape)}), "
            f"got {tgt_mask.dtype} {list(tgt_mask.shape)}"
        )
    weights = weights.astype(jnp.float32)
    # [..., T, S]: the attention received before each step (exclusive prefix sum; c_1 = 0)
    covered = jnp.cumsum(weights, axis=-2)
    covered = jnp.concatenate([jnp.zeros_like(covered[..., :1, :]), covered[..., :-1, :]], axis=-2)
    per_step = jnp.sum(jnp.minimum(weights, covered), axis=-1)  # [..., T]
    return jnp.sum(jnp.where(tgt_mask, per_step, 0.0), axis=-1)
