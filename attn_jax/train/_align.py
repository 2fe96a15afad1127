r"""Guided alignment: a cross-entropy pulling the attention toward given word alignments.

Chen et al. (2016), *Guided Alignment Training for Topic-Aware Neural Machine Translation*; Garg et al. (2019),
*Jointly Learning to Align and Translate with Transformer Models*. With attention weights ``α[b, j, i]`` (target
step ``j`` attends source position ``i``), gold links ``G[b, j, i]`` (restricted to real source and target
positions) and the supervised rows ``R = {(b, j): Σ_i G[b, j, i] > 0}``:

.. math::
    p_{bji} = \frac{G_{bji}}{\sum_{i'} G_{bji'}}, \qquad
    \mathcal{L}_{\mathrm{align}} = \frac{1}{|R|} \sum_{(b, j) \in R} -\sum_i p_{bji} \log \alpha_{bji}

Each target word's gold links become a distribution (a word aligned to two source words wants half the mass on
each); target words without links (``</s>``, unaligned words) and padding are left out of both the sum and the
count. **Normalisation**: the mean over *supervised target words* ``|R|``. fairseq's alignment criterion and
OpenNMT-py's ``lambda_align`` sum the same per-word terms and divide by the batch's normalisation of the
translation loss (its target tokens), and Garg et al. write the mean over the target length: those count
unsupervised words in the denominator, so the weight of the term shrinks as alignments get sparser. Dividing by
``|R|`` keeps ``λ`` meaning "cross-entropy per aligned word" on any corpus. On the built-in corpus every target
word but ``</s>`` is aligned, so the two differ by the factor ``|R| / tokens`` (about 0.97).

``log α`` is taken of ``max(α, tiny)`` (float32's smallest normal number): every weight a softmax produces in
float32's normal range is exact, and a gold link given an exact zero (sparsemax, 1.5-entmax or an underflow)
costs a finite ``-log tiny ≈ 87.3`` with no gradient instead of an infinite loss.

The trainer adds ``lambda_align · L_align`` to the token-level translation loss (config key ``lambda_align``;
at 0 the term is not in the program at all). It supervises the attention weights the model returns: for
RNNsearch its (only) attention; for the Transformer the head average of the *last* decoder layer's
cross-attention, the weights this project's AER, gold-hit diagnostics and heatmaps measure. fairseq
(``--alignment-layer 4`` of 6, ``--alignment-heads 1``) and Garg et al. supervise one head of the penultimate
layer, and OpenNMT-py (``alignment_layer``, ``alignment_heads``) the penultimate layer's head average, leaving the
last layer free for translation.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from attn_jax.typing import Array, Bool, Float

__all__ = ["AlignmentSums", "alignment_loss", "alignment_loss_sums"]


class AlignmentSums(NamedTuple):
    """Sums over the supervised target words of a batch (float32 scalars; add two to pool batches).

    Attributes:
      loss: ``Σ_{(b, j) ∈ R} -Σ_i p_bji log α_bji`` (nats).
      rows: ``|R|``, the number of real target words with at least one gold link.
    """

    loss: Float[Array, ""]
    rows: Float[Array, ""]


def alignment_loss_sums(
    weights: Float[Array, "B T S"],
    gold: Bool[Array, "B T S"],
    src_mask: Bool[Array, "B S"],
    tgt_mask: Bool[Array, "B T"],
) -> AlignmentSums:
    r"""Sum and count behind the guided-alignment loss of one batch (definition in the module docstring).

    .. math:: \sum_{(b, j) \in R} -\sum_i \frac{G_{bji}}{\sum_{i'} G_{bji'}} \log \max(\alpha_{bji}, \text{tiny})

    Cells outside the gold links, padding and unsupervised rows contribute exact zeros to the value and the
    gradient, whatever their weights (NaN included).

    Args:
      weights: ``[B, T, S]`` attention weights (any float dtype; computed in float32).
      gold: ``[B, T, S]`` bool, ``gold[b, j, i]``: target word ``j`` aligned to source word ``i``
        (:attr:`attn_jax.data.Batch.gold`).
      src_mask: ``[B, S]`` bool, True at real source positions.
      tgt_mask: ``[B, T]`` bool, True at real target positions.

    Returns:
      :class:`AlignmentSums` of float32 scalars.

    >>> w = jnp.array([[[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]]])
    >>> g = jnp.array([[[True, True, False], [False, False, False]]])
    >>> s = alignment_loss_sums(w, g, jnp.ones((1, 3), bool), jnp.ones((1, 2), bool))
    >>> round(float(s.loss), 4) == round(-0.5 * (float(jnp.log(0.5)) + float(jnp.log(0.25))), 4), float(s.rows)
    (True, 1.0)
    """
    w_shape = tuple(jnp.shape(weights))
    if (
        len(w_shape) != 3
        or tuple(jnp.shape(gold)) != w_shape
        or tuple(jnp.shape(src_mask)) != w_shape[::2]
        or tuple(jnp.shape(tgt_mask)) != w_shape[:2]
    ):
        raise ValueError(
            f"weights {list(w_shape)} must be [B, T, S] with gold [B, T, S] {list(jnp.shape(gold))}, "
            f"src_mask [B, S] {list(jnp.shape(src_mask))} and tgt_mask [B, T] {list(jnp.shape(tgt_mask))}"
        )
    g = (
        jnp.asarray(gold, bool)
        & jnp.asarray(src_mask, bool)[:, None, :]
        & jnp.asarray(tgt_mask, bool)[:, :, None]
    )
    links = jnp.sum(g, axis=-1, dtype=jnp.float32)  # [B, T]
    p = g / jnp.maximum(links, 1.0)[..., None]  # [B, T, S], each supervised row sums to 1
    # The inner where keeps a NaN or zero weight outside the links out of the log, so its gradient is an exact 0.
    w = jnp.where(g, jnp.asarray(weights, jnp.float32), 1.0)
    log_w = jnp.log(jnp.maximum(w, jnp.finfo(jnp.float32).tiny))
    loss = -jnp.sum(jnp.where(g, p * log_w, 0.0))
    return AlignmentSums(loss=loss, rows=jnp.sum(links > 0, dtype=jnp.float32))


def alignment_loss(
    weights: Float[Array, "B T S"],
    gold: Bool[Array, "B T S"],
    src_mask: Bool[Array, "B S"],
    tgt_mask: Bool[Array, "B T"],
) -> Float[Array, ""]:
    r"""The guided-alignment loss: mean over supervised target words of the cross-entropy between each word's
    normalised gold links and its attention weights (0 when no word is supervised).

    .. math:: \mathcal{L}_{\mathrm{align}} = \frac{1}{|R|} \sum_{(b, j) \in R} -\sum_i p_{bji} \log \alpha_{bji}

    Args and shapes as :func:`alignment_loss_sums`. Returns a float32 scalar.

    >>> w = jnp.full((1, 2, 4), 0.25)
    >>> g = jnp.zeros((1, 2, 4), bool).at[0, 0, 1].set(True)
    >>> round(float(alignment_loss(w, g, jnp.ones((1, 4), bool), jnp.ones((1, 2), bool))), 4)
    1.3863
    """
    s = alignment_loss_sums(weights, gold, src_mask, tgt_mask)
    return s.loss / jnp.maximum(s.rows, 1.0)
