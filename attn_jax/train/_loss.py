"""Token-level cross-entropy over the real (non-pad) target tokens, with optional label smoothing.

Everything is computed in float32 from the model's float32 logits. The functions return *sums* and *counts*
(:class:`LossSums`), never means, so that a metric accumulated over many batches of different shapes is exact:
``loss = Σ loss / Σ tokens`` over the whole validation set, not a mean of batch means.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from attn_jax.typing import Array, Bool, Float, Int

__all__ = ["LossSums", "loss_sums", "sentence_losses", "token_cross_entropy"]


class LossSums(NamedTuple):
    """Sums over the real target tokens of a batch (float32 scalars; add two to pool batches).

    Attributes:
      loss: ``Σ`` of the training loss per token (the label-smoothed cross-entropy; equals ``nll`` without
        smoothing).
      nll: ``Σ -log p(y_t | y_<t, x)``, the unsmoothed negative log-likelihood (perplexity is
        ``exp(nll / tokens)``).
      tokens: number of real target tokens (``</s>`` included, padding excluded).
      sentences: number of sentences with at least one real target token (padding rows excluded).
    """

    loss: Float[Array, ""]
    nll: Float[Array, ""]
    tokens: Float[Array, ""]
    sentences: Float[Array, ""]


def token_cross_entropy(
    logits: Float[Array, "... T V"], labels: Int[Array, "... T"], *, label_smoothing: float = 0.0
) -> tuple[Float[Array, "... T"], Float[Array, "... T"]]:
    r"""Per-position ``(loss, nll)``: cross-entropy against label-smoothed targets, and the plain NLL.

    .. math::
        \ell_t = -\sum_v q_{t,v} \log p_{t,v}, \qquad
        q_t = (1 - \varepsilon)\,\mathrm{onehot}(y_t) + \varepsilon / V, \qquad
        \mathrm{nll}_t = -\log p_{t, y_t}

    so ``ℓ = (1 - ε)·nll + ε·mean_v(-log p_v)`` (the smoothing of Szegedy et al. 2016, as ``optax.smooth_labels``:
    the uniform part covers all ``V`` classes, specials included). No masking here; see :func:`loss_sums`.

    Args:
      logits: unnormalised scores ``[..., T, V]`` (any float dtype; computed in float32).
      labels: int token ids ``[..., T]``.
      label_smoothing: ``ε`` in ``[0, 1)``.

    Returns:
      ``(loss, nll)``, float32 ``[..., T]`` each.

    >>> loss, nll = token_cross_entropy(jnp.zeros((1, 4)), jnp.array([2]))
    >>> bool(jnp.allclose(loss, jnp.log(4.0))), bool(jnp.allclose(nll, loss))
    (True, True)
    """
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
    if jnp.shape(logits)[:-1] != jnp.shape(labels):
        raise ValueError(
            f"logits {list(jnp.shape(logits))} must be labels' shape {list(jnp.shape(labels))} plus a vocabulary axis"
        )
    log_p = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)  # [..., T, V]
    nll = -jnp.take_along_axis(log_p, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    if label_smoothing == 0.0:
        return nll, nll
    uniform = -jnp.mean(log_p, axis=-1)
    return (1.0 - label_smoothing) * nll + label_smoothing * uniform, nll


def sentence_losses(
    logits: Float[Array, "B T V"],
    labels: Int[Array, "B T"],
    mask: Bool[Array, "B T"],
    *,
    label_smoothing: float = 0.0,
) -> tuple[Float[Array, " B"], Float[Array, " B"]]:
    r"""Per-sentence sums ``(Σ_t m_t ℓ_t, Σ_t m_t nll_t)`` over the real tokens (``-log p(y | x)`` for the NLL).

    Padding positions contribute exactly 0 whatever their logits (``where``, not a multiplication, so a NaN or
    inf logit at a pad cannot leak into the sum).

    >>> s, _ = sentence_losses(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), int), jnp.array([[1, 1, 0], [1, 0, 0]], bool))
    >>> (s / jnp.log(5.0)).round(4)
    Array([2., 1.], dtype=float32)
    """
    loss, nll = token_cross_entropy(logits, labels, label_smoothing=label_smoothing)
    mask = jnp.asarray(mask, bool)
    return jnp.sum(jnp.where(mask, loss, 0.0), axis=-1), jnp.sum(jnp.where(mask, nll, 0.0), axis=-1)


def loss_sums(
    logits: Float[Array, "B T V"],
    labels: Int[Array, "B T"],
    mask: Bool[Array, "B T"],
    *,
    label_smoothing: float = 0.0,
) -> LossSums:
    r"""Batch totals of the token-level loss over real tokens; the training objective is ``loss / tokens``.

    .. math:: \mathcal{L} = \frac{\sum_{b,t} m_{bt}\, \ell_{bt}}{\sum_{b,t} m_{bt}}

    (token-level averaging: a long sentence weighs more than a short one; per-sentence numbers are
    ``nll / sentences``).

    Args:
      logits: ``[B, T, V]`` unnormalised scores.
      labels: ``[B, T]`` int target ids (``tgt_out``).
      mask: ``[B, T]`` bool, True at real target tokens.
      label_smoothing: ``ε`` in ``[0, 1)``.

    Returns:
      :class:`LossSums` of float32 scalars.

    >>> s = loss_sums(jnp.zeros((2, 3, 5)), jnp.zeros((2, 3), int), jnp.array([[1, 1, 0], [0, 0, 0]], bool))
    >>> float(s.tokens), float(s.sentences), round(float(s.nll / s.tokens), 4) == round(float(jnp.log(5.0)), 4)
    (2.0, 1.0, True)
    """
    loss, nll = sentence_losses(logits, labels, mask, label_smoothing=label_smoothing)
    mask = jnp.asarray(mask, bool)
    return LossSums(
        loss=jnp.sum(loss),
        nll=jnp.sum(nll),
        tokens=jnp.sum(mask, dtype=jnp.float32),
        sentences=jnp.sum(jnp.any(mask, axis=-1), dtype=jnp.float32),
    )
